"""Tests for retrieval.data.prepared's writer and tools/prepare_data.py.

The oracle is the in-memory path: retrieval.data.interactions.build_sequences + leave_one_out. The
out-of-core path (format ``dataset``) must give the same vocabulary, sequences and split, down
to the partition files' bytes-level content.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from retrieval.data.errors import DataError
from retrieval.data.features import build_side_vocab
from retrieval.data.interactions import build_sequences
from retrieval.data.loaders import load_interactions
from retrieval.data.prepared.out_of_core import _Firsts
from retrieval.data.prepared.partitions import partition_of, partitions_for
from retrieval.data.prepared.reader import KIND, item_counts, read_item_attributes, read_vocab, side_vocab
from retrieval.data.prepared.writer import prepare, prepare_dataset
from retrieval.data.splits import leave_one_out
from retrieval.storage.manifest import read_manifest
from tests.helpers import run_tool

# Hand-made log: ties in time (u1: i2 and i3 at t=20, file order wins; i5 and i4 at t=5 across
# users decide the vocabulary order), an unsorted user (u2), users with 1, 2 and 4 events,
# ids with leading zeros and spaces, titles (one item has two, one none) and a rating column.
TINY_CSV = """user,item,timestamp,rating,title
u1,i2,20,5,Two
u2,i4,5,3,Four
u1,i1,10,4,One
u1,i3,20,1,
u3,i5,5,2,Five
u2,007,1,5,Seven
u1,i4,30,3,Four again
u2,i1,40,2,
u4,i2,50,1,
 u2 , i5 ,45,4,
u5,i6,60,5,Six
u5,i1,61,5,
"""


def read_users(folder: Path) -> dict[str, dict[str, Any]]:
    """Every user's row of a prepared folder (all partition files)."""
    rows: dict[str, dict[str, Any]] = {}
    for path in sorted((folder / "sequences").glob("part-*.parquet")):
        for row in pq.read_table(path).to_pylist():
            assert row["user"] not in rows, f"user {row['user']} in two partitions"
            rows[row["user"]] = row
    return rows


def assert_same_as_in_memory(folder: Path, source: Path, format: str | None = None) -> None:
    """The prepared folder holds exactly build_sequences + leave_one_out of ``source``."""
    data = build_sequences(load_interactions(source, format))
    split = leave_one_out(data)
    vocab = read_vocab(folder)
    assert vocab.ids == data.vocab.ids
    rows = read_users(folder)
    assert sorted(rows) == sorted(data.users)
    for u, user in enumerate(data.users):
        row = rows[user]
        assert row["items"] == data.sequences[u].tolist()
        for column, per_user in data.event_columns.items():
            assert row[column] == per_user[u].tolist(), column
        assert row["items"][: row["train_len"]] == split.train[u].tolist()
    for histories, targets, users, back, column in (
        (split.valid_histories, split.valid_targets, split.valid_users, 2, "valid_target"),
        (split.test_histories, split.test_targets, split.test_users, 1, "test_target"),
    ):
        for history, target, u in zip(histories, targets, users, strict=True):
            row = rows[data.users[u]]
            assert row["items"][:-back] == history.tolist()
            assert row[column] == target
    unevaluated = set(data.users) - {data.users[u] for u in split.test_users}
    assert all(rows[u]["valid_target"] == 0 == rows[u]["test_target"] for u in unevaluated)
    train = np.concatenate(split.train)
    assert np.array_equal(item_counts(folder), np.bincount(train, minlength=vocab.num_embeddings))


def assert_same_files(a: Path, b: Path, partitions: int) -> None:
    for p in range(partitions):
        name = f"sequences/part-{p:05d}.parquet"
        assert pq.read_table(a / name).equals(pq.read_table(b / name)), name


@pytest.fixture
def tiny_csv(tmp_path: Path) -> Path:
    path = tmp_path / "log.csv"
    path.write_text(TINY_CSV)
    return path


def test_in_memory_formats_keep_build_sequences(tiny_csv: Path, tmp_path: Path) -> None:
    meta = prepare(tiny_csv, tmp_path / "p", partitions=3, users_per_row_group=1, progress=False)
    assert_same_as_in_memory(tmp_path / "p", tiny_csv)
    data = build_sequences(load_interactions(tiny_csv))
    assert read_vocab(tmp_path / "p") == data.vocab  # titles too
    manifest = read_manifest(tmp_path / "p", KIND)  # checksums verified
    assert (meta.users, meta.items, meta.events, meta.partitions) == (5, 7, 12, 3)
    assert meta.train_events == 2 + 2 + 1 + 1 + 2  # u1 4 -> 2, u2 4 -> 2, u3 1, u4 1, u5 2
    assert meta.evaluated_users == 2
    assert manifest["event_columns"] == ["timestamp", "rating"]
    # Users land in the partition their hash names, one row group per user here.
    for p in range(3):
        file = pq.ParquetFile(tmp_path / "p" / "sequences" / f"part-{p:05d}.parquet")
        users = file.read().column("user").to_pylist()
        assert partition_of(users, 3).tolist() == [p] * len(users)
        assert file.metadata.num_row_groups == max(1, len(users))  # an empty file has an empty one


