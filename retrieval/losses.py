"""The training task: how interests meet a target, and sampled softmax with log-Q correction.

Towers only compute embeddings; everything about the loss lives here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

SAMPLERS = ("popularity", "uniform")
INTEREST_SELECTIONS = ("hard", "label_aware")


def _active_scores(interests: Any, target: Any) -> tuple[Any, Any]:
    """``<v_k, e_t>`` ``[B, K]`` and which interests are real (not all-zero, i.e. not masked) ``[B, K]``."""
    scores = tf.einsum("bkd,bd->bk", interests, target)
    active = tf.reduce_any(tf.not_equal(interests, 0.0), axis=-1)
    return scores, active


def select_interest(interests: Any, target: Any) -> Any:
    """ComiRec's hard selection: the interest that scores highest against the target.

    All-zero interests (masked by towers with a per-user number of interests) are never
    selected unless the user has no other.

    Args:
        interests: ``[B, K, d]``.
        target: target item embeddings ``[B, d]``.

    Returns:
        ``[B, d]``: ``interests[b, argmax_k <interests[b, k], target[b]>]``. Gradients flow
        only into the selected interest.
    """
    scores, active = _active_scores(interests, target)  # [B, K]
    scores = tf.where(active, scores, scores.dtype.min)
    best = tf.argmax(scores, axis=1, output_type=tf.int32)  # [B]
    return tf.gather(interests, best, axis=1, batch_dims=1)


def label_aware_attention(interests: Any, target: Any, power: float = 1.0) -> Any:
    """MIND's label-aware attention: ``Σ_k softmax_k(pow(<v_k, e_t>, p)) v_k``.

    ``p = 0`` weighs every interest equally (the mean), ``p = 1`` is a softmax of the
    inner products, and a larger ``p`` moves towards the hard selection of
    :func:`select_interest`. ``pow`` is taken sign-preserving, ``sign(x)·|x|^p``: equal to the
    paper's ``x^p`` for ``x >= 0`` and, unlike it, defined and increasing in ``x`` for negative
    inner products and any real ``p`` (the paper's interests are ReLU outputs; ours need not be).
    All-zero (masked) interests get zero weight. Keep ``|x|^p`` finite in float32: ``p`` of a
    few units for inner products of order 1-10.

    Args:
        interests: ``[B, K, d]``.
        target: target item embeddings ``[B, d]``.
        power: ``p >= 0``.

    Returns:
        ``[B, d]``; gradients flow into every interest and through the attention weights.
    """
    if power < 0:
        raise ValueError(f"label-aware attention power must be >= 0, got {power}")
    scores, active = _active_scores(interests, target)  # [B, K]
    if power == 0:
        logits = tf.zeros_like(scores)
    else:
        # |x| floored so that the gradient of |x|^p stays finite at x = 0 for p < 1.
        logits = tf.sign(scores) * tf.pow(tf.maximum(tf.abs(scores), 1e-12), power)
    weights = tf.nn.softmax(tf.where(active, logits, logits.dtype.min), axis=1)  # [B, K]
    return tf.einsum("bk,bkd->bd", weights, interests)


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
    pos_logit = tf.reduce_sum(query * positive, axis=-1) / temperature - positive_log_q  # [B]
    neg_logits = tf.matmul(query, negatives, transpose_b=True) / temperature - negative_log_q  # [B, N]
    if remove_accidental_hits:
        hit = tf.equal(tf.expand_dims(positive_ids, 1), tf.expand_dims(negative_ids, 0))  # [B, N]
        neg_logits = tf.where(hit, tf.fill(tf.shape(neg_logits), neg_logits.dtype.min), neg_logits)
    logits = tf.concat([pos_logit[:, None], neg_logits], axis=1)  # [B, 1 + N]
    return tf.reduce_logsumexp(logits, axis=1) - pos_logit


class CandidateSampler:
    """Samples negative item ids (with replacement) from a fixed distribution over ``1..n``.

    Args:
        probabilities: ``[num_embeddings]`` sampling probabilities; entry 0 (padding) must be 0.
    """

    def __init__(self, probabilities: np.ndarray) -> None:
        p = np.asarray(probabilities, np.float64)
        if p[0] != 0 or np.any(p < 0) or not np.isclose(p.sum(), 1.0):
            raise ValueError("sampling probabilities must be >= 0, sum to 1 and be 0 for padding")
        self.log_q = tf.constant(np.log(np.maximum(p, 1e-30)), tf.float32)  # [V]
        self.cdf = tf.constant(np.cumsum(p), tf.float64)  # [V]

    @classmethod
    def from_counts(
        cls, counts: np.ndarray, kind: str = "popularity", alpha: float = 0.75
    ) -> CandidateSampler:
        """``popularity``: q ∝ (count + 1)^alpha (every item can be drawn); ``uniform``: q = 1/n."""
        if kind not in SAMPLERS:
            raise ValueError(f"unknown sampler {kind!r}; choose one of {SAMPLERS}")
        weights = np.ones(len(counts)) if kind == "uniform" else (np.asarray(counts, float) + 1.0) ** alpha
        weights[0] = 0.0
        return cls(weights / weights.sum())

    def sample(self, n: int) -> Any:
        """``n`` ids int32 ``[n]``, drawn by inverting the CDF (O(n log V))."""
        u = tf.random.uniform([n], dtype=tf.float64) * self.cdf[-1]
        ids = tf.searchsorted(self.cdf, u, side="right", out_type=tf.int32)
        return tf.minimum(ids, tf.shape(self.cdf, out_type=tf.int32)[0] - 1)


class SampledSoftmaxTask:
    """The retrieval loss: interest selection, then sampled softmax with log-Q correction.

    Args:
        sampler: negative sampler over the catalogue.
        num_negatives: negatives drawn per batch (shared by its rows).
        temperature: logits are divided by it.
        remove_accidental_hits: drop sampled negatives equal to the row's target.
        interest_selection: how the K interests meet the target: ``"hard"``
            (:func:`select_interest`, ComiRec) or ``"label_aware"`` (:func:`label_aware_attention`, MIND).
        label_aware_power: MIND's ``p`` for ``"label_aware"``.
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
        if num_negatives < 1 or temperature <= 0:
            raise ValueError("num_negatives must be >= 1 and temperature > 0")
        if interest_selection not in INTEREST_SELECTIONS:
            raise ValueError(
                f"unknown interest selection {interest_selection!r}; choose one of {INTEREST_SELECTIONS}"
            )
        if label_aware_power < 0:
            raise ValueError(f"label_aware_power must be >= 0, got {label_aware_power}")
        self.sampler = sampler
        self.num_negatives = num_negatives
        self.temperature = temperature
        self.remove_accidental_hits = remove_accidental_hits
        self.interest_selection = interest_selection
        self.label_aware_power = label_aware_power

    def select(self, interests: Any, target: Any) -> Any:
        """The training query ``[B, d]`` from interests ``[B, K, d]`` and target embeddings ``[B, d]``."""
        if self.interest_selection == "label_aware":
            return label_aware_attention(interests, target, self.label_aware_power)
        return select_interest(interests, target)

    def __call__(self, outputs: Any, target_ids: Any, embed: Any) -> Any:
        """Mean loss over the batch's targets; ``embed`` maps ids to ``[.., d]``.

        Args:
            outputs: interests ``[B, K, d]`` with targets ``[B]`` (one target per row, an
                interest selected per row), or per-position outputs ``[B, L, d]`` with
                targets ``[B, L]`` (0 = no target at that position; objectives
                ``all_positions`` and ``cloze``).
        """
        target_ids = tf.cast(target_ids, tf.int32)
        if target_ids.shape.rank == 2:
            at = tf.where(target_ids > 0)  # [M, 2] (row, position) of every real target
            query, target_ids = tf.gather_nd(outputs, at), tf.gather_nd(target_ids, at)  # [M, d], [M]
            positive = embed(target_ids)
        else:
            positive = embed(target_ids)  # [B, d]
            query = self.select(outputs, positive)  # [B, d]
        negative_ids = self.sampler.sample(self.num_negatives)  # [N]
        loss = sampled_softmax_loss(
            query,
            positive,
            target_ids,
            embed(negative_ids),
            negative_ids,
            tf.gather(self.sampler.log_q, target_ids),
            tf.gather(self.sampler.log_q, negative_ids),
            self.temperature,
            self.remove_accidental_hits,
        )
        return tf.reduce_mean(loss)
