"""The task: negatives and a loss on the logits assembled into one Keras-callable object, built by name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from retrieval.training.config import INTEREST_SELECTIONS, LOSSES
from retrieval.training.losses.interests import (
    interest_scores,
    label_aware_attention,
    select_interest,
)
from retrieval.training.losses.logits import GeneralisedBCE, LogitLoss, SoftmaxCrossEntropy, candidate_logits
from retrieval.training.losses.negatives import AllItems, InBatchNegatives, Negatives, SampledNegatives
from retrieval.training.losses.samplers import CandidateSampler


class RetrievalTask:
    """The retrieval loss: interest selection, candidates, corrected logits, loss.

    Args:
        negatives: sources of negatives; several are mixed (their candidates concatenated,
            every logit corrected by the summed expected count of its id).
        loss: the loss on the logits.
        temperature: logits are divided by it.
        remove_accidental_hits: drop candidates equal to the row's target.
        logq_correction: subtract ``log Q`` from the logits (only for losses that expect it).
        interest_selection: how the K interests meet the target: ``"hard"``
            (:func:`select_interest`, ComiRec), ``"label_aware"`` (:func:`label_aware_attention`,
            MIND), or ``"max"``: the positive and every negative scored by its best interest
            (:func:`interest_scores`), as the search ranks items, so that an interest scoring
            wrong items high is corrected too (under ``"hard"`` only the chosen interest meets
            the negatives).
        label_aware_power: MIND's ``p`` for ``"label_aware"``.
    """

    def __init__(
        self,
        negatives: Sequence[Negatives],
        loss: LogitLoss | None = None,
        temperature: float = 1.0,
        remove_accidental_hits: bool = True,
        logq_correction: bool = True,
        interest_selection: str = "hard",
        label_aware_power: float = 1.0,
    ) -> None:
        if not negatives:
            raise ValueError("a retrieval task needs at least one source of negatives")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if interest_selection not in INTEREST_SELECTIONS:
            raise ValueError(
                f"unknown interest selection {interest_selection!r}; choose one of {INTEREST_SELECTIONS}"
            )
        if label_aware_power < 0:
            raise ValueError(f"label_aware_power must be >= 0, got {label_aware_power}")
        self.negatives = list(negatives)
        self.loss = loss or SoftmaxCrossEntropy()
        self.temperature = temperature
        self.remove_accidental_hits = remove_accidental_hits
        self.logq_correction = logq_correction and self.loss.logq_correction
        self.interest_selection = interest_selection
        self.label_aware_power = label_aware_power

    @property
    def variables(self) -> list[Any]:
        """The task's random state (seed counters), to checkpoint with the model."""
        return [v for source in self.negatives for v in source.variables]

    def select(self, interests: Any, target: Any) -> Any:
        """The training query ``[B, d]`` from interests ``[B, K, d]`` and target embeddings ``[B, d]``."""
        if self.interest_selection == "label_aware":
            return label_aware_attention(interests, target, self.label_aware_power)
        if self.interest_selection == "max":  # every candidate scored by its best interest
            return interests
        return select_interest(interests, target)

    def _log_q(self, ids: Any, num_positives: Any) -> Any:
        if not self.logq_correction:
            return tf.zeros(tf.shape(ids), tf.float32)
        count = tf.add_n([s.expected_count(ids, num_positives) for s in self.negatives])
        return tf.math.log(tf.maximum(count, 1e-30))

    def per_example(self, outputs: Any, target_ids: Any, embed: Callable[[Any], Any]) -> tuple[Any, Any]:
        """Loss per real target ``[M]`` and those targets' ids ``[M]`` (arguments as :meth:`__call__`)."""
        target_ids = tf.cast(target_ids, tf.int32)
        if target_ids.shape.rank == 2:
            at = tf.where(target_ids > 0)  # [M, 2] (row, position) of every real target
            query, target_ids = tf.gather_nd(outputs, at), tf.gather_nd(target_ids, at)  # [M, d], [M]
            positive = embed(target_ids)
        else:
            positive = embed(target_ids)  # [B, d]
            query = self.select(outputs, positive)  # [B, d], or [B, K, d] for "max"
        if self._catalogue_softmax:
            return self._catalogue_cross_entropy(query, target_ids, embed), target_ids
        m = tf.shape(target_ids)[0]
        positive_log_q = self._log_q(target_ids, m)  # [M]
        pos_logit, neg_logits, valid = None, [], []
        for source in self.negatives:
            ids = source.draw(target_ids)  # [N] or [M, N]
            pos_logit, neg, ok = candidate_logits(
                query,
                positive,
                target_ids,
                embed(ids),
                ids,
                positive_log_q,
                self._log_q(ids, m),
                self.temperature,
                self.remove_accidental_hits,
            )
            neg_logits.append(neg)
            valid.append(ok)
        loss = self.loss(pos_logit, tf.concat(neg_logits, 1), tf.concat(valid, 1))
        return loss, target_ids

    @property
    def _catalogue_softmax(self) -> bool:
        """Whether the task is the plain full softmax (every item once, accidental hits removed):
        the cross-entropy over the catalogue, computed by one fused op."""
        return (
            len(self.negatives) == 1
            and isinstance(self.negatives[0], AllItems)
            and type(self.loss) is SoftmaxCrossEntropy
            and self.remove_accidental_hits
        )

    def _catalogue_cross_entropy(self, query: Any, target_ids: Any, embed: Callable[[Any], Any]) -> Any:
        """``-log softmax`` of each target over items ``1..V-1``, ``[M]``. The generic path's
        logits minus the positive's column (its accidental hit) plus the positive's own logit
        are exactly these logits, and ``log Q = 0`` for every item; the fused op avoids copying
        the ``[M, V]`` logits three times (docs/benchmarks.md)."""
        source = self.negatives[0]
        assert isinstance(source, AllItems)
        ids = source.draw(target_ids)  # [V - 1]: 1..V-1
        logits = interest_scores(query, embed(ids), per_row=False) / self.temperature  # [M, V - 1]
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=target_ids - 1, logits=logits)

    def __call__(self, outputs: Any, target_ids: Any, embed: Callable[[Any], Any]) -> Any:
        """Mean loss over the batch's targets; ``embed`` maps ids to ``[.., d]``.

        Args:
            outputs: interests ``[B, K, d]`` with targets ``[B]`` (one target per row, an
                interest selected per row), or per-position outputs ``[B, L, d]`` with
                targets ``[B, L]`` (0 = no target at that position; objectives
                ``all_positions`` and ``cloze``).
        """
        return tf.reduce_mean(self.per_example(outputs, target_ids, embed)[0])


