"""The partition files of a prepared folder (:mod:`retrieval.data.prepared`): which partition a
user's row goes to, the rows of one partition, and the per-item counts written beside them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from retrieval.data.errors import DataError
from retrieval.data.prepared.reader import RESERVED_COLUMNS, SEQUENCES

MAX_PARTITIONS = 4096
EVENTS_PER_PARTITION = 2_000_000
ROW_COLUMN = "__row"  # staging only: the event's position in the input, the tie-breaker of every sort


def partition_of(users: Sequence[str] | np.ndarray, partitions: int) -> np.ndarray:
    """Each user's partition, int64 ``[n]`` in ``0..partitions-1``, stable across runs and machines.

    Example:
        >>> partition_of(["u1", "u2"], 1).tolist()
        [0, 0]
    """
    values = np.asarray(users, dtype=object)
    if not len(values):
        return np.zeros(0, np.int64)
    hashes = pd.util.hash_array(values, categorize=False)
    return (hashes % np.uint64(partitions)).astype(np.int64)


def partitions_for(events: int, events_per_partition: int = EVENTS_PER_PARTITION) -> int:
    """Partitions for an input of ``events`` events: ``ceil(events / events_per_partition)``,
    between 1 and :data:`MAX_PARTITIONS`."""
    return int(min(MAX_PARTITIONS, max(1, math.ceil(events / max(1, events_per_partition)))))


class ItemCounts:
    """Per dense id: events, training events and training sequences starting with it."""

    def __init__(self, num_embeddings: int) -> None:
        self.events = np.zeros(num_embeddings, np.int64)
        self.train = np.zeros(num_embeddings, np.int64)
        self.first = np.zeros(num_embeddings, np.int64)

    def add(self, items: np.ndarray, lengths: np.ndarray, train_len: np.ndarray) -> None:
        n = len(self.events)
        starts = np.cumsum(lengths) - lengths
        position = np.arange(len(items)) - np.repeat(starts, lengths)
        self.events += np.bincount(items, minlength=n)
        self.train += np.bincount(items[position < np.repeat(train_len, lengths)], minlength=n)
        self.first += np.bincount(items[starts[lengths > 0]], minlength=n)

    def write(self, path: Path) -> None:
        pq.write_table(pa.table({"events": self.events, "train": self.train, "first": self.first}), path)


def user_table(
    users: pa.Array,
    lengths: np.ndarray,
    items: np.ndarray,
    columns: Mapping[str, pa.Array],
    train_len: np.ndarray,
) -> pa.Table:
    """One partition's rows (the layout's columns) from flat, user-grouped event arrays.

    Args:
        users: string ``[U]``; lengths: int ``[U]`` events per user; items: int ``[E]`` dense ids,
        grouped by user in ``users`` order; columns: event columns ``[E]``, aligned with items;
        train_len: int ``[U]`` training events per user.
    """
    if lengths.sum() >= 2**31:
        raise DataError(f"a partition holds {lengths.sum()} events (at most 2^31 - 1): use more partitions")
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    ends = np.cumsum(lengths)
    evaluated = lengths >= 3
    flat = np.asarray(items, np.int32)

    def target(back: int) -> np.ndarray:
        if not len(flat):
            return np.zeros(len(lengths), np.int32)
        return np.where(evaluated, flat[np.maximum(ends - back, 0)], 0).astype(np.int32)

    table = {"user": users, "items": pa.ListArray.from_arrays(offsets, pa.array(flat, pa.int32()))}
    for name, values in columns.items():
        table[name] = pa.ListArray.from_arrays(offsets, values)
    table["train_len"] = pa.array(np.asarray(train_len, np.int32))
    table["valid_target"] = pa.array(target(2))
    table["test_target"] = pa.array(target(1))
    return pa.table(table)


def part_path(root: Path, p: int) -> Path:
    return root / SEQUENCES / f"part-{p:05d}.parquet"


def check_event_columns(names: Sequence[str], where: str) -> None:
    clash = [n for n in names if n in RESERVED_COLUMNS or n == ROW_COLUMN]
    if clash:
        raise DataError(
            f"{where}: event column(s) {', '.join(clash)} clash with the prepared layout's columns"
        )
