"""The ``dataset`` path of :func:`~retrieval.data.prepared.writer.prepare`: a raw ``user, item, timestamp``
table larger than memory, read in record batches in two passes (see :mod:`retrieval.data.prepared`
for the memory it takes)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from tqdm import tqdm

from retrieval.data.columns import REQUIRED_COLUMNS
from retrieval.data.errors import DataError
from retrieval.data.prepared.partitions import (
    ROW_COLUMN,
    ItemCounts,
    check_event_columns,
    part_path,
    partition_of,
    partitions_for,
    user_table,
)
from retrieval.data.prepared.reader import COUNTS_FILE, VOCAB_FILE, resolve
from retrieval.data.vocab import ItemVocab

log = logging.getLogger(__name__)


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
    # Ids stay text as written ("007" is not 7), as retrieval.data.tables.load_table reads them.
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
        """One row per item seen, in order of ``keys``; the fold is emptied (its memory freed)."""
        self._fold()
        kept, self.kept = self.kept, None
        return None if kept is None else kept.sort_by(self.keys)


def prepare_out_of_core(
    path: str,
    tmp: Path,
    partitions: int | None,
    batch_rows: int,
    events_per_partition: int,
    users_per_row_group: int,
    progress: bool,
) -> dict[str, Any]:
    """The out-of-core path into ``tmp``: pass 1 (:func:`_scan`), the vocabulary, then pass 2
    (:func:`_write_partitions`).

    Returns:
        The manifest's counts and columns.
    """
    fs, files, kind = _input_files(path)
    total = _count_rows(fs, files, kind)
    if partitions is None:
        estimate = total  # CSV: about 20 bytes per row
        if estimate is None:
            estimate = sum(info.size or 0 for info in fs.get_file_info(files)) // 20
        partitions = partitions_for(estimate, events_per_partition)
    staging = tmp / "staging"
    staging.mkdir()
    scanned = _scan(path, fs, files, kind, total, _Staging(staging, partitions), batch_rows, progress)
    vocab = ItemVocab.from_ids(scanned.ids.to_pylist(), scanned.titles)
    vocab.save(tmp / VOCAB_FILE)
    totals = _write_partitions(tmp, scanned, vocab.num_embeddings, users_per_row_group, progress)
    return {
        "partitions": partitions,
        "users": totals.users,
        "items": len(vocab),
        "events": totals.events,
        "train_events": totals.train_events,
        "evaluated_users": totals.evaluated_users,
        "has_time": True,
        "event_columns": ["timestamp", *scanned.side],
        "largest_partition_events": totals.largest_partition_events,
    }


@dataclass(frozen=True)
class _Scanned:
    """What pass 1 leaves for pass 2.

    Attributes:
        staging: the rows staged per partition, ``<p:05d>.parquet`` (absent when none).
        partitions: the number of partitions.
        ids: string ``[items]`` the item ids in vocabulary order (by first ``(timestamp, row)``).
        titles: item id -> its first non-empty title (None without a ``title`` column).
        schema: the staged rows' (``user, item, timestamp``, the row, the other event columns).
        side: the other event columns, in input order.
    """

    staging: Path
    partitions: int
    ids: pa.Array
    titles: dict[str, str] | None
    schema: pa.Schema
    side: list[str]


class _Staging:
    """Pass 1's state: per item its first ``(timestamp, row)`` (the vocabulary order) and first
    non-empty title, the rows staged per partition, the first file's columns."""

    def __init__(self, folder: Path, partitions: int) -> None:
        self.folder, self.partitions = folder, partitions
        self.writers: dict[int, pq.ParquetWriter] = {}
        self.firsts, self.first_titles = _Firsts(["t", ROW_COLUMN]), _Firsts([ROW_COLUMN])
        self.schema: pa.Schema | None = None
        self.side: list[str] | None = None
        self.has_titles = False
        self.rows = 0

    def check_columns(self, names: Sequence[str], shown: str) -> None:
        """Takes the first file's columns; refuses a file without the required ones or (after the
        first) with other columns."""
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise DataError(f"{shown}: missing column(s) {', '.join(missing)}; found: {', '.join(names)}")
        columns = [c for c in names if c not in (*REQUIRED_COLUMNS, "title")]
        if self.side is None:
            self.side, self.has_titles = columns, "title" in names
            check_event_columns(self.side, shown)
        elif columns != self.side or ("title" in names) != self.has_titles:
            raise DataError(
                f"{shown}: columns {', '.join(names)} differ from the first file's "
                f"({', '.join([*REQUIRED_COLUMNS, *(['title'] if self.has_titles else []), *self.side])})"
            )

    def add(self, table: pa.Table, where: Callable[[int], str], shown: str) -> None:
        """Folds a batch's items into the firsts and appends its rows to their partitions."""
        users = _id_text(table["user"], "user", where)
        items = _id_text(table["item"], "item", where)
        times = _integer_times(table["timestamp"], where)
        rows = np.arange(self.rows, self.rows + table.num_rows, dtype=np.int64)
        self.firsts.add(pa.table({"item": items, "t": times, ROW_COLUMN: rows}))
        if self.has_titles:
            title = table["title"].cast(pa.string())
            named = pc.fill_null(pc.not_equal(pc.utf8_trim_whitespace(title), ""), False)
            self.first_titles.add(pa.table({"item": items, ROW_COLUMN: rows, "title": title}).filter(named))
        staged = pa.table(
            {"user": users, "item": items, "timestamp": times, ROW_COLUMN: rows}
            | {c: table[c] for c in self.side or ()}
        )
        if self.schema is None:
            self.schema = staged.schema
        try:
            staged = staged.cast(self.schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise DataError(f"{shown}: column types differ from the first batch's: {e}") from None
        _stage(staged, users, self.partitions, self.folder, self.writers)
        self.rows += table.num_rows

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()


def _scan(
    path: str,
    fs: pafs.FileSystem,
    files: list[str],
    kind: str,
    total: int | None,
    staging: _Staging,
    batch_rows: int,
    progress: bool,
) -> _Scanned:
    """Pass 1: reads ``files`` in record batches of ``batch_rows`` rows into ``staging``; then
    orders the items by their first ``(timestamp, row)``, the folds dropped before pass 2."""
    bar = tqdm(total=total, desc="pass 1: scan", unit="row", unit_scale=True, disable=not progress)
    try:
        for file in files:
            shown = file if len(files) > 1 or "://" not in path else path
            _scan_file(fs, file, kind, shown, staging, batch_rows, bar)
    finally:
        bar.close()
        staging.close()
    ordered = staging.firsts.result()
    if ordered is None or staging.schema is None or staging.side is None:
        raise DataError(f"{path}: no rows")
    ids = ordered["item"].combine_chunks()
    del ordered  # the ids are kept for pass 2's lookups
    titles = None
    if staging.has_titles:
        titled = staging.first_titles.result()
        titles = {}
        if titled is not None:
            titles = dict(zip(titled["item"].to_pylist(), titled["title"].to_pylist(), strict=True))
    return _Scanned(staging.folder, staging.partitions, ids, titles, staging.schema, staging.side)


def _scan_file(
    fs: pafs.FileSystem, file: str, kind: str, shown: str, staging: _Staging, batch_rows: int, bar: tqdm
) -> None:
    """One input file into ``staging``, batch by batch (errors name ``shown`` and the row)."""
    try:
        dataset = ds.dataset(file, filesystem=fs, format=_file_format(kind))
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"{shown}: not a readable {kind} file: {e}") from None
    staging.check_columns(dataset.schema.names, shown)
    start = 0
    try:
        for batch in dataset.to_batches(batch_size=batch_rows):
            if not batch.num_rows:
                continue
            table = pa.Table.from_batches([batch])

            def where(r: int, start: int = start) -> str:
                return f"{shown}, row {start + r + 1}"

            staging.add(table, where, shown)
            start += table.num_rows
            bar.update(table.num_rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as e:
        raise DataError(f"{shown}: not a readable {kind} file: {e}") from None


class _Totals(NamedTuple):
    """Pass 2's counts, for the manifest."""

    users: int
    events: int
    train_events: int
    evaluated_users: int
    largest_partition_events: int


def _write_partitions(
    tmp: Path, scanned: _Scanned, num_embeddings: int, users_per_row_group: int, progress: bool
) -> _Totals:
    """Pass 2: one staged partition at a time (the only one in memory) has its items numbered,
    its users' events sorted and written, its staging file removed; the item counts last."""
    counts = ItemCounts(num_embeddings)
    users = events = train_events = evaluated = largest = 0
    for p in tqdm(range(scanned.partitions), desc="pass 2: partitions", unit="part", disable=not progress):
        source = scanned.staging / f"{p:05d}.parquet"
        part = pq.read_table(source) if source.exists() else scanned.schema.empty_table()
        table, lengths, items, train_len = _sequences_of_partition(part, scanned.ids, scanned.side)
        del part
        pq.write_table(table, part_path(tmp, p), row_group_size=users_per_row_group)
        counts.add(items, lengths, train_len)
        source.unlink(missing_ok=True)
        users += len(lengths)
        events += len(items)
        train_events += int(train_len.sum())
        evaluated += int((lengths >= 3).sum())
        largest = max(largest, len(items))
    scanned.staging.rmdir()
    counts.write(tmp / COUNTS_FILE)
    return _Totals(users, events, train_events, evaluated, largest)


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
    table = user_table(encoded.dictionary, lengths, items, columns, train_len)
    return table, lengths, items, train_len