class SampledSoftmaxTask(RetrievalTask):
    """Sampled softmax with log-Q correction against ``num_negatives`` shared negatives.

    The other arguments are those of :class:`RetrievalTask`.

    Args:
        sampler: negative sampler over the catalogue.
        num_negatives: negatives drawn per batch (shared by its rows).
    """

    def __init__(
        self,
        sampler: CandidateSampler,
        num_negatives: int,
        temperature: float = 1.0,
        remove_accidental_hits: bool = True,
        interest_selection: str = "hard",
        label_aware_power: float = 1.0,
    ) -> None:
        super().__init__(
            [SampledNegatives(sampler, num_negatives)],
            SoftmaxCrossEntropy(),
            temperature,
            remove_accidental_hits,
            interest_selection=interest_selection,
            label_aware_power=label_aware_power,
        )

    @property
    def sampler(self) -> CandidateSampler:
        return self._sampled.sampler

    @property
    def num_negatives(self) -> int:
        return self._sampled.num

    @property
    def _sampled(self) -> SampledNegatives:
        source = self.negatives[0]
        assert isinstance(source, SampledNegatives)
        return source


def build_task(
    loss: str,
    *,
    sampler: CandidateSampler,
    num_negatives: int,
    target_probabilities: np.ndarray,
    negatives_per_positive: int = 0,
    in_batch_candidates: int | None = None,
    gbce_t: float = 0.75,
    **options: Any,
) -> RetrievalTask:
    """The task named ``loss`` (one of :data:`LOSSES`).

    * ``sampled_softmax``: softmax over sampled negatives, log-Q corrected.
    * ``full_softmax``: softmax over the whole catalogue (memory ``[targets, items]``).
    * ``in_batch``: softmax over the batch's other targets, log-Q corrected by their frequency.
    * ``mixed``: in-batch + sampled negatives in one softmax, corrected by the mixture.
    * ``bce`` / ``gbce``: binary cross-entropy against sampled negatives; gBCE with calibration
      ``gbce_t`` (gSASRec).

    ``options`` are :class:`RetrievalTask`'s (``temperature``, ``remove_accidental_hits``,
    ``logq_correction``, ``interest_selection``...), their defaults its.

    Args:
        sampler: the sampled negatives' distribution (sampled_softmax, mixed, bce, gbce).
        num_negatives: sampled negatives per batch, shared by its targets.
        target_probabilities: ``[num_embeddings]``, the items' frequency as training targets
            (in-batch correction); its length also gives the catalogue size.
        negatives_per_positive: ``k > 0`` draws ``k`` negatives for each target instead of
            ``num_negatives`` shared ones.
        in_batch_candidates: cap on the in-batch candidates (None = every target of the batch).
        gbce_t: gSASRec's ``t`` in ``[0, 1]`` (``gbce`` only).
    """
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; choose one of {LOSSES}")
    if negatives_per_positive < 0:
        raise ValueError(f"negatives_per_positive must be >= 0, got {negatives_per_positive}")
    num_embeddings = len(target_probabilities)
    per_positive = negatives_per_positive > 0
    k = negatives_per_positive if per_positive else num_negatives
    head = _logit_loss(loss, gbce_t, k, num_embeddings)
    negatives = _negatives(loss, sampler, k, per_positive, target_probabilities, in_batch_candidates)
    return RetrievalTask(negatives, head, **options)


def _logit_loss(loss: str, gbce_t: float, k: int, num_embeddings: int) -> LogitLoss:
    """The loss on the logits of the task named ``loss``: (g)BCE against ``k`` negatives, else softmax."""
    if loss == "bce":
        return GeneralisedBCE(1.0)
    if loss == "gbce":
        return GeneralisedBCE(GeneralisedBCE.beta_for(gbce_t, k, num_embeddings - 1))
    return SoftmaxCrossEntropy()


def _negatives(
    loss: str,
    sampler: CandidateSampler,
    k: int,
    per_positive: bool,
    target_probabilities: np.ndarray,
    in_batch_candidates: int | None,
) -> list[Negatives]:
    """The sources of negatives of the task named ``loss`` (arguments as :func:`build_task`'s)."""
    if loss == "full_softmax":
        return [AllItems(len(target_probabilities))]
    if loss == "in_batch":
        return [InBatchNegatives(target_probabilities, in_batch_candidates)]
    if loss == "mixed":
        return [
            InBatchNegatives(target_probabilities, in_batch_candidates),
            SampledNegatives(sampler, k, per_positive),
        ]
    return [SampledNegatives(sampler, k, per_positive)]  # sampled_softmax, bce, gbce
