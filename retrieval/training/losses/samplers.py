"""Candidate samplers: seeded draws of negative items from a popularity, uniform or log-uniform
distribution."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from retrieval.training.config import SAMPLERS


class SeedStream:
    """Stateless random seeds ``[seed, counter]``, the counter a variable (checkpointed with the run).

    Draws are then a function of the seed and of how many draws came before, so a run resumed
    from a checkpoint draws what the uninterrupted run would have.

    Args:
        seed: base seed; None = drawn from numpy's global generator (seeded by
            ``keras.utils.set_random_seed``).
    """

    def __init__(self, seed: int | None = None) -> None:
        self.seed = int(np.random.randint(0, 2**31 - 1)) if seed is None else int(seed)
        self.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="seed_counter")

    def next(self) -> Any:
        """A fresh stateless seed, int64 ``[2]``."""
        count = self.counter.assign_add(1)
        return tf.stack([tf.constant(self.seed, tf.int64), count])


class CandidateSampler:
    """Samples negative item ids (with replacement) from a fixed distribution over ``1..n``.

    Args:
        probabilities: ``[num_embeddings]`` sampling probabilities; entry 0 (padding) must be 0.
        seed: see :class:`SeedStream`.
    """

    def __init__(self, probabilities: np.ndarray, seed: int | None = None) -> None:
        p = np.asarray(probabilities, np.float64)
        if p[0] != 0 or np.any(p < 0) or not np.isclose(p.sum(), 1.0):
            raise ValueError("sampling probabilities must be >= 0, sum to 1 and be 0 for padding")
        self.probabilities = p
        self.log_q = tf.constant(np.log(np.maximum(p, 1e-30)), tf.float32)  # [V]
        self.cdf = tf.constant(np.cumsum(p), tf.float64)  # [V]
        self.seeds = SeedStream(seed)

    @classmethod
    def from_counts(
        cls, counts: np.ndarray, kind: str = "popularity", alpha: float = 0.75, seed: int | None = None
    ) -> CandidateSampler:
        """A sampler over the items with training ``counts`` (``[num_embeddings]``, entry 0 = padding).

        ``popularity``: q ∝ (count + 1)^alpha (every item can be drawn); ``uniform``: q = 1/n;
        ``log_uniform``: Zipf over the popularity rank r = 0, 1, ... (ties by id),
        ``q(r) = log((r + 2) / (r + 1)) / log(n + 1)``, the distribution of TensorFlow's
        ``log_uniform_candidate_sampler`` without having to renumber items by popularity.
        """
        if kind not in SAMPLERS:
            raise ValueError(f"unknown sampler {kind!r}; choose one of {SAMPLERS}")
        counts = np.asarray(counts, float)
        if kind == "uniform":
            weights = np.ones(len(counts))
        elif kind == "popularity":
            weights = (counts + 1.0) ** alpha
        else:
            order = np.argsort(-counts[1:], kind="stable")  # item index by rank
            rank = np.empty(len(order), np.int64)
            rank[order] = np.arange(len(order))
            weights = np.concatenate([[0.0], np.log((rank + 2.0) / (rank + 1.0))])
        weights[0] = 0.0
        return cls(weights / weights.sum(), seed)

    def sample(self, n: Any) -> Any:
        """``n`` ids int32 ``[n]``, drawn by inverting the CDF (O(n log V))."""
        u = tf.random.stateless_uniform(tf.reshape(n, [1]), self.seeds.next(), dtype=tf.float64)
        ids = tf.searchsorted(self.cdf, u * self.cdf[-1], side="right", out_type=tf.int32)
        return tf.minimum(ids, tf.shape(self.cdf, out_type=tf.int32)[0] - 1)
