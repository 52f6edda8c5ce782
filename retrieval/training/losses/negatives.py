"""Where a task's negatives come from: the whole catalogue, a sampler, or the batch's other targets."""

from __future__ import annotations

import abc
from typing import Any

import numpy as np
import tensorflow as tf

from retrieval.training.losses.samplers import CandidateSampler, SeedStream


class Negatives(abc.ABC):
    """A source of candidate negatives for a batch of ``M`` positives."""

    @abc.abstractmethod
    def draw(self, positive_ids: Any) -> Any:
        """Candidate ids: ``[N]`` shared by the batch, or ``[M, N]`` per positive."""

    @abc.abstractmethod
    def expected_count(self, ids: Any, num_positives: Any) -> Any:
        """How many times one :meth:`draw` is expected to propose each of ``ids`` (any shape),
        for one row: the ``Q`` of the log-Q correction."""

    @property
    def variables(self) -> list[Any]:
        """Random state to checkpoint."""
        return []


class AllItems(Negatives):
    """Every item ``1..num_embeddings-1`` once: with it the softmax is the full softmax.

    Args:
        num_embeddings: number of items + 1 (padding).
    """

    def __init__(self, num_embeddings: int) -> None:
        self.num_embeddings = num_embeddings

    def draw(self, positive_ids: Any) -> Any:
        return tf.range(1, self.num_embeddings, dtype=tf.int32)

    def expected_count(self, ids: Any, num_positives: Any) -> Any:
        return tf.ones(tf.shape(ids), tf.float32)


class SampledNegatives(Negatives):
    """``num`` ids from a :class:`CandidateSampler`, shared by the batch or drawn per positive.

    Args:
        sampler: the proposal distribution.
        num: negatives drawn per batch (shared) or per positive.
        per_positive: draw ``num`` for each positive instead of once for the batch.
    """

    def __init__(self, sampler: CandidateSampler, num: int, per_positive: bool = False) -> None:
        if num < 1:
            raise ValueError(f"num_negatives must be >= 1, got {num}")
        self.sampler, self.num, self.per_positive = sampler, num, per_positive

    def draw(self, positive_ids: Any) -> Any:
        if not self.per_positive:
            return self.sampler.sample(self.num)
        rows = tf.shape(positive_ids)[0]
        return tf.reshape(self.sampler.sample(rows * self.num), [rows, self.num])

    def expected_count(self, ids: Any, num_positives: Any) -> Any:
        return self.num * tf.exp(tf.gather(self.sampler.log_q, ids))

    @property
    def variables(self) -> list[Any]:
        return [self.sampler.seeds.counter]


class InBatchNegatives(Negatives):
    """The batch's positives as everyone's negatives (their own and equal ids are accidental hits).

    Positives are draws from the training targets' distribution ``p``, so a batch proposes item
    j about ``n · p(j)`` times: popular items are over-represented as negatives unless
    corrected (Yi et al., RecSys 2019).

    Args:
        target_probabilities: ``p`` ``[num_embeddings]``, the items' frequency as training targets.
        max_candidates: at most this many positives are used (a uniform random subset when a
            batch has more, e.g. ``[B, L]`` targets); None = all.
        seed: see :class:`SeedStream`.
    """

    def __init__(
        self, target_probabilities: np.ndarray, max_candidates: int | None = None, seed: int | None = None
    ) -> None:
        p = np.asarray(target_probabilities, np.float64)
        if np.any(p < 0) or not np.isclose(p.sum(), 1.0):
            raise ValueError("target probabilities must be >= 0 and sum to 1")
        self.probabilities = tf.constant(p, tf.float32)
        self.max_candidates = max_candidates
        self.seeds = SeedStream(seed)

    def _size(self, num_positives: Any) -> Any:
        if self.max_candidates is None:
            return num_positives
        return tf.minimum(num_positives, self.max_candidates)

    def draw(self, positive_ids: Any) -> Any:
        if self.max_candidates is None:
            return positive_ids
        m = tf.shape(positive_ids)[0]
        order = tf.argsort(tf.random.stateless_uniform([m], self.seeds.next()))
        return tf.gather(positive_ids, order[: self._size(m)])

    def expected_count(self, ids: Any, num_positives: Any) -> Any:
        n = tf.cast(self._size(num_positives), tf.float32)
        return n * tf.gather(self.probabilities, ids)

    @property
    def variables(self) -> list[Any]:
        return [self.seeds.counter]
