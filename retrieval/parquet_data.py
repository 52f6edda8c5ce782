"""Interaction data larger than memory: a partitioned Parquet layout, its writer and its readers.

:func:`prepare` converts an input into the layout below; :mod:`retrieval.streaming` streams its
training examples into ``tf.data`` and :func:`iter_eval_batches` its evaluation users. Inputs:

* every format :func:`retrieval.data.load_interactions` reads (``movielens``, ``s3rec``,
  ``table``): loaded in memory and put through :func:`~retrieval.data.build_sequences` and
  :func:`~retrieval.data.leave_one_out` unchanged;
* ``dataset``: a raw ``user, item, timestamp`` table too large for memory (+ optional ``title``
  and side columns such as ``rating``): a folder of Parquet (or CSV) files, one such file, or a
  URI of any file system Arrow supports (``s3://…``, ``gs://…``, ``hdfs://…``), read out of core
  by :func:`prepare_dataset` with the same result as the in-memory path.

Layout of the prepared folder ``DIR`` (an artifact of kind ``prepared-data``: written to a
temporary folder and renamed into place, ``manifest.json`` holds the metadata and every file's
SHA-256)::

    manifest.json            kind "prepared-data", source, format, partitions, users, items, events,
                             train_events, has_time, event_columns, users_per_row_group,
                             largest_partition_events, checksums
    vocab.json               ItemVocab.save: external ids, dense id i + 1 = ids[i] (0 = padding), titles
    item_attributes.json     external item id -> attributes (only when the input has them)
    item_counts.parquet      one row per dense id 0..n (row 0 = padding), int64 columns:
                             events (all), train (in training sequences), first (training
                             sequences starting with it)
    sequences/part-00000.parquet … part-<N-1>.parquet, one row per user:
        user          string       external user id
        items         list<int32>  dense item ids, oldest first: the whole sequence, held-out items too
        timestamp     list<int64>  per event (0-based positions when has_time is false)
        <column>      list<…>      every other event column of the input (e.g. rating), per event
        train_len     int32        training events: len when len < 3, else len - 2
        valid_target  int32        items[len - 2] when len >= 3, else 0 (the user is not evaluated)
        test_target   int32        items[len - 1] when len >= 3, else 0
      in row groups of at most ``users_per_row_group`` users: the readers' unit of memory.

The split is leave-one-out (:class:`~retrieval.data.LeaveOneOut`): ``items[:train_len]`` trains,
validation reads ``items[:len - 2]`` -> ``valid_target``, test ``items[:len - 1]`` -> ``test_target``.

A user's partition is :func:`partition_of`: ``pandas.util.hash_array(ids, categorize=False) %
partitions`` over the ids as text (SipHash with pandas' fixed key: the same on every machine).
Within a file users come in order of first appearance in the input (for a folder: its files
sorted by path, each file's rows in order). Item numbering and event
order are those of :func:`~retrieval.data.build_sequences`: items by first appearance after a
stable sort by timestamp, each user's events by timestamp, ties in input order.

Memory of the ``dataset`` path: pass 1 scans the input in record batches of ``batch_rows`` rows
(default 256k; ~300 bytes per row while a batch is cast, hashed and split), keeping per item its
first ``(timestamp, row)`` (~100 bytes per item), and appends every batch's rows to its users'
partition staging file; pass 2 loads one partition at a time, numbers its items, sorts and
writes it (~200 bytes per event). Peak memory is therefore set by the largest partition, not by
the input, and the partition count is chosen from the input's size (``events_per_partition``
events each, default 2M; measured: 480-525 MB peak RSS with 1.7M-event partitions, imports
included). The assumption: a partition fits in memory, i.e. there are many users and none of
them alone outgrows memory.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from tqdm import tqdm

from retrieval.artifacts import FORMAT_VERSION, MANIFEST, ArtifactError, write_artifact
from retrieval.data import FORMATS as IN_MEMORY_FORMATS
from retrieval.data import (
    REQUIRED_COLUMNS,
    DataError,
    SequenceData,
    build_sequences,
    leave_one_out,
    load_interactions,
)
from retrieval.features import SideVocab, action_column, build_side_vocab, encode_events
from retrieval.vocab import ItemVocab

log = logging.getLogger(__name__)

KIND = "prepared-data"
FORMATS = (*IN_MEMORY_FORMATS, "dataset")
VOCAB_FILE = "vocab.json"
ATTRIBUTES_FILE = "item_attributes.json"
COUNTS_FILE = "item_counts.parquet"
SEQUENCES = "sequences"
SPLITS = ("valid", "test")
SPLIT_COLUMNS = ("train_len", "valid_target", "test_target")
RESERVED_COLUMNS = ("user", "items", *SPLIT_COLUMNS)
"""Layout columns: an input event column may not have one of these names."""

EVENTS_PER_PARTITION = 2_000_000
USERS_PER_ROW_GROUP = 1024
BATCH_ROWS = 1 << 18
MAX_PARTITIONS = 4096
_ROW = "__row"  # staging only: the event's position in the input, the tie-breaker of every sort


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


# --- writing ---------------------------------------------------------------------------------


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
) -> dict[str, Any]:
    """Converts interactions into the prepared layout (module docstring) at ``out``.

    Args:
        path: the input: anything :func:`~retrieval.data.load_interactions` reads, or (format
            ``dataset``) a folder of Parquet/CSV files, one such file, or a URI Arrow reads.
        out: the folder to write (local).
        format: one of :data:`FORMATS`; None = a folder without MovieLens files or a URI is a
            ``dataset``, anything else is detected by :func:`~retrieval.data.load_interactions`.
        partitions: number of partition files; None = :func:`partitions_for` the input's events.
        events_per_partition: the partition size aimed at when ``partitions`` is None.
        users_per_row_group: users per Parquet row group (the readers' unit).
        batch_rows: rows per record batch read from a ``dataset`` input.
        overwrite: replace an existing ``out``.
        progress: show progress bars (on stderr).

    Returns:
        The manifest's metadata (counts, partitions, source, …).

    Raises:
        DataError: unreadable or malformed input, naming the file (and row or line).
        FileExistsError: ``out`` exists and ``overwrite`` is false.
    """
    if format is None:
        format = _detect_format(path)
    if format is not None and format not in FORMATS:
        raise DataError(f"unknown data format {format!r}; expected one of {', '.join(FORMATS)}")
    if partitions is not None and not 1 <= partitions <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be in 1..{MAX_PARTITIONS}, got {partitions}")
    if users_per_row_group < 1 or batch_rows < 1:
        raise ValueError("users_per_row_group and batch_rows must be positive")
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass overwrite to replace it)")
    # The input is read (and checked) before the artifact is started, for in-memory formats;
    # the dataset path is checked as it streams, inside the temporary folder.
    data = build_sequences(load_interactions(path, format)) if format != "dataset" else None
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
            meta.update(_prepare_dataset(str(path), tmp, partitions, batch_rows, *options))
    return meta


def prepare_dataset(
    path: str | Path,
    out: str | Path,
    partitions: int | None = None,
    events_per_partition: int = EVENTS_PER_PARTITION,
    users_per_row_group: int = USERS_PER_ROW_GROUP,
    batch_rows: int = BATCH_ROWS,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """:func:`prepare` of a raw table read out of core (format ``dataset``), whatever its path."""
    return prepare(
        path, out, "dataset", partitions, events_per_partition, users_per_row_group, batch_rows,
        overwrite, progress,
    )  # fmt: skip


def _detect_format(path: str | Path) -> str | None:
    text = str(path)
    if "://" in text:
        return "dataset"
    folder = Path(text)
    if folder.is_dir() and not ((folder / "u.data").is_file() or (folder / "ratings.dat").is_file()):
        return "dataset"
    return None  # load_interactions detects it (or says why it cannot)


class _Counts:
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


def _user_table(
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


def _part_path(root: Path, p: int) -> Path:
    return root / SEQUENCES / f"part-{p:05d}.parquet"


def _check_event_columns(names: Sequence[str], where: str) -> None:
    clash = [n for n in names if n in RESERVED_COLUMNS or n == _ROW]
    if clash:
        raise DataError(
            f"{where}: event column(s) {', '.join(clash)} clash with the prepared layout's columns"
        )


def _prepare_in_memory(
    data: SequenceData,
    tmp: Path,
    partitions: int | None,
    events_per_partition: int,
    users_per_row_group: int,
    progress: bool,
) -> dict[str, Any]:
    """Writes sequences built in memory by :func:`~retrieval.data.build_sequences`."""
    split = leave_one_out(data)
    lengths = np.array([len(s) for s in data.sequences], np.int64)
    partitions = partitions or partitions_for(int(lengths.sum()), events_per_partition)
    _check_event_columns(list(data.event_columns), "the input")
    types = {
        name: pa.array(np.concatenate(per_user[:1]) if per_user else []).type
        for name, per_user in data.event_columns.items()
    }
    part = partition_of(list(data.users), partitions)
    counts = _Counts(data.vocab.num_embeddings)
    largest = 0
    for p in tqdm(range(partitions), desc="partitions", unit="part", disable=not progress):
        members = np.flatnonzero(part == p)

        def flat(per_user: Sequence[np.ndarray], members: np.ndarray = members) -> np.ndarray:
            return np.concatenate([per_user[u] for u in members] or [per_user[0][:0]])  # keeps the dtype

        items = flat(data.sequences)
        columns = {n: pa.array(flat(v), types[n]) for n, v in data.event_columns.items()}
        train_len = np.array([len(split.train[u]) for u in members], np.int64)
        table = _user_table(
            pa.array([data.users[u] for u in members], pa.string()),
            lengths[members],
            items,
            columns,
            train_len,
        )
        pq.write_table(table, _part_path(tmp, p), row_group_size=users_per_row_group)
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


# --- the out-of-core path ---------------------------------------------------------------------


def resolve(path: str | Path, filesystem: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """A path or URI -> (Arrow file system, path inside it); a given ``filesystem`` is used as is."""
    if filesystem is not None:
        return filesystem, str(path)
    text = str(path)
    if "://" in text:
        fs, inner = pafs.FileSystem.from_uri(text)
        return fs, inner
    return pafs.LocalFileSystem(), str(Path(text).resolve())


def _input_files(path: str) -> tuple[pafs.FileSystem, list[str], str]:
    """The data files of a ``dataset`` input (sorted by path: the input order) and their format."""
    fs, inner = resolve(path)
    info = fs.get_file_info(inner)
    if info.type == pafs.FileType.NotFound:
        raise DataError(f"{path}: no such file or folder")
    if info.type == pafs.FileType.File:
        files = [inner]
    else:
        found = fs.get_file_info(pafs.FileSelector(inner, recursive=True))
        files = sorted(
            f.path
            for f in found
            if f.type == pafs.FileType.File
            and not any(part.startswith((".", "_")) for part in f.path[len(inner) :].split("/") if part)
        )
    suffixes = {Path(f).suffix.lower() for f in files}
    if not files or not suffixes <= {".parquet", ".csv"} or len(suffixes) != 1:
        found_text = ", ".join(sorted(suffixes)) or "no files"
        raise DataError(f"{path}: expected .parquet or .csv files (one kind), found {found_text}")
    return fs, files, suffixes.pop().lstrip(".")


def _file_format(kind: str) -> ds.FileFormat:
    if kind == "parquet":
        return ds.ParquetFileFormat()
    # Ids stay text as written ("007" is not 7), as retrieval.data.load_table reads them.
    text = {"user": pa.string(), "item": pa.string(), "title": pa.string()}
    convert = pacsv.ConvertOptions(column_types=text)
    return ds.CsvFileFormat(convert_options=convert)


def _count_rows(fs: pafs.FileSystem, files: list[str], kind: str) -> int | None:
    """Rows of Parquet inputs (from their footers); None for CSV (it would take a full read)."""
    if kind != "parquet":
        return None
    try:
        return int(ds.dataset(files, filesystem=fs, format="parquet").count_rows())
    except (pa.ArrowInvalid, OSError):
        return None  # the scan below names the unreadable file


def _first_row(mask: pa.Array | pa.ChunkedArray) -> int:
    return int(np.argmax(np.asarray(mask.to_numpy(zero_copy_only=False), bool)))


def _id_text(values: pa.ChunkedArray, name: str, where: Any) -> pa.ChunkedArray:
    """A user or item id column as trimmed text; empty, missing or non-scalar ids are refused."""
    kind = values.type
    if pa.types.is_dictionary(kind):
        values, kind = values.cast(kind.value_type), kind.value_type
    if pa.types.is_integer(kind):
        text = values.cast(pa.string())
    elif pa.types.is_floating(kind):  # integer ids with gaps read as floats: "12.0" -> "12"
        real = values.to_numpy(zero_copy_only=False).astype(np.float64)
        if np.isnan(real).any():
            raise DataError(f"{where(int(np.argmax(np.isnan(real))))}: empty {name} id")
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(real) | (real % 1 != 0) | (np.abs(real) >= 2.0**63)
        if bad.any():
            row = int(np.argmax(bad))
            raise DataError(f"{where(row)}: {name} id {float(real[row])!r} is not a whole number")
        text = values.cast(pa.int64()).cast(pa.string())
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = pc.utf8_trim_whitespace(values.cast(pa.string()))
    else:
        raise DataError(f"{where(0)}: {name} ids are of type {kind}, expected text or integers")
    bad = pc.or_kleene(pc.is_null(text), pc.equal(pc.fill_null(text, ""), ""))
    if pc.any(bad).as_py():
        raise DataError(f"{where(_first_row(bad))}: empty {name} id")
    return text


def _integer_times(values: pa.ChunkedArray, where: Any) -> pa.Array:
    """Timestamps as int64 (Arrow timestamps become Unix seconds, naive ones taken as UTC)."""
    kind = values.type
    if pa.types.is_timestamp(kind):
        nanos = values.cast(pa.timestamp("ns", kind.tz)).cast(pa.int64()).to_numpy(zero_copy_only=False)
        if values.null_count:
            raise DataError(f"{where(_first_row(pc.is_null(values)))}: timestamp is missing")
        return pa.array(np.floor_divide(nanos, 10**9))
    if values.null_count:
        raise DataError(f"{where(_first_row(pc.is_null(values)))}: timestamp is missing")
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_string(kind):
        try:
            return values.cast(pa.int64()).combine_chunks()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # find the value at fault below
        for row, value in enumerate(values.to_pylist()):
            try:
                pa.array([value]).cast(pa.int64())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise DataError(
                    f"{where(row)}: timestamp {value!r} is not an integer (or is outside the int64 range)"
                ) from None
    raise DataError(f"{where(0)}: timestamps are of type {kind}, expected integers or Arrow timestamps")


class _Firsts:
    """A fold over the input keeping, per item, the row with the smallest ``keys`` (and the
    row's other columns).

    Reduced batches wait until they outnumber the kept rows and are then folded in together, so
    the kept table (one row per item) is sorted O(log batches) times, not once per batch.
    """

    fold_rows = 1 << 20
    """Reduced rows that may wait before a fold (or as many as are kept)."""

    def __init__(self, keys: Sequence[str]) -> None:
        self.keys = [(k, "ascending") for k in keys]
        self.kept: pa.Table | None = None
        self.pending: list[pa.Table] = []
        self.pending_rows = 0

    def _reduce(self, tables: list[pa.Table]) -> pa.Table:
        # Sorted by the keys, an ordered group-by's "first" is the minimum (the groups
        # themselves do not come out in that order).
        ordered = pa.concat_tables(tables).sort_by(self.keys)
        names = [c for c in ordered.column_names if c != "item"]
        folded = ordered.group_by("item", use_threads=False).aggregate([(c, "first") for c in names])
        return pa.table({"item": folded["item"], **{c: folded[f"{c}_first"] for c in names}})

    def add(self, table: pa.Table) -> None:
        reduced = self._reduce([table])
        self.pending.append(reduced)
        self.pending_rows += reduced.num_rows
        if self.pending_rows >= max(self.fold_rows, 0 if self.kept is None else self.kept.num_rows):
            self._fold()

    def _fold(self) -> None:
        if self.pending:
            self.kept = self._reduce([*([self.kept] if self.kept is not None else []), *self.pending])
            self.pending, self.pending_rows = [], 0

    def result(self) -> pa.Table | None:
        """One row per item seen, in order of ``keys``."""
        self._fold()
        return None if self.kept is None else self.kept.sort_by(self.keys)


def _prepare_dataset(
    path: str,
    tmp: Path,
    partitions: int | None,
    batch_rows: int,
    events_per_partition: int,
    users_per_row_group: int,
    progress: bool,
) -> dict[str, Any]:
    """The out-of-core path: pass 1 (scan, item firsts, staging by partition), pass 2 (per partition)."""
    fs, files, kind = _input_files(path)
    total = _count_rows(fs, files, kind)
    if partitions is None:
        estimate = total  # CSV: about 20 bytes per row
        if estimate is None:
            estimate = sum(info.size or 0 for info in fs.get_file_info(files)) // 20
        partitions = partitions_for(estimate, events_per_partition)
    staging = tmp / "staging"
    staging.mkdir()
    writers: dict[int, pq.ParquetWriter] = {}
    schema: pa.Schema | None = None
    # Per item its first (timestamp, row), the vocabulary order; and its first non-empty title.
    firsts, first_titles = _Firsts(["t", _ROW]), _Firsts([_ROW])
    side: list[str] | None = None
    has_titles = False
    row = 0
    bar = tqdm(total=total, desc="pass 1: scan", unit="row", unit_scale=True, disable=not progress)
    try:
        for file in files:
            shown = file if len(files) > 1 or "://" not in path else path
            try:
                dataset = ds.dataset(file, filesystem=fs, format=_file_format(kind))
            except (pa.ArrowInvalid, OSError) as e:
                raise DataError(f"{shown}: not a readable {kind} file: {e}") from None
            names = dataset.schema.names
            missing = [c for c in REQUIRED_COLUMNS if c not in names]
            if missing:
                raise DataError(f"{shown}: missing column(s) {', '.join(missing)}; found: {', '.join(names)}")
            columns = [c for c in names if c not in (*REQUIRED_COLUMNS, "title")]
            if side is None:
                side, has_titles = columns, "title" in names
                _check_event_columns(side, shown)
            elif columns != side or ("title" in names) != has_titles:
                raise DataError(
                    f"{shown}: columns {', '.join(names)} differ from the first file's "
                    f"({', '.join([*REQUIRED_COLUMNS, *(['title'] if has_titles else []), *side])})"
                )
            start = 0
            try:
                for batch in dataset.to_batches(batch_size=batch_rows):
                    if not batch.num_rows:
                        continue
                    table = pa.Table.from_batches([batch])

                    def where(r: int, start: int = start, shown: str = shown) -> str:
                        return f"{shown}, row {start + r + 1}"

                    users = _id_text(table["user"], "user", where)
                    items = _id_text(table["item"], "item", where)
                    times = _integer_times(table["timestamp"], where)
                    rows = np.arange(row, row + table.num_rows, dtype=np.int64)
                    firsts.add(pa.table({"item": items, "t": times, _ROW: rows}))
                    if has_titles:
                        title = table["title"].cast(pa.string())
                        named = pc.fill_null(pc.not_equal(pc.utf8_trim_whitespace(title), ""), False)
                        first_titles.add(pa.table({"item": items, _ROW: rows, "title": title}).filter(named))
                    staged = pa.table(
                        {"user": users, "item": items, "timestamp": times, _ROW: rows}
                        | {c: table[c] for c in side}
                    )
                    if schema is None:
                        schema = staged.schema
                    try:
                        staged = staged.cast(schema)
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                        raise DataError(f"{shown}: column types differ from the first batch's: {e}") from None
                    _stage(staged, users, partitions, staging, writers)
                    start += table.num_rows
                    row += table.num_rows
                    bar.update(table.num_rows)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as e:
                raise DataError(f"{shown}: not a readable {kind} file: {e}") from None
    finally:
        bar.close()
        for writer in writers.values():
            writer.close()
    ordered = firsts.result()
    if ordered is None or schema is None or side is None:
        raise DataError(f"{path}: no rows")
    ids = ordered["item"].combine_chunks()
    del ordered, firsts  # the ids are kept for the lookups below
    titles = None
    if has_titles:
        titled = first_titles.result()
        if titled is not None:
            titles = dict(zip(titled["item"].to_pylist(), titled["title"].to_pylist(), strict=True))
        else:
            titles = {}
    vocab = ItemVocab.from_ids(ids.to_pylist(), titles)
    vocab.save(tmp / VOCAB_FILE)

    counts = _Counts(vocab.num_embeddings)
    users_total = events = train_events = evaluated = largest = 0
    for p in tqdm(range(partitions), desc="pass 2: partitions", unit="part", disable=not progress):
        source = staging / f"{p:05d}.parquet"
        part = pq.read_table(source) if source.exists() else schema.empty_table()
        table, lengths, items, train_len = _sequences_of_partition(part, ids, side)
        del part
        pq.write_table(table, _part_path(tmp, p), row_group_size=users_per_row_group)
        counts.add(items, lengths, train_len)
        source.unlink(missing_ok=True)
        users_total += len(lengths)
        events += len(items)
        train_events += int(train_len.sum())
        evaluated += int((lengths >= 3).sum())
        largest = max(largest, len(items))
    staging.rmdir()
    counts.write(tmp / COUNTS_FILE)
    return {
        "partitions": partitions,
        "users": users_total,
        "items": len(vocab),
        "events": events,
        "train_events": train_events,
        "evaluated_users": evaluated,
        "has_time": True,
        "event_columns": ["timestamp", *side],
        "largest_partition_events": largest,
    }


def _stage(
    table: pa.Table,
    users: pa.ChunkedArray,
    partitions: int,
    staging: Path,
    writers: dict[int, pq.ParquetWriter],
) -> None:
    """Appends each row of ``table`` to its user's partition staging file (order kept)."""
    part = partition_of(users.to_numpy(zero_copy_only=False), partitions)
    order = np.argsort(part, kind="stable")
    bounds = np.searchsorted(part[order], np.arange(partitions + 1))
    grouped = table.take(pa.array(order))
    for p in np.flatnonzero(np.diff(bounds)).tolist():
        if p not in writers:
            writers[p] = pq.ParquetWriter(staging / f"{p:05d}.parquet", table.schema)
        writers[p].write_table(grouped.slice(bounds[p], bounds[p + 1] - bounds[p]))


def _sequences_of_partition(
    part: pa.Table, ids: pa.Array, side: Sequence[str]
) -> tuple[pa.Table, np.ndarray, np.ndarray, np.ndarray]:
    """A staged partition (rows in input order) -> its layout table, events per user, the flat
    dense item ids and the training lengths."""
    encoded = pc.dictionary_encode(part["user"].combine_chunks())  # users by first appearance
    codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), np.int64)
    times = part["timestamp"].to_numpy()
    order = np.lexsort((times, codes))  # stable: ties stay in input order, as in build_sequences
    dense = pc.index_in(part["item"], value_set=ids).to_numpy(zero_copy_only=False)
    items = (np.asarray(dense, np.int64) + 1)[order]
    lengths = np.bincount(codes, minlength=len(encoded.dictionary))
    train_len = np.where(lengths < 3, lengths, lengths - 2)
    columns = {"timestamp": pa.array(times[order])}
    take = pa.array(order)
    for name in side:
        columns[name] = part[name].take(take).combine_chunks()
    table = _user_table(encoded.dictionary, lengths, items, columns, train_len)
    return table, lengths, items, train_len


