"""Training examples and evaluation streamed from a prepared folder (:mod:`retrieval.parquet_data`).

One epoch reads the folder's row groups (at most ``users_per_row_group`` users each) one at a
time in an order drawn from ``(seed, epoch)``, cuts each group's training sequences into
examples with :func:`retrieval.examples.make_examples` (so every objective's ``(x, y)`` is
exactly the in-memory one), and shuffles them through a buffer: examples gather until there
are ``shuffle_buffer`` of them, are permuted, and leave as batches of ``batch_size``; what is
short of a batch waits for the next round, and the epoch's last batch may be short, so an epoch
is ``ceil(examples / batch_size)`` batches, as :func:`retrieval.training_data.epoch_batches` gives.

Memory: the buffer (``shuffle_buffer`` examples of ``[max_len]`` int32 per input), one row
group's columns and the examples of ``chunk_events`` events, whatever the data size. The shuffle
mixes examples within a buffer and the order of the row groups, not the whole epoch: users of
one row group stay in the same rounds.

Evaluation (:func:`evaluate_prepared`, :func:`popularity_prepared`) reads the split's users a
batch at a time and averages the per-user metrics over all of them, which is what one
:func:`retrieval.evaluate.evaluate_ranking` call over every user gives.

Example:
    >>> ds = streaming_dataset("runs/prepared", "last", max_len=50, batch_size=512, seed=42)
    >>> x, y = next(iter(ds))  # x["items"]: int32 [512, 50], y: int32 [512]
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import tensorflow as tf

from index import VectorIndex
from retrieval.evaluate import evaluate_ranking, popularity_top_k
from retrieval.examples import OBJECTIVES, make_examples
from retrieval.features import SideVocab
from retrieval.metrics import DEFAULT_KS, ranking_metrics
from retrieval.model_artifact import ModelArtifact
from retrieval.parquet_data import (
    EvalBatch,
    Prepared,
    encode_side,
    item_counts,
    iter_eval_batches,
    iter_pieces,
    open_prepared,
    read_vocab,
    side_columns,
    user_sequences,
)
from retrieval.vocab import PAD

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
    """:func:`~retrieval.examples.make_examples` of the training sequences, one row group at a
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
        for start in range(0, full, batch_size):
            rows = order[start : start + batch_size]
            yield {k: v[rows] for k, v in x_all.items()}, y_all[rows]
        rest = order[full:]
        xs, ys, held = [{k: v[rest] for k, v in x_all.items()}], [y_all[rest]], len(rest)
    if held:
        (x_all, y_all), order = gather()
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            yield {k: v[rows] for k, v in x_all.items()}, y_all[rows]


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

    Each element is ``(x, y)`` as :func:`retrieval.examples.make_examples` gives for
    ``objective``: ``x = {"items": int32 [B, max_len], <side.event_features>: int32 [B, max_len]}``,
    ``y`` int32 ``[B]`` (``last``) or ``[B, max_len]``. Cloze masking (``mask_items``) and
    prefetching are left to the caller, as for the in-memory batches.

    Args:
        folder: a prepared folder (local path, URI, or :class:`~retrieval.parquet_data.Prepared`).
        objective: one of :data:`retrieval.examples.OBJECTIVES`.
        max_len: the window length.
        batch_size: examples per batch (the epoch's last batch may be short).
        seed: with the epoch number, fixes the order.
        first_epoch: the first epoch's number (a resumed run sees the batches it would have seen).
        epochs: one past the last epoch's number.
        shuffle_buffer: examples gathered before each shuffle.
        side: per-event side features to add (:func:`retrieval.parquet_data.side_vocab`).
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


def _user_mean(batches: Iterator[tuple[int, dict[str, float]]]) -> tuple[dict[str, float], int]:
    """Per-user means from per-batch means weighted by the batches' user counts, and the users."""
    totals: dict[str, float] = {}
    users = 0
    for n, metrics in batches:
        for name, value in metrics.items():
            totals[name] = totals.get(name, 0.0) + value * n
        users += n
    return ({name: total / users for name, total in totals.items()} if users else {}), users


def _to_model(model: ModelArtifact, prepared: Prepared) -> np.ndarray | None:
    """The folder's dense ids -> the model's (``[num_embeddings]``, 0 = unknown to the model), or
    None when the two vocabularies are the same (a model trained on this folder or its source)."""
    vocab = read_vocab(prepared)
    if model.vocab is None or model.vocab.ids == vocab.ids:
        return None
    return np.concatenate([[PAD], model.vocab.lookup(list(vocab.ids))]).astype(np.int64)


def _in_model_ids(batch: EvalBatch, to_model: np.ndarray | None) -> EvalBatch:
    """``batch`` in the model's ids: history items it does not know dropped (with their side
    features), unknown targets 0 (a miss), as :func:`retrieval.evaluate.evaluate_protocol` does."""
    if to_model is None:
        return batch
    raw = [to_model[h] for h in batch.histories]
    known = [h != PAD for h in raw]
    features = {
        name: [v[k] for v, k in zip(values, known, strict=True)] for name, values in batch.features.items()
    }
    histories = tuple(h[k] for h, k in zip(raw, known, strict=True))
    return EvalBatch(batch.users, histories, to_model[batch.targets], features)


def evaluate_prepared_users(
    model: ModelArtifact,
    folder: str | Path | Prepared,
    split: str = "valid",
    ks: Sequence[int] = DEFAULT_KS,
    batch_size: int = 1024,
    index: VectorIndex | None = None,
) -> tuple[dict[str, float], int]:
    """:func:`evaluate_prepared` and the number of users evaluated."""
    prepared = open_prepared(folder)
    side = model.side if model.side.event_features else None
    to_model = _to_model(model, prepared)

    def per_batch(batch: EvalBatch) -> tuple[int, dict[str, float]]:
        batch = _in_model_ids(batch, to_model)
        features = batch.features or None
        return len(batch.targets), evaluate_ranking(
            model, batch.histories, batch.targets, ks, features, index
        )

    return _user_mean(per_batch(b) for b in iter_eval_batches(prepared, split, batch_size, side))


def evaluate_prepared(
    model: ModelArtifact,
    folder: str | Path | Prepared,
    split: str = "valid",
    ks: Sequence[int] = DEFAULT_KS,
    batch_size: int = 1024,
    index: VectorIndex | None = None,
) -> dict[str, float]:
    """Full-ranking metrics (:func:`~retrieval.evaluate.evaluate_ranking`, history excluded) of
    the ``valid`` or ``test`` users of a prepared folder, ``batch_size`` users in memory at a
    time; the model's side features are encoded from the folder's event columns. A model with
    another vocabulary is evaluated through it: history items it does not know are dropped,
    unknown targets count as misses.

    Returns:
        ``{"hr@10": …, "ndcg@10": …, …}``, means over all the split's users ({} when none).
    """
    return evaluate_prepared_users(model, folder, split, ks, batch_size, index)[0]


def popularity_prepared(
    folder: str | Path | Prepared, split: str = "test", ks: Sequence[int] = DEFAULT_KS, batch_size: int = 1024
) -> dict[str, float]:
    """The most-popular baseline (training counts, history excluded) on a prepared folder's split."""
    counts = item_counts(folder, "train")

    def per_batch(batch: EvalBatch) -> tuple[int, dict[str, float]]:
        top = popularity_top_k(counts, batch.histories, max(ks))
        return len(batch.targets), ranking_metrics(top, batch.targets, ks)

    return _user_mean(per_batch(b) for b in iter_eval_batches(folder, split, batch_size))[0]
