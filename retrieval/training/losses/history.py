"""Each target's history, and which of its candidate negatives are in it (``train.exclude_history``).

Evaluation and serving leave a user's history out of the answers, so a model never has to rank
a history item below the next one; trained with the history among its negatives, it spends
capacity pushing down the items most like the user's. These functions find those negatives, so
the task can leave them out of the loss as it does accidental hits.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def target_histories(items: Any, target_ids: Any) -> Any:
    """The history of each real target, int32 ``[M, L]`` (0 = none), in the order of
    ``tf.where(target_ids > 0)``: for per-position targets ``[B, L]`` the row's items at or before
    the target's position (never a later one); for one target per row ``[B]``, the whole row.

    Args:
        items: the model's input items ``[B, L]`` (0 = padding).
        target_ids: ``[B, L]`` (0 = no target) or ``[B]``.
    """
    items = tf.cast(items, tf.int32)
    if target_ids.shape.rank != 2:
        return items
    at = tf.where(target_ids > 0)  # [M, 2]
    rows = tf.gather(items, at[:, 0])  # [M, L]
    positions = tf.range(tf.shape(items, out_type=tf.int64)[1])[None, :]
    return tf.where(positions <= at[:, 1:2], rows, 0)


def history_hits(histories: Any, candidate_ids: Any) -> Any:
    """bool ``[M, N]``: whether candidate ``n`` of row ``m`` is an item of ``histories[m]``.

    Shared candidates ``[N]`` (duplicates allowed) are matched by binary search, so the cost is
    ``O(M L log N)`` whatever the catalogue; candidates drawn per row ``[M, N]`` by comparison.

    Args:
        histories: int32 ``[M, L]`` (0 = none), from :func:`target_histories`.
        candidate_ids: int32 ``[N]`` or ``[M, N]``.
    """
    candidate_ids = tf.cast(candidate_ids, tf.int32)
    if candidate_ids.shape.rank == 2:
        equal = tf.equal(histories[:, :, None], candidate_ids[:, None, :])  # [M, L, N]
        return tf.reduce_any(equal & (histories[:, :, None] > 0), axis=1)
    order = tf.argsort(candidate_ids)
    ordered = tf.gather(candidate_ids, order)
    flat = tf.reshape(histories, [-1])
    low = tf.searchsorted(ordered, flat, side="left")
    high = tf.where(flat > 0, tf.searchsorted(ordered, flat, side="right"), low)  # padding: none
    spans = tf.ragged.range(low, high)  # per history entry, its matches' places in `ordered`
    width = tf.shape(histories)[1]
    rows = tf.repeat(tf.range(tf.size(flat)) // width, high - low)
    columns = tf.gather(order, spans.flat_values)
    shape = tf.stack([tf.shape(histories)[0], tf.shape(candidate_ids)[0]])
    counts = tf.scatter_nd(tf.stack([rows, columns], 1), tf.ones_like(rows), shape)
    return counts > 0