def test_dataset_path_equals_in_memory_path(tiny_csv: Path, tmp_path: Path) -> None:
    # The same rows as a folder of CSV files, read in record batches of 2 rows, and as Parquet
    # files with integer-free text ids: both must give the in-memory result exactly.
    lines = TINY_CSV.strip().split("\n")
    csv_folder = tmp_path / "csv"
    csv_folder.mkdir()
    for i, chunk in enumerate([lines[1:4], lines[4:9], lines[9:]]):
        (csv_folder / f"part-{i}.csv").write_text("\n".join([lines[0], *chunk]) + "\n")
    prepare(tiny_csv, tmp_path / "memory", partitions=3, progress=False)
    prepare(csv_folder, tmp_path / "csv-prepared", partitions=3, batch_rows=2, progress=False)
    assert_same_as_in_memory(tmp_path / "csv-prepared", tiny_csv)
    assert read_vocab(tmp_path / "csv-prepared") == read_vocab(tmp_path / "memory")  # titles too
    assert_same_files(tmp_path / "memory", tmp_path / "csv-prepared", 3)


def test_dataset_path_folds_item_firsts_across_batches(
    tiny_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fold after every batch (the 50M run folds every few million rows): same result.
    monkeypatch.setattr(_Firsts, "fold_rows", 1)
    prepare(tiny_csv, tmp_path / "p", format="dataset", partitions=2, batch_rows=3, progress=False)
    assert_same_as_in_memory(tmp_path / "p", tiny_csv)
    assert read_vocab(tmp_path / "p") == build_sequences(load_interactions(tiny_csv)).vocab


def test_prepare_dataset_reads_out_of_core_with_prepares_options(tiny_csv: Path, tmp_path: Path) -> None:
    meta = prepare_dataset(tiny_csv, tmp_path / "p", partitions=2, batch_rows=3, progress=False)
    assert (meta.format, meta.partitions) == ("dataset", 2)
    assert_same_as_in_memory(tmp_path / "p", tiny_csv)


def test_movielens_100k_both_paths(shared_data: Path, tmp_path: Path) -> None:
    source = shared_data / "ml-100k"
    if not (source / "u.data").is_file():
        pytest.skip(f"MovieLens-100K not found in {source}")
    prepare(source, tmp_path / "memory", partitions=4, progress=False)
    assert_same_as_in_memory(tmp_path / "memory", source)
    # u.data as a Parquet dataset of 3 files (integer ids, file order kept), read in batches.
    events = load_interactions(source).events
    raw = tmp_path / "raw"
    raw.mkdir()
    for i, rows in enumerate(np.array_split(np.arange(len(events)), 3)):
        part = events.iloc[rows]
        table = pa.table(
            {
                "user": part["user"].astype(int).to_numpy(),
                "item": part["item"].astype(int).to_numpy(),
                "timestamp": part["timestamp"].to_numpy(),
                "rating": part["rating"].to_numpy(),
            }
        )
        pq.write_table(table, raw / f"part-{i}.parquet")
    meta = prepare(raw, tmp_path / "dataset", partitions=4, batch_rows=20_000, progress=False)
    assert meta.format == "dataset"
    assert (meta.users, meta.items, meta.events) == (943, 1682, 100_000)
    assert_same_as_in_memory(tmp_path / "dataset", source)
    assert_same_files(tmp_path / "memory", tmp_path / "dataset", 4)


def test_partition_count_follows_the_input_size(tiny_csv: Path, tmp_path: Path) -> None:
    assert partitions_for(12, 5) == 3
    assert partitions_for(0, 5) == 1
    assert partitions_for(10**12, 1) == 4096
    meta = prepare(tiny_csv, tmp_path / "p", events_per_partition=5, progress=False)
    assert meta.partitions == 3
    assert meta.largest_partition_events <= meta.events


def test_partition_of_is_stable() -> None:
    # Pinned values (pandas' SipHash with its fixed key): a change of hash would re-partition
    # every prepared folder, and readers of old folders would disagree with writers of new ones.
    users = ["u1", "u2", "u3", "42"]
    assert partition_of(users, 1000).tolist() == [869, 421, 373, 52]
    assert partition_of(np.array(users, dtype=object), 1000).tolist() == [869, 421, 373, 52]
    assert partition_of([], 7).tolist() == []


def write_parquet(path: Path, columns: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def ids(user: list[Any], item: list[Any], timestamp: list[Any], **more: list[Any]) -> dict[str, Any]:
    return {"user": user, "item": item, "timestamp": timestamp, **more}


EMPTY = {
    "user": pa.array([], pa.string()),
    "item": pa.array([], pa.string()),
    "timestamp": pa.array([], pa.int64()),
}


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"a.parquet": {"user": ["u1"], "time": [1]}}, r"a\.parquet: missing column\(s\) item, timestamp"),
        ({"a.parquet": ids(["u1", ""], ["i", "j"], [1, 2])}, r"a\.parquet, row 2: empty user id"),
        ({"a.parquet": ids(["u1", None], ["i", "j"], [1, 2])}, r"row 2: empty user id"),
        ({"a.parquet": ids([1, 2], [1.0, 2.5], [1, 2])}, r"row 2: item id 2.5 is not a whole"),
        ({"a.parquet": ids(["u"], ["i"], [1.5])}, r"row 1: timestamp 1.5 is not an integer"),
        ({"a.parquet": ids(["u", "v"], ["i", "j"], [1, None])}, r"row 2: timestamp is missing"),
        ({"a.parquet": ids([[1]], ["i"], [1])}, r"user ids are of type list"),
        ({"a.parquet": ids(["u"], ["i"], [1], items=[3])}, r"items clash"),
        (
            {"a.parquet": ids(["u"], ["i"], [1]), "b.parquet": ids(["u"], ["i"], [2], rating=[1])},
            r"b\.parquet: columns user, item, timestamp, rating differ from the first file's",
        ),
        ({"a.parquet": EMPTY}, r"no rows"),
    ],
)
def test_malformed_tables_are_named(tmp_path: Path, files: dict[str, dict[str, Any]], message: str) -> None:
    for name, columns in files.items():
        write_parquet(tmp_path / "raw" / name, columns)
    with pytest.raises(DataError, match=message):
        prepare(tmp_path / "raw", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()  # nothing half-written
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_malformed_files_and_paths(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"a\.parquet: not a readable parquet file"):
        prepare(raw, tmp_path / "out", progress=False)
    (raw / "a.parquet").unlink()
    (raw / "notes.txt").write_text("x")
    with pytest.raises(DataError, match=r"expected \.parquet or \.csv files"):
        prepare(raw, tmp_path / "out", progress=False)
    with pytest.raises(DataError, match="no such file or folder"):
        prepare(tmp_path / "missing", tmp_path / "out", format="dataset", progress=False)
    (raw / "notes.txt").unlink()
    (raw / "a.csv").write_text("user,item,timestamp\nu1,i1,10\nu1,i2,ten\n")
    with pytest.raises(DataError, match=r"a\.csv"):
        prepare(raw, tmp_path / "out", progress=False)
    with pytest.raises(DataError, match="unknown data format"):
        prepare(raw, tmp_path / "out", format="orc", progress=False)
    with pytest.raises(DataError, match=r"log\.csv, line 3"):  # the in-memory loaders' messages
        (tmp_path / "log.csv").write_text("user,item,timestamp\nu1,i1,1\nu1,i2\n")
        prepare(tmp_path / "log.csv", tmp_path / "out", progress=False)


def test_out_is_not_overwritten_unless_asked(tiny_csv: Path, tmp_path: Path) -> None:
    prepare(tiny_csv, tmp_path / "p", progress=False)
    with pytest.raises(FileExistsError):
        prepare(tiny_csv, tmp_path / "p", progress=False)
    assert prepare(tiny_csv, tmp_path / "p", partitions=2, overwrite=True, progress=False).partitions == 2


def test_cli(tiny_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p"
    args = ["--data", str(tiny_csv), "--out", str(out), "--quiet"]
    assert run_tool("prepare_data", *args, "--partitions", "2") == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["out"], printed["partitions"], printed["users"]) == (str(out), 2, 5)
    assert_same_as_in_memory(out, tiny_csv)
    assert run_tool("prepare_data", *args) == 2
    assert "already exists" in capsys.readouterr().err
    assert run_tool("prepare_data", "--data", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "q")) == 2
    assert "nope.csv" in capsys.readouterr().err


