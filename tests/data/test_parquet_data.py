"""Tests for the readers of prepared folders: retrieval.training.streaming and retrieval.data.prepared.

The oracle is the in-memory path: retrieval.training.examples.make_examples over leave_one_out's
training sequences. Streamed examples must be the same multiset, for every objective.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from retrieval.artifacts.model import ModelArtifact
from retrieval.data.features import SideVocab, build_side_vocab, user_event_features
from retrieval.data.interactions import SequenceData, build_sequences
from retrieval.data.loaders import load_interactions
from retrieval.data.prepared import reader as parquet_data
from retrieval.data.prepared.reader import (
    count_examples,
    item_counts,
    iter_eval_batches,
    open_prepared,
    read_vocab,
    side_vocab,
    target_counts,
)
from retrieval.data.prepared.writer import prepare
from retrieval.data.splits import LeaveOneOut, leave_one_out
from retrieval.evaluation.evaluate import evaluate_ranking, popularity_top_k
from retrieval.evaluation.metrics import ranking_metrics
from retrieval.evaluation.prepared import evaluate_prepared, popularity_prepared
from retrieval.storage.manifest import ArtifactError
from retrieval.training.examples import OBJECTIVES, make_examples, mask_items
from retrieval.training.streaming import epoch_examples, shuffled_batches, streaming_dataset, user_chunks

MAX_LEN = 5
USERS_PER_ROW_GROUP = 4


@pytest.fixture(scope="module")
def log_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 users with 1..24 events over 25 items, ties in time, an action column."""
    rng = np.random.default_rng(3)
    rows = ["user,item,timestamp,action"]
    for user in range(30):
        t = 1000 + 7 * user
        for _ in range(int(rng.integers(1, 25))):
            rows.append(f"u{user},i{int(rng.integers(25))},{t},{rng.choice(['click', 'buy'])}")
            t += int(rng.integers(0, 3)) * 60  # 0: a tie with the previous event
    path = tmp_path_factory.mktemp("log") / "log.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def memory(log_csv: Path) -> tuple[SequenceData, LeaveOneOut]:
    data = build_sequences(load_interactions(log_csv))
    return data, leave_one_out(data)