# --- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """An opened prepared folder.

    Attributes:
        filesystem: the Arrow file system holding it.
        root: its path inside ``filesystem``.
        meta: the manifest (see the module docstring).
        files: the partition files, in partition order.
    """

    filesystem: pafs.FileSystem
    root: str
    meta: dict[str, Any]
    files: tuple[str, ...]

    def path(self, name: str) -> str:
        """Where the folder's file ``name`` (e.g. ``vocab.json``) is in :attr:`filesystem`."""
        return f"{self.root}/{name}" if self.root else name

    def read_bytes(self, name: str) -> bytes:
        """The bytes of the folder's file ``name``."""
        with self.filesystem.open_input_stream(self.path(name)) as f:
            return bytes(f.read())

    @property
    def event_columns(self) -> tuple[str, ...]:
        """The per-event list columns besides ``items`` (``timestamp`` first)."""
        return tuple(self.meta["event_columns"])


def open_prepared(folder: str | Path | Prepared, filesystem: pafs.FileSystem | None = None) -> Prepared:
    """Opens a prepared folder: a local path, a URI (``s3://bucket/prepared``) or a path in ``filesystem``.

    Raises:
        ArtifactError: not a prepared folder (no or another manifest), or a partition file missing.
    """
    if isinstance(folder, Prepared):
        return folder
    fs, root = resolve(folder, filesystem)
    root = root.rstrip("/")
    where = Prepared(fs, root, {}, ())
    try:
        manifest = json.loads(where.read_bytes(MANIFEST))
    except FileNotFoundError:
        raise ArtifactError(f"{folder} is not a {KIND} folder: {MANIFEST} not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{folder}/{MANIFEST} is not valid JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        found = manifest.get("kind") if isinstance(manifest, dict) else None
        raise ArtifactError(f"{folder} holds a {found!r} artifact, expected {KIND!r}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(
            f"{folder}: format version {manifest.get('format_version')!r} is not {FORMAT_VERSION}"
        )
    files = tuple(where.path(f"{SEQUENCES}/part-{p:05d}.parquet") for p in range(int(manifest["partitions"])))
    missing = [
        f
        for f, info in zip(files, fs.get_file_info(list(files)), strict=True)
        if info.type != pafs.FileType.File
    ]
    if missing:
        raise ArtifactError(f"{folder} is incomplete: {missing[0]} is missing")
    return Prepared(fs, root, manifest, files)


def is_prepared(path: str | Path) -> bool:
    """Whether ``path`` (a local path or a URI) is a prepared folder: its manifest's kind is
    :data:`KIND` (what format detection asks; :func:`open_prepared` checks the rest)."""
    try:
        fs, root = resolve(path)
        with fs.open_input_stream(f"{root.rstrip('/')}/{MANIFEST}") as f:
            manifest = json.loads(f.read())
    except (OSError, ValueError):  # no such file, not a folder, not JSON, not a URI Arrow reads
        return False
    return isinstance(manifest, dict) and manifest.get("kind") == KIND


def read_vocab(folder: str | Path | Prepared) -> ItemVocab:
    """The prepared folder's item vocabulary (``vocab.json``, :meth:`ItemVocab.save`'s format)."""
    payload = json.loads(open_prepared(folder).read_bytes(VOCAB_FILE))
    titles = payload.get("titles")
    return ItemVocab(tuple(payload["ids"]), None if titles is None else tuple(titles))


def read_item_attributes(folder: str | Path | Prepared) -> dict[str, list[str]] | None:
    """External item id -> attributes, or None when the data has none."""
    prepared = open_prepared(folder)
    try:
        payload: dict[str, list[str]] = json.loads(prepared.read_bytes(ATTRIBUTES_FILE))
    except FileNotFoundError:
        return None
    return payload


def item_counts(folder: str | Path | Prepared, which: str = "train") -> np.ndarray:
    """Per dense id, int64 ``[num_embeddings]``: ``events``, ``train`` (events in the training
    sequences, what the candidate sampler counts) or ``first``."""
    prepared = open_prepared(folder)
    table = pq.read_table(prepared.path(COUNTS_FILE), filesystem=prepared.filesystem, columns=[which])
    return np.asarray(table[which].to_numpy(), np.int64)


def target_counts(folder: str | Path | Prepared, objective: str) -> np.ndarray:
    """How often each dense id is a training target under ``objective``, int64 ``[num_embeddings]``.

    ``last`` and ``all_positions`` target every training event but each user's first once,
    ``cloze`` every training event (before masking), so no pass over the examples is needed;
    ``counts / counts.sum()`` is :func:`retrieval.training_data.target_probabilities` of the targets.
    """
    counts = item_counts(folder, "train")
    if objective in ("last", "all_positions"):
        return counts - item_counts(folder, "first")
    if objective == "cloze":
        return counts
    raise ValueError(f"unknown objective {objective!r}")


def count_examples(folder: str | Path | Prepared, objective: str, max_len: int) -> int:
    """Training examples one epoch of :func:`retrieval.examples.make_examples` gives (reads one column).

    Per training sequence of ``n`` events: ``last`` n - 1; ``all_positions`` a window of
    ``max_len`` targets ending at the last event and every ``max_len`` back while >= 2 events
    remain, ``(n - 2) // max_len + 1``; ``cloze`` the same down to 1 event, ``(n - 1) // max_len + 1``.
    """
    least = {"last": None, "all_positions": 2, "cloze": 1}
    if objective not in least:
        raise ValueError(f"unknown objective {objective!r}")
    total = 0
    for table in iter_pieces(folder, ["train_len"]):
        n = table["train_len"].to_numpy().astype(np.int64)
        low = least[objective]
        if low is None:
            total += int(np.maximum(n - 1, 0).sum())
        else:
            total += int(np.where(n >= low, (n - low) // max_len + 1, 0).sum())
    return total


def _read_piece(fragment: ds.Fragment, columns: Sequence[str]) -> pa.Table:
    """One row group's columns (the unit of memory of every reader; tests count these calls)."""
    return fragment.to_table(columns=list(columns))


def iter_pieces(
    folder: str | Path | Prepared, columns: Sequence[str], rng: np.random.Generator | None = None
) -> Iterator[pa.Table]:
    """Every row group of every partition file, one at a time (``columns`` only): in file order,
    or in a random order drawn from ``rng``."""
    prepared = open_prepared(folder)
    dataset = ds.dataset(list(prepared.files), filesystem=prepared.filesystem, format="parquet")
    pieces = [piece for fragment in dataset.get_fragments() for piece in fragment.split_by_row_group()]
    order = rng.permutation(len(pieces)) if rng is not None else range(len(pieces))
    for i in order:
        yield _read_piece(pieces[i], columns)


def _lists(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A list column -> (flat values, offsets ``[U + 1]``)."""
    column = table[name].combine_chunks()
    flat = column.flatten().to_numpy(zero_copy_only=False)
    offsets = column.offsets.to_numpy() - column.offsets[0].as_py()
    return flat, offsets


def user_sequences(table: pa.Table) -> list[np.ndarray]:
    """A piece's ``items`` column -> per user, int64 ``[len]`` dense ids."""
    flat, offsets = _lists(table, "items")
    flat = flat.astype(np.int64)
    return [flat[a:b] for a, b in itertools.pairwise(offsets)]


def side_columns(side: SideVocab | None, event_columns: Sequence[str]) -> list[str]:
    """The event columns the encoding of ``side``'s per-event features reads."""
    if side is None or not side.event_features:
        return []
    needed = []
    if "gap_prev" in side.event_features:
        needed.append("timestamp")
    column = action_column(list(event_columns))
    if "action" in side.event_features and column is not None:
        needed.append(column)
    return needed


def encode_side(table: pa.Table, side: SideVocab | None) -> dict[str, list[np.ndarray]]:
    """Per-event side inputs of a piece's users, ``{name: per user int32 [len]}``
    (:func:`retrieval.features.encode_events` of each whole sequence)."""
    if side is None or not side.event_features:
        return {}
    names = table.column_names
    column = action_column([n for n in names if n not in RESERVED_COLUMNS])
    times = _lists(table, "timestamp") if "timestamp" in names else None
    actions = _lists(table, column) if column is not None else None
    out: dict[str, list[np.ndarray]] = {name: [] for name in side.event_features}
    for u in range(table.num_rows):
        t = None if times is None else times[0][times[1][u] : times[1][u + 1]]
        a = None if actions is None else [str(v) for v in actions[0][actions[1][u] : actions[1][u + 1]]]
        for name, values in encode_events(side, t, a).items():
            out[name].append(values)
    return out


def side_vocab(folder: str | Path | Prepared, features: Sequence[str]) -> SideVocab:
    """:func:`retrieval.features.build_side_vocab` of a prepared folder (one pass over the action
    column when ``action`` is asked for).

    Raises:
        ValueError: the data lacks what a feature needs.
    """
    prepared = open_prepared(folder)
    columns = list(prepared.event_columns)
    column = action_column(columns)
    values: dict[str, tuple[np.ndarray, ...]] = {c: () for c in columns}
    if "action" in features and column is not None:
        seen: set[str] = set()
        for table in iter_pieces(prepared, [column]):
            seen |= {str(v) for v in pc.unique(pc.list_flatten(table[column])).to_pylist()}
        values[column] = (np.array(sorted(seen), dtype=object),)
    attributes = None
    external = read_item_attributes(prepared) if "attributes" in features else None
    if external:
        vocab = read_vocab(prepared)
        dense = vocab.lookup(list(external))
        attributes = {int(i): tuple(a) for i, a in zip(dense, external.values(), strict=True) if i}
    # build_side_vocab reads only these fields: the vocabularies come out exactly as in memory.
    summary = SequenceData(
        ItemVocab(()), (), (), attributes, values, bool(prepared.meta.get("has_time", True))
    )
    return build_side_vocab(summary, features)


@dataclass(frozen=True)
class EvalBatch:
    """Evaluation users of one split, a batch at a time (:class:`~retrieval.data.LeaveOneOut` rows).

    Attributes:
        users: external user ids ``[B]``.
        histories: per user, int64 dense ids (the whole history, oldest first).
        targets: int64 ``[B]``.
        features: side inputs per user cut to the history (empty without side features).
    """

    users: tuple[str, ...]
    histories: tuple[np.ndarray, ...]
    targets: np.ndarray
    features: dict[str, list[np.ndarray]]


def iter_eval_batches(
    folder: str | Path | Prepared, split: str, batch_size: int = 1024, side: SideVocab | None = None
) -> Iterator[EvalBatch]:
    """The ``valid`` or ``test`` users (``len >= 3``) in batches of ``batch_size``, in file order;
    memory: one row group and one batch.

    Metrics averaged over users combine across batches weighted by ``len(batch.targets)``.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    prepared = open_prepared(folder)
    back = 2 if split == "valid" else 1
    columns = ["user", "items", *side_columns(side, prepared.event_columns)]
    pending: list[EvalBatch] = []
    size = 0
    for table in iter_pieces(prepared, columns):
        sequences = user_sequences(table)
        keep = [u for u, s in enumerate(sequences) if len(s) >= 3]
        if not keep:
            continue
        encoded = encode_side(table, side)
        users = table["user"].to_pylist()
        histories = tuple(sequences[u][:-back] for u in keep)
        pending.append(
            EvalBatch(
                tuple(users[u] for u in keep),
                histories,
                np.array([sequences[u][-back] for u in keep], np.int64),
                {
                    n: [v[u][: len(h)] for u, h in zip(keep, histories, strict=True)]
                    for n, v in encoded.items()
                },
            )
        )
        size += len(keep)
        while size >= batch_size:
            batch, pending = _cut(pending, batch_size)
            size -= batch_size
            yield batch
    if size:
        yield _cut(pending, size)[0]


def _cut(pending: list[EvalBatch], n: int) -> tuple[EvalBatch, list[EvalBatch]]:
    """The first ``n`` users of the pending batches, and what is left."""
    merged = EvalBatch(
        tuple(u for b in pending for u in b.users),
        tuple(h for b in pending for h in b.histories),
        np.concatenate([b.targets for b in pending]),
        {name: [v for b in pending for v in b.features[name]] for name in pending[0].features},
    )
    head = EvalBatch(
        merged.users[:n],
        merged.histories[:n],
        merged.targets[:n],
        {k: v[:n] for k, v in merged.features.items()},
    )
    rest = EvalBatch(
        merged.users[n:],
        merged.histories[n:],
        merged.targets[n:],
        {k: v[n:] for k, v in merged.features.items()},
    )
    return head, [rest] if rest.users else []
