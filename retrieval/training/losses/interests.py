"""How a user's K interests meet one target in training: ComiRec's hard selection, MIND's
label-aware attention, or the max over interests."""

from __future__ import annotations

from typing import Any

import tensorflow as tf


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


def interest_scores(query: Any, vectors: Any, per_row: bool) -> Any:
    """Scores of item vectors under each row's query: ``<q, e>`` for ``[M, d]`` queries, and for
    ``[M, K, d]`` ones ``max_k <q_k, e>`` (all-zero, i.e. masked, interests skipped), the score
    the multi-interest search ranks items by (:func:`index.multi_interest.search_interests`).

    Args:
        query: ``[M, d]`` or ``[M, K, d]``.
        vectors: with ``per_row``, ``[M, d]`` (an item per row) or ``[M, N, d]`` (``N`` per
            row); without, ``[N, d]`` shared by every row.

    Returns:
        ``[M]`` for an item per row, else ``[M, N]``.
    """
    one = per_row and vectors.shape.rank == 2
    if query.shape.rank == 2:
        if one:
            return tf.reduce_sum(query * vectors, axis=-1)
        if per_row:
            return tf.einsum("md,mnd->mn", query, vectors)
        return tf.matmul(query, vectors, transpose_b=True)
    if one:
        scores = tf.einsum("mkd,md->mk", query, vectors)[:, :, None]  # [M, K, 1]
    else:
        scores = tf.einsum("mkd,mnd->mkn" if per_row else "mkd,nd->mkn", query, vectors)  # [M, K, N]
    active = tf.reduce_any(tf.not_equal(query, 0.0), axis=-1)  # [M, K]
    best = tf.reduce_max(tf.where(active[:, :, None], scores, scores.dtype.min), axis=1)  # [M, N]
    return best[:, 0] if one else best
