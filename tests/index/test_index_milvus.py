"""The Milvus backend against exact search, on an embedded milvus-lite database under tmp_path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from index import FaissIndex, SearchFilter, recall_at_k

milvus_index = pytest.importorskip("index.milvus_index")
if (reason := milvus_index.milvus_available()) is not None:
    pytest.skip(reason, allow_module_level=True)
pytest.importorskip("milvus_lite", reason="milvus-lite (the embedded Milvus) is not installed")

from index.milvus_index import MilvusIndex  # noqa: E402
from index.multi_interest import search_interests  # noqa: E402
from retrieval.artifacts.index import load_index, save_index  # noqa: E402

DIM, N = 16, 300


def clustered(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(6, DIM))
    return (centres[rng.integers(6, size=n)] + 0.3 * rng.normal(size=(n, DIM))).astype(np.float32)


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = np.random.default_rng(1).choice(10**9, size=N, replace=False).astype(np.int64)
    return ids, clustered(N, 2), clustered(12, 3)


@pytest.fixture(scope="module", autouse=True)
def embedded_servers() -> Iterator[None]:
    """Stops the module's embedded Milvus servers at its end: milvus-lite stops them at exit
    otherwise, and its log line then meets pytest's closed stream ('--- Logging error ---' and a
    traceback at the end of the run)."""
    from milvus_lite.server_manager import server_manager_instance

    yield
    server_manager_instance.release_all()


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("milvus") / "items.db")


@pytest.fixture(scope="module")
def flat(uri: str, data: tuple[np.ndarray, ...]) -> Iterator[MilvusIndex]:
    ids, vectors, _ = data
    index = MilvusIndex.build(ids, vectors, uri=uri, collection="flat", index_type="FLAT")
    yield index


def test_flat_equals_faiss_exact(flat: MilvusIndex, data: tuple[np.ndarray, ...]) -> None:
    ids, vectors, queries = data
    scores, found = flat.search(queries, 10)
    exact_scores, exact_ids = FaissIndex.build(ids, vectors).search(queries, 10)
    np.testing.assert_array_equal(found, exact_ids)
    np.testing.assert_allclose(scores, exact_scores, rtol=1e-4, atol=1e-4)
    assert flat.is_exact and flat.dim == DIM and flat.ntotal == N
    np.testing.assert_array_equal(flat.ids(), np.sort(ids))


def test_hnsw_recall(uri: str, data: tuple[np.ndarray, ...]) -> None:
    ids, vectors, queries = data
    index = MilvusIndex.build(
        ids, vectors, uri=uri, collection="hnsw", index_type="HNSW",
        index_params={"M": 16, "efConstruction": 64}, search_params={"ef": 64},
    )  # fmt: skip
    assert not index.is_exact
    assert recall_at_k(index, FaissIndex.build(ids, vectors), queries, 10) >= 0.9


def test_filters_never_leak(flat: MilvusIndex, data: tuple[np.ndarray, ...]) -> None:
    ids, vectors, queries = data
    _, best = flat.search(queries[:1], 40)
    for f in [
        SearchFilter.of(exclude=best[0]),
        SearchFilter.of(allow=ids[:15]),
        SearchFilter.of(exclude=ids[:5], allow=ids[:15]),
        SearchFilter.of(allow=[]),
    ]:
        _, found = flat.search(queries, 12, f)
        eligible = int(f.keep(ids).sum())
        for row in found:
            assert f.keep(row[row >= 0]).all() and (row >= 0).sum() == min(12, eligible)
        _, expected = FaissIndex.build(ids, vectors).search(queries, 12, f)
        np.testing.assert_array_equal(found, expected)


def test_add_remove_update_and_persistence(uri: str, data: tuple[np.ndarray, ...], tmp_path: Path) -> None:
    ids, vectors, queries = data
    index = MilvusIndex.build(ids[:100], vectors[:100], uri=uri, collection="live", index_type="FLAT")
    _, best = index.search(queries, 3)
    removed = np.unique(best)
    assert index.remove(removed) == len(removed) and index.remove(removed) == 0
    assert index.ntotal == 100 - len(removed)
    _, found = index.search(queries, 100)
    assert not np.isin(found, removed).any()
    index.add(np.array([7]), queries[:1])
    assert index.search(queries[:1], 1)[1][0, 0] == 7
    with pytest.raises(ValueError, match="already in the index"):
        index.add(np.array([7]), queries[:1])
    index.upsert(np.array([7]), -queries[:1])
    _, top = index.search(queries[:1], 100)
    assert top[0, 0] != 7 and np.count_nonzero(top == 7) <= 1
    assert index.ntotal == 101 - len(removed)

    # The artifact keeps a descriptor (uri, collection); the vectors stay in Milvus.
    save_index(index, tmp_path / "index", "model-v1")
    loaded, manifest = load_index(tmp_path / "index", expected_model_version="model-v1")
    assert manifest["backend"] == "milvus" and isinstance(loaded, MilvusIndex)
    for a, b in zip(loaded.search(queries, 5), index.search(queries, 5), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_search_interests_and_alias_swap(uri: str, flat: MilvusIndex, data: tuple[np.ndarray, ...]) -> None:
    ids, vectors, queries = data
    interests = queries.reshape(3, 4, DIM).copy()
    interests[0, 2:] = 0  # masked interests are skipped
    history = [set(ids[:50].tolist()), set(), {int(ids[60])}]
    expected = search_interests(FaissIndex.build(ids, vectors), interests, 8, history)
    got = search_interests(flat, interests, 8, history)
    np.testing.assert_array_equal(got.ids, expected.ids)
    np.testing.assert_array_equal(got.interests, expected.interests)

    # Re-index without downtime: readers search the alias, which moves to the new collection.
    flat.point_alias("items")
    reader = MilvusIndex.connect(uri, "items")
    assert reader.ntotal == N
    MilvusIndex.build(ids[:10], vectors[:10], uri=uri, collection="flat_v2", index_type="FLAT").point_alias(
        "items"
    )
    assert reader.ntotal == 10


def test_the_descriptor_names_the_token_variable_never_the_token(
    uri: str, data: tuple[np.ndarray, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids, vectors, queries = data
    monkeypatch.setenv("TEAM_MILVUS_TOKEN", "secret-token-value")
    monkeypatch.delenv("MILVUS_TOKEN", raising=False)
    index = MilvusIndex.build(
        ids, vectors, uri=uri, collection="tokened", index_type="FLAT", token_env="TEAM_MILVUS_TOKEN"
    )
    save_index(index, tmp_path / "index", "model-v1")
    descriptor = (tmp_path / "index" / "milvus.json").read_text()
    assert json.loads(descriptor)["token_env"] == "TEAM_MILVUS_TOKEN"
    assert "secret-token-value" not in descriptor
    loaded, _ = load_index(tmp_path / "index")
    np.testing.assert_array_equal(loaded.search(queries, 5)[1], index.search(queries, 5)[1])


def test_a_model_indexed_in_milvus_answers_as_exact_search(uri: str, tmp_path: Path) -> None:
    from retrieval.artifacts import build_index_from_model, build_milvus_index_from_model
    from tests.helpers import FakeModel

    model = FakeModel.make(200, "model-v2")
    index = build_milvus_index_from_model(model, uri, "model_items", index_type="FLAT")
    save_index(index, tmp_path / "index", model)
    loaded, manifest = load_index(tmp_path / "index", expected_model_version="model-v2")
    assert manifest["backend"] == "milvus" and loaded.ntotal == 200  # rows 1..n: never the padding
    queries = model.item_embeddings[1:9] + 0.1
    _, expected = build_index_from_model(model).search(queries, 10)
    np.testing.assert_array_equal(loaded.search(queries, 10)[1], expected)
    with pytest.raises(FileExistsError, match="already exists"):
        build_milvus_index_from_model(model, uri, "model_items")


def test_build_index_tool_writes_a_milvus_artifact(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import retrieval.artifacts
    from retrieval.artifacts import build_index_from_model
    from tests.helpers import FakeModel, run_tool

    model = FakeModel.make(150, "model-v3")
    monkeypatch.setattr(retrieval.artifacts, "load_model", lambda path, verify=True: model)
    out = tmp_path / "index"
    # The fake model is loaded; --model names a folder that exists, as the command checks first.
    flags = ["--model", str(tmp_path), "--out", str(out), "--backend", "milvus", "--uri", uri, "--k", "10"]
    assert run_tool("build_index", *flags, "--index-type", "FLAT", "--token-env", "TEAM_TOKEN") == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["backend"] == "milvus" and summary["recall@10_vs_exact"] == 1.0  # FLAT is exact
    # As a server starting later finds it: written by another client, released since.
    MilvusIndex.connect(uri, "items_model_v3")._client.release_collection("items_model_v3")
    loaded, _ = load_index(out, expected_model_version="model-v3")
    queries = model.item_embeddings[1:6] + 0.1
    np.testing.assert_array_equal(
        loaded.search(queries, 5)[1], build_index_from_model(model).search(queries, 5)[1]
    )
    assert isinstance(loaded, MilvusIndex) and loaded.collection == "items_model_v3"
    assert json.loads((out / "milvus.json").read_text())["token_env"] == "TEAM_TOKEN"
    for bad in (
        ["--backend", "milvus"],
        ["--uri", uri],
        ["--backend", "milvus", "--uri", uri, "--factory", "auto"],
    ):
        with pytest.raises(SystemExit) as refused:
            run_tool("build_index", "--model", "m", "--out", str(tmp_path / "x"), *bad)
        assert refused.value.code == 2
