"""Batches of an epoch: shuffled, optionally grouped by history length, each trimmed of the padding
columns all its rows share."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

TRIM_MULTIPLE = 8
"""A trimmed batch keeps a multiple of this many columns (fewer shapes to trace)."""

BUCKET_BATCHES = 64
"""Length bucketing sorts runs of this many batches' examples by length."""


def epoch_batches(
    x: dict[str, np.ndarray],
    y: np.ndarray,
    batch_size: int,
    seed: int,
    first_epoch: int,
    epochs: int,
    length_buckets: bool = False,
) -> tf.data.Dataset:
    """Batches for epochs ``first_epoch .. epochs - 1`` back to back, each epoch in its own order.

    Epoch ``e``'s order depends only on ``(seed, e)``, so a resumed run sees the batches the
    uninterrupted run would have. Every batch drops the leading columns that are padding in all
    its rows (inputs ``[B, L]`` left-padded, and ``[B, L]`` targets), keeping a multiple of
    :data:`TRIM_MULTIPLE` columns: the towers ignore padding, so only the work changes.

    With ``length_buckets`` (:func:`bucketed_order`) a batch holds histories of similar
    lengths, so trimming removes most of the padding (mixed-length batching), and every epoch
    still has ``ceil(N / batch_size)`` batches. With one target per example a batch has
    ``batch_size`` rows; with ``[N, L]`` targets (``all_positions``, ``cloze``) the rows vary
    and each batch holds about the same number of targets (the epoch's targets over its
    batches), as a mixed batch does on average: long histories come a few to a batch, short
    ones many.
    """
    n = len(y)
    x_all = {k: tf.constant(v) for k, v in x.items()}
    y_all = tf.constant(y)
    num_batches = -(-n // batch_size)
    lengths = np.count_nonzero(x["items"], axis=1)
    targets = np.count_nonzero(y.reshape(n, -1), axis=1)

    def epoch_order(e: Any) -> tf.data.Dataset:
        key = tf.stack([tf.constant(seed, tf.int64), e])
        order = tf.argsort(tf.random.stateless_uniform([n], key))
        if not length_buckets:
            return tf.data.Dataset.from_tensor_slices(order).batch(batch_size)
        rows, splits = tf.numpy_function(
            lambda order, e: bucketed_order(order, lengths, targets, batch_size, seed, int(e)),
            [order, e],
            [tf.int64, tf.int64],
            stateful=False,
        )
        rows.set_shape([n])
        splits.set_shape([num_batches + 1])
        return tf.data.Dataset.from_tensor_slices(tf.RaggedTensor.from_row_splits(rows, splits))

    def gather(rows: Any) -> tuple[Any, ...]:
        return _trim_padding({k: tf.gather(v, rows) for k, v in x_all.items()}, tf.gather(y_all, rows))

    epochs_ds = tf.data.Dataset.range(first_epoch, epochs)
    return epochs_ds.flat_map(epoch_order).map(
        gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )


def bucketed_order(
    order: np.ndarray, lengths: np.ndarray, targets: np.ndarray, batch_size: int, seed: int, epoch: int
) -> tuple[np.ndarray, np.ndarray]:
    """One epoch's length-bucketed batches: the rows of ``order`` regrouped, and the batch bounds.

    The shuffled ``order`` is cut into runs of :data:`BUCKET_BATCHES` × ``batch_size``
    examples; each run is sorted by history length (``lengths``) and cut into
    ``ceil(run / batch_size)`` batches holding about equal numbers of targets (``targets``
    per example: every batch ``batch_size`` rows when each example has one), never empty; the
    batches of a run are shuffled (seeded by ``(seed, epoch)``).

    Returns:
        ``rows`` int64 ``[N]`` (a permutation of ``order``) and ``splits`` int64
        ``[num_batches + 1]``: batch ``b`` is ``rows[splits[b]:splits[b + 1]]``.
    """
    rng = np.random.default_rng([seed, epoch, 1])
    run_size = batch_size * BUCKET_BATCHES
    pieces: list[np.ndarray] = []
    for start in range(0, len(order), run_size):
        run = order[start : start + run_size]
        run = run[np.argsort(lengths[run], kind="stable")]
        k = -(-len(run) // batch_size)
        cum = np.cumsum(targets[run], dtype=np.float64)
        # Bound j (1..k-1) where the run's targets reach j/k, kept strictly increasing and
        # inside the run so that every batch has at least one row.
        bounds = np.searchsorted(cum, cum[-1] * np.arange(1, k) / k, side="right")
        j = np.arange(1, k)
        bounds = np.clip(bounds, j, len(run) - (k - j))
        bounds = np.maximum.accumulate(bounds - j) + j
        batches = np.split(run, bounds)
        pieces += [batches[b] for b in rng.permutation(k)]
    splits = np.cumsum([0] + [len(b) for b in pieces])
    return np.concatenate(pieces).astype(np.int64), splits.astype(np.int64)


def _trim_padding(x: dict[str, Any], y: Any) -> tuple[dict[str, Any], Any]:
    """Drops the leading columns of ``[B, L]`` inputs (and ``[B, L]`` targets) that hold no item
    and no target in any row, keeping a multiple of :data:`TRIM_MULTIPLE` (at most ``L``)."""
    items = x["items"]
    full, width = tf.shape(items)[1], items.shape[1]
    used = tf.reduce_any(items != 0, axis=0)
    if y.shape.rank == 2:
        used = used | tf.reduce_any(y != 0, axis=0)
    first = tf.argmax(tf.cast(used, tf.int32), output_type=tf.int32)  # the first column in use
    needed = tf.where(tf.reduce_any(used), full - first, 1)
    keep = tf.minimum(full, -(-needed // TRIM_MULTIPLE) * TRIM_MULTIPLE)

    def cut(v: Any) -> Any:
        return v[:, full - keep :] if v.shape.rank == 2 and v.shape[1] == width else v

    return {k: cut(v) for k, v in x.items()}, cut(y)