@pytest.fixture(scope="module")
def prepared(log_csv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "p"
    prepare(log_csv, out, partitions=3, users_per_row_group=USERS_PER_ROW_GROUP, progress=False)
    return out


def rows_of(x: dict[str, np.ndarray], y: np.ndarray) -> np.ndarray:
    """Examples as sorted rows ``[inputs..., targets...]`` (a multiset, order aside)."""
    table = np.column_stack([*(x[k] for k in sorted(x)), y.reshape(len(y), -1)])
    return table[np.lexsort(table.T[::-1])]


def collect(
    batches: Iterator[tuple[dict[str, Any], Any]],
) -> tuple[dict[str, np.ndarray], np.ndarray, list[int]]:
    xs, ys = [], []
    for x, y in batches:
        xs.append({k: np.asarray(v) for k, v in x.items()})
        ys.append(np.asarray(y))
    x_all = {k: np.concatenate([x[k] for x in xs]) for k in xs[0]}
    return x_all, np.concatenate(ys), [len(y) for y in ys]


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_streamed_examples_are_make_examples(
    prepared: Path, memory: tuple[SequenceData, LeaveOneOut], objective: str
) -> None:
    _, split = memory
    x, y = make_examples(objective, {"items": split.train}, MAX_LEN)
    sx, sy, sizes = collect(epoch_examples(prepared, objective, MAX_LEN, 7, seed=1, shuffle_buffer=20))
    assert np.array_equal(rows_of(sx, sy), rows_of(x, y))
    assert sizes[:-1] == [7] * (len(sizes) - 1) and 1 <= sizes[-1] <= 7
    assert len(sizes) == math.ceil(len(y) / 7)
    assert count_examples(prepared, objective, MAX_LEN) == len(y)
    flat = y.ravel()
    expected = np.bincount(flat[flat > 0], minlength=read_vocab(prepared).num_embeddings)
    assert np.array_equal(target_counts(prepared, objective), expected)  # target_probabilities' counts


def test_dataset_is_the_seeded_epochs_back_to_back(prepared: Path) -> None:
    dataset = streaming_dataset(prepared, "all_positions", MAX_LEN, 16, seed=5, first_epoch=1, epochs=3)
    assert dataset.element_spec[0]["items"].shape.as_list() == [None, MAX_LEN]
    assert dataset.element_spec[1].shape.as_list() == [None, MAX_LEN]
    got = list(dataset.as_numpy_iterator())
    expected = [
        *epoch_examples(prepared, "all_positions", MAX_LEN, 16, 5, 1),
        *epoch_examples(prepared, "all_positions", MAX_LEN, 16, 5, 2),
    ]
    assert len(got) == len(expected)
    for (gx, gy), (ex, ey) in zip(got, expected, strict=True):
        assert np.array_equal(gx["items"], ex["items"]) and np.array_equal(gy, ey)
        assert gx["items"].dtype == np.int32 and gy.dtype == np.int32
    # Epoch 1 and epoch 2 are the same examples in another order.
    half = len(got) // 2
    first, second = collect(iter(got[:half])), collect(iter(got[half:]))
    assert np.array_equal(rows_of(first[0], first[1]), rows_of(second[0], second[1]))
    assert not np.array_equal(first[1], second[1])
    # Same seed and epoch, same batches; the cloze task masks them as train.py does.
    again = streaming_dataset(prepared, "cloze", MAX_LEN, 16, seed=5)
    x, y = next(iter(again.map(lambda x, y: mask_items(x, y, 99, 0.5))))
    assert x["items"].shape[1] == MAX_LEN and y.shape == x["items"].shape


def test_readers_hold_one_row_group_at_a_time(prepared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    real = parquet_data._read_piece

    def counting(fragment: Any, columns: Any) -> Any:
        table = real(fragment, columns)
        reads.append(table.num_rows)
        return table

    monkeypatch.setattr(parquet_data, "_read_piece", counting)
    files = open_prepared(prepared).files
    row_groups = sum(pq.ParquetFile(f).metadata.num_row_groups for f in files)
    sum(len(y) for _, y in epoch_examples(prepared, "last", MAX_LEN, 8, seed=0))
    assert len(reads) == row_groups  # each row group read once per epoch
    assert max(reads) <= USERS_PER_ROW_GROUP
    assert sum(reads) == 30
    # Lazy: the first batch needs one row group when the buffer holds one example.
    reads.clear()
    next(epoch_examples(prepared, "last", MAX_LEN, 1, seed=0, shuffle_buffer=1))
    assert len(reads) == 1
    reads.clear()
    next(iter_eval_batches(prepared, "test", batch_size=1))
    assert len(reads) <= 2  # a row group may hold no evaluated user


def test_shuffle_buffer_bounds_what_is_held() -> None:
    rng = np.random.default_rng(0)
    consumed = 0
    emitted = 0
    held_at_pull: list[int] = []

    def chunks() -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
        nonlocal consumed
        for size in rng.integers(1, 30, 40):
            held_at_pull.append(consumed - emitted)
            ids = np.arange(consumed, consumed + size)
            consumed += int(size)
            yield {"items": ids[:, None]}, ids

    seen = []
    for x, y in shuffled_batches(chunks(), batch_size=8, shuffle_buffer=50, rng=np.random.default_rng(1)):
        emitted += len(y)
        assert np.array_equal(x["items"][:, 0], y)
        seen.extend(y.tolist())
    assert sorted(seen) == list(range(consumed))  # every example exactly once
    assert max(held_at_pull) < 50  # never more than the buffer waits for the next chunk
    with pytest.raises(ValueError, match="batch_size"):
        next(shuffled_batches(chunks(), 0, 10, rng))


def test_user_chunks_bound_events() -> None:
    lengths = np.array([3, 4, 10, 0, 2, 2, 2])
    chunks = user_chunks(lengths, 6)
    assert [(c.start, c.stop) for c in chunks] == [(0, 1), (1, 2), (2, 3), (3, 7)]  # 0+2+2+2 = 6 fits
    assert all(lengths[c].sum() <= 6 or c.stop - c.start == 1 for c in chunks)


@pytest.mark.parametrize("split_name", ["valid", "test"])
def test_eval_batches_are_leave_one_out(
    prepared: Path, memory: tuple[SequenceData, LeaveOneOut], split_name: str
) -> None:
    data, split = memory
    histories, targets, users = (
        (split.valid_histories, split.valid_targets, split.valid_users)
        if split_name == "valid"
        else (split.test_histories, split.test_targets, split.test_users)
    )
    expected = {
        data.users[u]: (h.tolist(), int(t)) for h, t, u in zip(histories, targets, users, strict=True)
    }
    got: dict[str, tuple[list[int], int]] = {}
    sizes = []
    for batch in iter_eval_batches(prepared, split_name, batch_size=5):
        sizes.append(len(batch.targets))
        assert batch.features == {}
        for user, history, target in zip(batch.users, batch.histories, batch.targets, strict=True):
            got[user] = (history.tolist(), int(target))
    assert got == expected
    assert sizes[:-1] == [5] * (len(sizes) - 1)
    with pytest.raises(ValueError, match="unknown split"):
        next(iter_eval_batches(prepared, "train"))


def test_side_features_match_the_in_memory_encoding(
    prepared: Path, memory: tuple[SequenceData, LeaveOneOut]
) -> None:
    data, split = memory
    features = ("action", "gap_prev")
    side = side_vocab(prepared, features)
    assert side == build_side_vocab(data, features)
    encoded = user_event_features(data, side)
    train_events = {
        "items": split.train,
        **{
            n: [per_user[u][: len(split.train[u])] for u in range(len(data.users))]
            for n, per_user in encoded.items()
        },
    }
    for objective in ("last", "all_positions"):
        x, y = make_examples(objective, train_events, MAX_LEN)
        sx, sy, _ = collect(epoch_examples(prepared, objective, MAX_LEN, 9, seed=2, side=side))
        assert sorted(sx) == ["action", "gap_prev", "items"]
        assert np.array_equal(rows_of(sx, sy), rows_of(x, y))
    dataset = streaming_dataset(prepared, "last", MAX_LEN, 9, seed=2, side=side)
    assert sorted(dataset.element_spec[0]) == ["action", "gap_prev", "items"]
    position = {user: u for u, user in enumerate(data.users)}
    for batch in iter_eval_batches(prepared, "test", batch_size=4, side=side):
        for user, history, *values in zip(
            batch.users, batch.histories, batch.features["action"], batch.features["gap_prev"], strict=True
        ):
            u = position[user]
            assert [v.tolist() for v in values] == [
                encoded[n][u][: len(history)].tolist() for n in ("action", "gap_prev")
            ]
    with pytest.raises(ValueError, match="attributes"):
        side_vocab(prepared, ("attributes",))


def test_any_arrow_filesystem(prepared: Path) -> None:
    expected = count_examples(prepared, "last", MAX_LEN)
    uri = prepared.resolve().as_uri()  # file:///...
    assert count_examples(uri, "last", MAX_LEN) == expected
    subtree = pafs.SubTreeFileSystem(str(prepared.resolve().parent), pafs.LocalFileSystem())
    opened = open_prepared("p", filesystem=subtree)
    assert count_examples(opened, "last", MAX_LEN) == expected
    assert read_vocab(opened) == read_vocab(prepared)
    assert np.array_equal(item_counts(opened), item_counts(prepared))
    _, y, _ = collect(epoch_examples(opened, "cloze", MAX_LEN, 32, seed=0))
    assert len(y) == count_examples(prepared, "cloze", MAX_LEN)


def test_open_refuses_what_is_not_a_prepared_folder(prepared: Path, tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"manifest\.json not found"):
        open_prepared(tmp_path)
    (tmp_path / "manifest.json").write_text('{"kind": "model", "format_version": 1}')
    with pytest.raises(ArtifactError, match="expected 'prepared-data'"):
        open_prepared(tmp_path)
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "manifest.json").write_bytes((prepared / "manifest.json").read_bytes())
    with pytest.raises(ArtifactError, match="incomplete"):
        open_prepared(copy)
    with pytest.raises(ValueError, match="unknown objective"):
        streaming_dataset(prepared, "next", MAX_LEN, 4, seed=0)


def mean_pool_model(num_embeddings: int, side: SideVocab) -> ModelArtifact:
    """A numpy stand-in for a trained model: the mean of the history's item vectors, shifted by
    the mean action id (so side inputs change the ranking)."""
    table = np.random.default_rng(0).normal(size=(num_embeddings, 8)).astype(np.float32)

    def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:
        items = inputs["items"]
        mean = table[items].sum(1) / np.maximum((items > 0).sum(1, keepdims=True), 1)
        if "action" in inputs:
            mean = mean + inputs["action"].mean(1, keepdims=True)
        return mean[:, None, :]

    manifest = {"version": "test", "max_len": MAX_LEN, "num_interests": 1}
    return ModelArtifact(None, manifest, None, table, user_vectors, side)  # type: ignore[arg-type]


@pytest.mark.parametrize("features", [(), ("action",)])
def test_evaluation_equals_one_call_over_all_users(
    prepared: Path, memory: tuple[SequenceData, LeaveOneOut], features: tuple[str, ...]
) -> None:
    data, split = memory
    side = build_side_vocab(data, features)
    model = mean_pool_model(data.vocab.num_embeddings, side)
    encoded = user_event_features(data, side)
    history_features = {
        n: [per_user[u][: len(h)] for u, h in zip(split.test_users, split.test_histories, strict=True)]
        for n, per_user in encoded.items()
    }
    expected = evaluate_ranking(model, split.test_histories, split.test_targets, features=history_features)
    got = evaluate_prepared(model, prepared, "test", batch_size=3)
    assert got == pytest.approx(expected)
    counts = item_counts(prepared)
    baseline = ranking_metrics(popularity_top_k(counts, split.valid_histories, 50), split.valid_targets)
    assert popularity_prepared(prepared, "valid", batch_size=3) == pytest.approx(baseline)
