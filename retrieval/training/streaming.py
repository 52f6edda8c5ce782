"""Training examples and evaluation streamed from a prepared folder (:mod:`retrieval.data.prepared`).

One epoch reads the folder's row groups (at most ``users_per_row_group`` users each) one at a
time in an order drawn from ``(seed, epoch)``, cuts each group's training sequences into
examples with :func:`retrieval.training.examples.make_examples` (so every objective's ``(x, y)`` is
exactly the in-memory one), and shuffles them through a buffer: examples gather until there
are ``shuffle_buffer`` of them, are permuted, and leave as batches of ``batch_size``; what is
short of a batch waits for the next round, and the epoch's last batch may be short, so an epoch
is ``ceil(examples / batch_size)`` batches, as :func:`retrieval.training.batches.epoch_batches` gives.

Memory: the buffer (``shuffle_buffer`` examples of ``[max_len]`` int32 per input), one row
group's columns and the examples of ``chunk_events`` events, whatever the data size. The shuffle
mixes examples within a buffer and the order of the row groups, not the whole epoch: users of
one row group stay in the same rounds.

Evaluation (:func:`evaluate_prepared`, :func:`popularity_prepared`) reads the split's users a
batch at a time and averages the per-user metrics over all of them, which is what one
:func:`retrieval.evaluation.evaluate.evaluate_ranking` call over every user gives.

Example:
    >>> ds = streaming_dataset("runs/prepared", "last", max_len=50, batch_size=512, seed=42)
    >>> x, y = next(iter(ds))  # x["items"]: int32 [512, 50], y: int32 [512]
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import tensorflow as tf

from retrieval.data.features import SideVocab
from retrieval.data.prepared.reader import (
    Prepared,
    encode_side,
    iter_pieces,
    open_prepared,
    side_columns,
    user_sequences,
)
from retrieval.training.config import OBJECTIVES
from retrieval.training.examples import make_examples

SHUFFLE_BUFFER = 100_000
"""Examples gathered before a shuffle (~20 MB of ``last`` examples at ``max_len`` 50)."""

CHUNK_EVENTS = 16_384
"""Training events cut into examples at once (``last``: ~16k examples, ~3 MB per input at 50)."""


Batch = tuple[dict[str, np.ndarray], np.ndarray]


def user_chunks(lengths: np.ndarray, chunk_events: int) -> list[slice]:
    """Consecutive users whose ``lengths`` sum to at most ``chunk_events`` (a longer user alone)."""
    bounds = [0]
    total = 0
    for u, n in enumerate(lengths.tolist()):
        if total and total + n > chunk_events:
            bounds.append(u)
            total = 0
        total += n
    bounds.append(len(lengths))
    return [slice(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def piece_examples(
    folder: str | Path | Prepared,
    objective: str,
    max_len: int,
    rng: np.random.Generator | None = None,
    side: SideVocab | None = None,
    chunk_events: int = CHUNK_EVENTS,
) -> Iterator[Batch]:
    """:func:`~retrieval.training.examples.make_examples` of the training sequences, one row group at a
    time (in file order, or in an order drawn from ``rng``), in chunks of users holding at most
    ``chunk_events`` training events (bounds make_examples' ``[N, max_len]`` temporaries).

    Yields:
        ``({"items": int32 [N, max_len], <side feature>: …}, targets)`` with the targets int32
        ``[N]`` (``last``) or ``[N, max_len]``; chunks without examples are skipped.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose one of {OBJECTIVES}")
    prepared = open_prepared(folder)
    columns = ["items", "train_len", *side_columns(side, prepared.event_columns)]
    for table in iter_pieces(prepared, columns, rng):
        lengths = table["train_len"].to_numpy()
        train = [s[:n] for s, n in zip(user_sequences(table), lengths, strict=True)]
        events = {"items": train}
        for name, per_user in encode_side(table, side).items():  # whole sequences: cut like the items
            events[name] = [v[:n] for v, n in zip(per_user, lengths, strict=True)]
        for users in user_chunks(lengths, chunk_events):
            x, y = make_examples(objective, {k: v[users] for k, v in events.items()}, max_len)
            if len(y):
                yield x, y


def shuffled_batches(
    chunks: Iterator[Batch], batch_size: int, shuffle_buffer: int, rng: np.random.Generator
) -> Iterator[Batch]:
    """Re-batches example chunks through a shuffle buffer (see the module docstring).

    Every example of ``chunks`` comes out exactly once; all batches hold ``batch_size`` examples
    but the last, which holds the rest.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    xs: list[dict[str, np.ndarray]] = []
    ys: list[np.ndarray] = []
    held = 0

    def gather() -> tuple[Batch, np.ndarray]:
        x = {k: np.concatenate([c[k] for c in xs]) for k in xs[0]}
        y = np.concatenate(ys)
        return (x, y), rng.permutation(len(y))

    for x, y in chunks:
        xs.append(x)
        ys.append(y)
        held += len(y)
        if held < max(shuffle_buffer, batch_size):
            continue
        (x_all, y_all), order = gather()
        full = len(order) - len(order) % batch_size
        yield from _in_batches((x_all, y_all), order[:full], batch_size)
        rest = order[full:]
        xs, ys, held = [{k: v[rest] for k, v in x_all.items()}], [y_all[rest]], len(rest)
    if held:
        yield from _in_batches(*gather(), batch_size)


def _in_batches(examples: Batch, order: np.ndarray, batch_size: int) -> Iterator[Batch]:
    """The rows ``order`` picks from ``examples``, ``batch_size`` at a time (the last holds the rest)."""
    x, y = examples
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        yield {k: v[rows] for k, v in x.items()}, y[rows]


def epoch_examples(
    folder: str | Path | Prepared,
    objective: str,
    max_len: int,
    batch_size: int,
    seed: int,
    epoch: int = 0,
    shuffle_buffer: int = SHUFFLE_BUFFER,
    side: SideVocab | None = None,
) -> Iterator[Batch]:
    """One epoch of shuffled numpy batches; the order depends only on ``(seed, epoch)``."""
    rng = np.random.default_rng([seed, epoch])
    chunks = piece_examples(folder, objective, max_len, rng, side)
    return shuffled_batches(chunks, batch_size, shuffle_buffer, rng)


def streaming_dataset(
    folder: str | Path | Prepared,
    objective: str,
    max_len: int,
    batch_size: int,
    seed: int,
    first_epoch: int = 0,
    epochs: int | None = None,
    shuffle_buffer: int = SHUFFLE_BUFFER,
    side: SideVocab | None = None,
) -> tf.data.Dataset:
    """Training batches of epochs ``first_epoch .. epochs - 1`` back to back (one epoch when
    ``epochs`` is None), each epoch in its own seeded order, streamed from a prepared folder.

    Each element is ``(x, y)`` as :func:`retrieval.training.examples.make_examples` gives for
    ``objective``: ``x = {"items": int32 [B, max_len], <side.event_features>: int32 [B, max_len]}``,
    ``y`` int32 ``[B]`` (``last``) or ``[B, max_len]``. Cloze masking (``mask_items``) and
    prefetching are left to the caller, as for the in-memory batches.

    Args:
        folder: a prepared folder (local path, URI, or :class:`~retrieval.data.prepared.reader.Prepared`).
        objective: one of :data:`retrieval.training.examples.OBJECTIVES`.
        max_len: the window length.
        batch_size: examples per batch (the epoch's last batch may be short).
        seed: with the epoch number, fixes the order.
        first_epoch: the first epoch's number (a resumed run sees the batches it would have seen).
        epochs: one past the last epoch's number.
        shuffle_buffer: examples gathered before each shuffle.
        side: per-event side features to add (:func:`retrieval.data.prepared.reader.side_vocab`).
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose one of {OBJECTIVES}")
    prepared = open_prepared(folder)
    names = ["items", *(side.event_features if side is not None else ())]
    target_shape = [None] if objective == "last" else [None, max_len]
    signature = (
        {name: tf.TensorSpec([None, max_len], tf.int32) for name in names},
        tf.TensorSpec(target_shape, tf.int32),
    )

    def generate(epoch: np.int64) -> Iterator[Batch]:
        for x, y in epoch_examples(
            prepared, objective, max_len, batch_size, seed, int(epoch), shuffle_buffer, side
        ):
            yield {k: x[k].astype(np.int32, copy=False) for k in names}, y.astype(np.int32, copy=False)

    last = first_epoch + 1 if epochs is None else epochs
    return tf.data.Dataset.range(first_epoch, last).flat_map(
        lambda e: tf.data.Dataset.from_generator(generate, output_signature=signature, args=(e,))
    )