def test_s3rec_order_only_data_with_attributes(tmp_path: Path) -> None:
    path = tmp_path / "Tiny.txt"
    path.write_text("1 10 11 12 13\n2 11 14\n3 12\n")
    (tmp_path / "Tiny_item2attributes.json").write_text('{"10": [1, 2], "11": [2], "14": [], "99": [3]}')
    meta = prepare(path, tmp_path / "p", partitions=2, progress=False)
    assert meta.has_time is False and meta.event_columns == ["timestamp"]
    assert_same_as_in_memory(tmp_path / "p", path)
    data = build_sequences(load_interactions(path))
    assert read_item_attributes(tmp_path / "p") == {"10": ["1", "2"], "11": ["2"], "14": []}
    assert side_vocab(tmp_path / "p", ["attributes"]) == build_side_vocab(data, ["attributes"])
    with pytest.raises(ValueError, match="only orders events"):
        side_vocab(tmp_path / "p", ["gap_prev"])


def test_empty_partitions_keep_the_schema(tiny_csv: Path, tmp_path: Path) -> None:
    # 5 users in 64 partitions: most files are empty and must still be readable alike.
    prepare(tiny_csv, tmp_path / "memory", partitions=64, progress=False)
    prepare(tiny_csv, tmp_path / "dataset", format="dataset", partitions=64, progress=False)
    assert_same_files(tmp_path / "memory", tmp_path / "dataset", 64)
    assert_same_as_in_memory(tmp_path / "dataset", tiny_csv)
