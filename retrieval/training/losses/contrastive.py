"""DuoRec's contrastive regulariser (Qiu et al. 2022): NT-Xent between two dropout views of each sequence."""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def sequence_views(outputs: Any, target_ids: Any) -> tuple[Any, Any]:
    """Each sequence's representation ``[B, d]`` and training target ``[B]``.

    Per-position outputs ``[B, L, d]`` with targets ``[B, L]`` (objectives ``all_positions``,
    ``cloze``) give the newest position's (sequences are left-padded: the last column); interests
    ``[B, K, d]`` with targets ``[B]`` give the mean of the K interests.
    """
    target_ids = tf.cast(target_ids, tf.int32)
    if target_ids.shape.rank == 2:
        return outputs[:, -1, :], target_ids[:, -1]
    return tf.reduce_mean(outputs, axis=1), target_ids


def nt_xent(first: Any, second: Any, target_ids: Any, temperature: float = 1.0) -> Any:
    """InfoNCE over the ``2B`` views of a batch (SimCLR's NT-Xent), per view ``[2B]``.

    View ``i``'s positive is its twin (the same sequence's other view), its negatives the other
    ``2B - 2`` views, except those of sequences with the same target as its own (DuoRec's false
    negatives); target 0 (none, e.g. an unmasked cloze position) leaves out nothing. Logits are
    ``<u, v> / temperature``.

    Args:
        first: ``[B, d]``, the views of the main loss's forward pass.
        second: ``[B, d]``, the views of a second pass (other dropout masks).
        target_ids: int ``[B]``, each sequence's training target.
        temperature: > 0.

    Example:
        >>> nt_xent(tf.eye(2), tf.eye(2), tf.constant([1, 2])).shape
        TensorShape([4])
    """
    views = tf.concat([first, second], axis=0)  # [2B, d]
    targets = tf.tile(tf.cast(target_ids, tf.int32), [2])  # [2B]
    n = tf.shape(views)[0]
    index = tf.range(n)
    twin = (index + n // 2) % n  # [2B]: i <-> i + B
    logits = tf.matmul(views, views, transpose_b=True) / temperature  # [2B, 2B]
    same_target = tf.logical_and(tf.equal(targets[:, None], targets[None, :]), targets[:, None] > 0)
    false_negative = tf.logical_and(same_target, tf.not_equal(index[None, :], twin[:, None]))
    keep = tf.logical_and(tf.not_equal(index[None, :], index[:, None]), tf.logical_not(false_negative))
    masked = tf.where(keep, logits, logits.dtype.min)
    return tf.reduce_logsumexp(masked, axis=1) - tf.gather(logits, twin, axis=1, batch_dims=1)
