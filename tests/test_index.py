"""FaissIndex against numpy brute force on small clustered data."""

from __future__ import annotations

import numpy as np
import pytest

from index import FaissIndex, recall_at_k

DIM = 16


def clustered(n: int, seed: int, clusters: int = 8) -> np.ndarray:
    """float32 [n, DIM]: unit vectors around ``clusters`` centres (ANN indexes need structure)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, DIM))
    x = centres[rng.integers(clusters, size=n)] + 0.3 * rng.normal(size=(n, DIM))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def brute_force(ids: np.ndarray, vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    """Oracle: (scores [n, k], ids [n, k]) by a full inner-product sort."""
    scores = queries @ vectors.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), ids[order]


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # Sparse, unordered ids: the index must return these, not row numbers.
    ids = np.random.default_rng(1).choice(10**12, size=400, replace=False).astype(np.int64)
    return ids, clustered(400, seed=2), clustered(30, seed=3)


def test_flat_equals_brute_force(data: tuple[np.ndarray, ...]) -> None:
    ids, vectors, queries = data
    index = FaissIndex.build(ids, vectors, "Flat")
    scores, found = index.search(queries, 10)
    expected_scores, expected_ids = brute_force(ids, vectors, queries, 10)
    assert found.dtype == np.int64 and scores.dtype == np.float32
    np.testing.assert_array_equal(found, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-6)
    assert index.is_exact and index.dim == DIM and index.ntotal == 400


@pytest.mark.parametrize(
    ("factory", "search_params", "tolerance"),
    [("HNSW16", "efSearch=64", 0.95), ("IVF8,Flat", "nprobe=4", 0.9)],
)
def test_approximate_recall(
    data: tuple[np.ndarray, ...], factory: str, search_params: str, tolerance: float
) -> None:
    ids, vectors, queries = data
    index = FaissIndex.build(ids, vectors, factory, search_params)
    exact = FaissIndex.build(ids, vectors, "Flat")
    assert not index.is_exact
    assert recall_at_k(index, exact, queries, 10) >= tolerance
    assert recall_at_k(exact, exact, queries, 10) == 1.0


def test_fewer_than_k_pads() -> None:
    vectors = clustered(3, seed=4)
    index = FaissIndex.build(np.array([7, 8, 9]), vectors, "Flat")
    scores, ids = index.search(vectors[:2], 5)
    assert ids.shape == scores.shape == (2, 5)
    assert set(ids[0, :3]) == {7, 8, 9} and ids[0, 0] == 7  # a unit vector scores itself best
    np.testing.assert_array_equal(ids[:, 3:], -1)
    assert np.all(np.isneginf(scores[:, 3:])) and np.all(np.isfinite(scores[:, :3]))


def test_idmap_prefix_is_optional(data: tuple[np.ndarray, ...]) -> None:
    ids, vectors, _ = data
    assert (
        FaissIndex.build(ids, vectors, "IDMap2,Flat").describe() == FaissIndex.build(ids, vectors).describe()
    )


def test_save_load_round_trip(data: tuple[np.ndarray, ...], tmp_path) -> None:
    ids, vectors, queries = data
    index = FaissIndex.build(ids, vectors, "HNSW16", "efSearch=64")
    index.save(tmp_path / "index.faiss")
    loaded = FaissIndex.load(tmp_path / "index.faiss", index.factory, index.search_params)
    assert (
        loaded.describe()
        == index.describe()
        == {
            "factory": "HNSW16",
            "search_params": "efSearch=64",
            "metric": "inner_product",
            "dim": DIM,
            "count": 400,
            "is_exact": False,
        }
    )
    for a, b in zip(loaded.search(queries, 10), index.search(queries, 10), strict=True):
        np.testing.assert_array_equal(a, b)


def test_load_rejects_garbage(tmp_path) -> None:
    (tmp_path / "index.faiss").write_bytes(b"not an index")
    with pytest.raises(ValueError, match="not a readable FAISS index"):
        FaissIndex.load(tmp_path / "index.faiss", "Flat")


@pytest.mark.parametrize(
    ("ids", "vectors", "factory", "search_params", "message"),
    [
        (np.arange(4), np.zeros((4, DIM)), "Flat", "", "vectors must be float32"),
        (np.arange(4), np.zeros(4, np.float32), "Flat", "", r"shape \[n, d\]"),
        (np.arange(3), np.zeros((4, DIM), np.float32), "Flat", "", r"ids must be integers of shape \(4,\)"),
        (np.linspace(0, 1, 4), np.zeros((4, DIM), np.float32), "Flat", "", "ids must be integers"),
        (np.array([1, 2, 2, 3]), np.zeros((4, DIM), np.float32), "Flat", "", "unique"),
        (np.arange(0), np.zeros((0, DIM), np.float32), "Flat", "", "no vectors"),
        (np.arange(4), np.zeros((4, DIM), np.float32), "Nonsense42", "", "cannot build"),
        (np.arange(4), np.zeros((4, DIM), np.float32), "IVF64,Flat", "", "cannot build"),  # too few to train
        (np.arange(4), np.zeros((4, DIM), np.float32), "IDMap,Flat", "", "IDMap2"),
        (np.arange(4), np.zeros((4, DIM), np.float32), "HNSW8", "nprobe=4", "do not apply"),
    ],
)
def test_build_rejects_bad_input(
    ids: np.ndarray, vectors: np.ndarray, factory: str, search_params: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        FaissIndex.build(ids, vectors, factory, search_params)


@pytest.mark.parametrize(
    ("queries", "k", "message"),
    [
        (np.zeros((2, DIM)), 3, "queries must be float32"),
        (np.zeros((2, DIM + 1), np.float32), 3, rf"shape \[n, {DIM}\]"),
        (np.zeros(DIM, np.float32), 3, rf"shape \[n, {DIM}\]"),
        (np.zeros((2, DIM), np.float32), 0, "k must be a positive integer"),
        (np.zeros((2, DIM), np.float32), -1, "k must be a positive integer"),
        (np.zeros((2, DIM), np.float32), 2.0, "k must be a positive integer"),
    ],
)
def test_search_rejects_bad_input(
    data: tuple[np.ndarray, ...], queries: np.ndarray, k: int, message: str
) -> None:
    ids, vectors, _ = data
    with pytest.raises(ValueError, match=message):
        FaissIndex.build(ids[:4], vectors[:4]).search(queries, k)
