"""Writes the prepared layout (:mod:`retrieval.data.prepared`) from any input: in memory for the
formats :func:`~retrieval.data.loaders.load_interactions` reads, out of core for a ``dataset``
(:mod:`retrieval.data.prepared.out_of_core`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from retrieval.data.errors import DataError
from retrieval.data.interactions import SequenceData, build_sequences
from retrieval.data.loaders import FORMATS as IN_MEMORY_FORMATS
from retrieval.data.loaders import load_interactions
from retrieval.data.prepared.out_of_core import prepare_out_of_core
from retrieval.data.prepared.partitions import (
    EVENTS_PER_PARTITION,
    MAX_PARTITIONS,
    ItemCounts,
    check_event_columns,
    part_path,
    partition_of,
    partitions_for,
    user_table,
)
from retrieval.data.prepared.reader import ATTRIBUTES_FILE, COUNTS_FILE, KIND, SEQUENCES, VOCAB_FILE
from retrieval.data.splits import leave_one_out
from retrieval.storage.folders import write_artifact

FORMATS = (*IN_MEMORY_FORMATS, "dataset")
USERS_PER_ROW_GROUP = 1024
BATCH_ROWS = 1 << 18


@dataclass(frozen=True)
class PreparedSummary:
    """What :func:`prepare` wrote: the metadata of the folder's manifest.

    Attributes:
        source: the input, as given.
        format: its format (``"detected"`` when :func:`~retrieval.data.load_interactions` chose).
        partitions: partition files.
        users, items, events: counts of the whole input.
        train_events: events in the training sequences.
        evaluated_users: users with a validation and a test target (3 events or more).
        has_time: whether the input has timestamps (else positions stand in for them).
        event_columns: the per-event columns besides ``items`` (``timestamp`` first).
        largest_partition_events: events of the largest partition (what a reader holds at most).
        users_per_row_group: users per Parquet row group.
    """

    source: str
    format: str
    partitions: int
    users: int
    items: int
    events: int
    train_events: int
    evaluated_users: int
    has_time: bool
    event_columns: list[str]
    largest_partition_events: int
    users_per_row_group: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prepare(
    path: str | Path,
    out: str | Path,
    format: str | None = None,
    partitions: int | None = None,
    events_per_partition: int = EVENTS_PER_PARTITION,
    users_per_row_group: int = USERS_PER_ROW_GROUP,
    batch_rows: int = BATCH_ROWS,
    overwrite: bool = False,
    progress: bool = True,
    *,
    columns: Mapping[str, str] | None = None,
    timestamp_unit: str = "s",
) -> PreparedSummary:
    """Converts interactions into the prepared layout (:mod:`retrieval.data.prepared`) at ``out``.

    Args:
        path: the input: anything :func:`~retrieval.data.loaders.load_interactions` reads, or (format
            ``dataset``) a folder of Parquet/CSV files, one such file, or a URI Arrow reads.
        out: the folder to write (local).
        format: one of :data:`FORMATS`; None = a folder without MovieLens or RecBole files, or a
            URI, is a ``dataset``, anything else is detected by
            :func:`~retrieval.data.loaders.load_interactions`.
        partitions: number of partition files; None = :func:`partitions_for` the input's events.
        events_per_partition: the partition size aimed at when ``partitions`` is None.
        users_per_row_group: users per Parquet row group (the readers' unit).
        batch_rows: rows per record batch read from a ``dataset`` input.
        overwrite: replace an existing ``out``.
        progress: show progress bars (on stderr).
        columns: how a table or RecBole input names its columns (our name -> its own,
            :func:`~retrieval.data.loaders.load_interactions`); in-memory formats only.
        timestamp_unit: how a table or RecBole input writes its times (``s``, ``ms``, ``iso``);
            in-memory formats only.

    Returns:
        What was written (the manifest's metadata).

    Raises:
        DataError: unreadable or malformed input, naming the file (and row or line).
        FileExistsError: ``out`` exists and ``overwrite`` is false.
    """
    format = _checked_format(path, format)
    _check_sizes(partitions, users_per_row_group, batch_rows)
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass overwrite to replace it)")
    # The input is read (and checked) before the artifact is started, for in-memory formats;
    # the dataset path is checked as it streams, inside the temporary folder.
    data = _read_in_memory(path, format, columns, timestamp_unit)
    meta: dict[str, Any] = {
        "source": str(path),
        "format": format or "detected",
        "users_per_row_group": users_per_row_group,
    }
    # write_artifact reads ``meta`` when the block ends: the counts are filled in before.
    with write_artifact(out, KIND, meta, overwrite=overwrite) as tmp:
        (tmp / SEQUENCES).mkdir()
        options = (events_per_partition, users_per_row_group, progress)
        if data is not None:
            meta.update(_prepare_in_memory(data, tmp, partitions, *options))
        else:
            meta.update(prepare_out_of_core(str(path), tmp, partitions, batch_rows, *options))
    return PreparedSummary(**meta)


def prepare_dataset(path: str | Path, out: str | Path, **options: Any) -> PreparedSummary:
    """:func:`prepare` (``options`` are its keyword arguments) of a raw table read out of core
    (format ``dataset``), whatever its path."""
    return prepare(path, out, "dataset", **options)


def _checked_format(path: str | Path, format: str | None) -> str | None:
    """``format``, else the one :func:`_detect_format` sees (``None``: left to the loaders);
    refuses an unknown one."""
    if format is None:
        format = _detect_format(path)
    if format is not None and format not in FORMATS:
        raise DataError(f"unknown data format {format!r}; expected one of {', '.join(FORMATS)}")
    return format


def _check_sizes(partitions: int | None, users_per_row_group: int, batch_rows: int) -> None:
    """Refuses a partition count outside ``1..MAX_PARTITIONS`` or sizes that are not positive."""
    if partitions is not None and not 1 <= partitions <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be in 1..{MAX_PARTITIONS}, got {partitions}")
    if users_per_row_group < 1 or batch_rows < 1:
        raise ValueError("users_per_row_group and batch_rows must be positive")


def _read_in_memory(
    path: str | Path, format: str | None, columns: Mapping[str, str] | None, timestamp_unit: str
) -> SequenceData | None:
    """The input's sequences, read in memory; ``None`` for a ``dataset`` (read out of core), which
    takes no column mapping or timestamp unit yet."""
    if format == "dataset" and (columns or timestamp_unit != "s"):
        raise DataError(
            f"{path}: a column mapping or timestamp unit is not read out of core (format dataset) "
            "yet: name the columns user, item, timestamp (Unix seconds), or prepare a single file"
        )
    if format == "dataset":
        return None
    loaded = load_interactions(path, format, columns=columns, timestamp_unit=timestamp_unit)
    return build_sequences(loaded)


def _detect_format(path: str | Path) -> str | None:
    text = str(path)
    if "://" in text:
        return "dataset"
    folder = Path(text)
    known = ("u.data", "ratings.dat", f"{folder.name}.inter")  # MovieLens and RecBole folders
    if folder.is_dir() and not any((folder / name).is_file() for name in known):
        return "dataset"
    return None  # load_interactions detects it (or says why it cannot)


def _prepare_in_memory(
    data: SequenceData,
    tmp: Path,
    partitions: int | None,
    events_per_partition: int,
    users_per_row_group: int,
    progress: bool,
) -> dict[str, Any]:
    """Writes sequences built in memory by :func:`~retrieval.data.interactions.build_sequences`."""
    split = leave_one_out(data)
    lengths = np.array([len(s) for s in data.sequences], np.int64)
    partitions = partitions or partitions_for(int(lengths.sum()), events_per_partition)
    check_event_columns(list(data.event_columns), "the input")
    types = {
        name: pa.array(np.concatenate(per_user[:1]) if per_user else []).type
        for name, per_user in data.event_columns.items()
    }
    part = partition_of(list(data.users), partitions)
    counts = ItemCounts(data.vocab.num_embeddings)
    largest = 0
    for p in tqdm(range(partitions), desc="partitions", unit="part", disable=not progress):
        members = np.flatnonzero(part == p)

        def flat(per_user: Sequence[np.ndarray], members: np.ndarray = members) -> np.ndarray:
            return np.concatenate([per_user[u] for u in members] or [per_user[0][:0]])  # keeps the dtype

        items = flat(data.sequences)
        columns = {n: pa.array(flat(v), types[n]) for n, v in data.event_columns.items()}
        train_len = np.array([len(split.train[u]) for u in members], np.int64)
        table = user_table(
            pa.array([data.users[u] for u in members], pa.string()),
            lengths[members],
            items,
            columns,
            train_len,
        )
        pq.write_table(table, part_path(tmp, p), row_group_size=users_per_row_group)
        counts.add(items, lengths[members], train_len)
        largest = max(largest, len(items))
    data.vocab.save(tmp / VOCAB_FILE)
    if data.item_attributes:
        attributes = {data.vocab.ids[i - 1]: list(a) for i, a in sorted(data.item_attributes.items())}
        (tmp / ATTRIBUTES_FILE).write_text(json.dumps(attributes, ensure_ascii=False))
    counts.write(tmp / COUNTS_FILE)
    train_lengths = np.array([len(s) for s in split.train], np.int64)
    return {
        "partitions": partitions,
        "users": len(data.users),
        "items": len(data.vocab),
        "events": int(lengths.sum()),
        "train_events": int(train_lengths.sum()),
        "evaluated_users": len(split.test_targets),
        "has_time": data.has_time,
        "event_columns": list(data.event_columns),
        "largest_partition_events": largest,
    }
