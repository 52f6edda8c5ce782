"""Candidate logits and the losses on them: softmax cross-entropy and gSASRec's generalised BCE."""

from __future__ import annotations

import abc
from typing import Any

import tensorflow as tf

from retrieval.training.losses.interests import interest_scores


def candidate_logits(
    query: Any,
    positive: Any,
    positive_ids: Any,
    candidates: Any,
    candidate_ids: Any,
    positive_log_q: Any = 0.0,
    candidate_log_q: Any = 0.0,
    temperature: float = 1.0,
    remove_accidental_hits: bool = True,
) -> tuple[Any, Any, Any]:
    """Corrected logits of each row's positive and of its candidate negatives.

    Candidates are either shared by every row (``candidates [N, d]``, ids and log-Q ``[N]``) or
    drawn per row (``candidates [M, N, d]``, ids and log-Q ``[M, N]``).

    Args:
        query: ``[M, d]``, or ``[M, K, d]`` K interests scored by their best (:func:`interest_scores`).
        positive: ``[M, d]``; positive_ids: ``[M]``.
        candidates: ``[N, d]`` or ``[M, N, d]``; candidate_ids: ``[N]`` or ``[M, N]``.
        positive_log_q: ``[M]`` (or 0): subtracted from the positive logit.
        candidate_log_q: like ``candidate_ids`` (or 0): subtracted from the candidate logits.
        temperature: logits ``<q, e> / T``.
        remove_accidental_hits: mark candidates equal to the row's positive as invalid.

    Returns:
        ``pos_logit [M]``, ``neg_logits [M, N]`` and ``valid`` bool ``[M, N]`` (False = an
        accidental hit, to be left out of the loss).
    """
    pos_logit = interest_scores(query, positive, per_row=True) / temperature - positive_log_q  # [M]
    shared = candidate_ids.shape.rank == 1  # or one set per row
    neg_logits = interest_scores(query, candidates, per_row=not shared)  # [M, N]
    ids = candidate_ids[None, :] if shared else candidate_ids  # [1, N] or [M, N]
    neg_logits = neg_logits / temperature - candidate_log_q
    if remove_accidental_hits:
        valid = tf.not_equal(ids, tf.expand_dims(positive_ids, 1))
    else:
        valid = tf.ones_like(ids, tf.bool)
    valid = tf.broadcast_to(valid, tf.shape(neg_logits))
    return pos_logit, neg_logits, valid


class LogitLoss(abc.ABC):
    """Turns ``(pos_logit [M], neg_logits [M, N], valid [M, N])`` into a per-row loss ``[M]``."""

    logq_correction: bool = True
    """Whether log-Q corrected logits are what this loss expects (softmax losses: yes)."""

    @abc.abstractmethod
    def __call__(self, pos_logit: Any, neg_logits: Any, valid: Any) -> Any:
        """Per-row loss ``[M]``; invalid negatives contribute nothing."""


class SoftmaxCrossEntropy(LogitLoss):
    """``-log softmax`` of the positive among itself and the valid negatives."""

    def __call__(self, pos_logit: Any, neg_logits: Any, valid: Any) -> Any:
        neg_logits = tf.where(valid, neg_logits, neg_logits.dtype.min)
        logits = tf.concat([pos_logit[:, None], neg_logits], axis=1)  # [M, 1 + N]
        return tf.reduce_logsumexp(logits, axis=1) - pos_logit


class GeneralisedBCE(LogitLoss):
    """gSASRec's gBCE (Petrov & Macdonald, RecSys 2023); ``beta = 1`` is plain BCE.

    ``-(β log σ(s⁺) + Σ_j log(1 - σ(s_j))) / (1 + n)`` over the ``n`` valid negatives of a row.
    ``β < 1`` lowers the positive's weight, which counters the overconfidence that negative
    sampling causes; :meth:`beta_for` gives the paper's ``β`` from its calibration parameter ``t``.
    Logits are not log-Q corrected: σ(s) is read as a probability per item, and the paper's
    calibration assumes uniform sampling.
    """

    logq_correction = False

    def __init__(self, beta: float = 1.0) -> None:
        if beta <= 0:
            raise ValueError(f"gBCE beta must be > 0, got {beta}")
        self.beta = beta

    @staticmethod
    def beta_for(t: float, negatives_per_positive: int, num_items: int) -> float:
        """The paper's ``β = α (t (1 - 1/α) + 1/α) = 1 - t (1 - α)``, with the sampling rate
        ``α = k / (|I| - 1)`` (capped at 1): ``t = 0`` is BCE, ``t = 1`` fully calibrated."""
        if not 0.0 <= t <= 1.0:
            raise ValueError(f"gBCE t must be in [0, 1], got {t}")
        alpha = min(1.0, negatives_per_positive / max(num_items - 1, 1))
        return 1.0 - t * (1.0 - alpha)

    def __call__(self, pos_logit: Any, neg_logits: Any, valid: Any) -> Any:
        valid = tf.cast(valid, neg_logits.dtype)
        # -log σ(s) = softplus(-s); -log(1 - σ(s)) = softplus(s): stable for any logit.
        total = self.beta * tf.nn.softplus(-pos_logit) + tf.reduce_sum(valid * tf.nn.softplus(neg_logits), 1)
        return total / (1.0 + tf.reduce_sum(valid, axis=1))


def sampled_softmax_loss(
    query: Any,
    positive: Any,
    positive_ids: Any,
    negatives: Any,
    negative_ids: Any,
    positive_log_q: Any,
    negative_log_q: Any,
    temperature: float = 1.0,
    remove_accidental_hits: bool = True,
) -> Any:
    """Softmax cross-entropy of each positive against shared sampled negatives.

    Each logit ``<q, e_j> / T`` is corrected by ``- log Q(j)`` (the probability that the
    sampler proposes j), which makes the sampled softmax an unbiased estimate of the full
    softmax's gradient for any sampler. Negatives equal to the row's positive are
    "accidental hits" and are removed from that row's softmax.

    Args:
        query: ``[B, d]``; positive: ``[B, d]``; positive_ids: ``[B]``.
        negatives: ``[N, d]``; negative_ids: ``[N]``.
        positive_log_q: ``[B]``; negative_log_q: ``[N]``: log sampling probabilities.

    Returns:
        per-example loss ``[B]``.
    """
    logits = candidate_logits(
        query,
        positive,
        positive_ids,
        negatives,
        negative_ids,
        positive_log_q,
        negative_log_q,
        temperature,
        remove_accidental_hits,
    )
    return SoftmaxCrossEntropy()(*logits)
