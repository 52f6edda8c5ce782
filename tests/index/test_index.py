"""FaissIndex against numpy brute force on small clustered data: search, filters, updates, files."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from index import FaissIndex, SearchFilter, estimate_memory, recall_at_k

DIM = 16


@pytest.fixture(autouse=True)
def one_faiss_thread() -> Iterator[None]:
    """Tiny indexes: OpenMP threads only add contention on a shared 2-core machine."""
    import faiss

    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(threads)


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


@pytest.mark.parametrize("factory", ["Flat", "L2MIPS,Flat"])
def test_an_exhaustive_index_scores_a_query_the_same_in_any_batch(factory: str) -> None:
    # A batch this large would go to FAISS's BLAS product, whose last bits depend on the other
    # rows: an exact index must answer each query bit for bit as it does alone.
    rng = np.random.default_rng(5)
    vectors = rng.normal(size=(300, 64)).astype(np.float32)
    index = FaissIndex.build(np.arange(1, 301), vectors, factory)
    queries = rng.normal(size=(100, 64)).astype(np.float32)
    scores, ids = index.search(queries, 10)
    alone = [index.search(queries[i : i + 1], 10) for i in range(len(queries))]
    np.testing.assert_array_equal(scores, np.vstack([s for s, _ in alone]))
    np.testing.assert_array_equal(ids, np.vstack([i for _, i in alone]))


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
            "backend": "faiss",
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


# Every kind of FAISS index the backend must handle: exhaustive, graph, inverted lists, codes,
# a pre-transform (no IDSelector: over-fetch path) and refinement (no remove_ids: relabelling).
FACTORIES = [
    ("Flat", "", 1.0),
    ("HNSW16", "efSearch=64", 0.95),
    ("IVF8,Flat", "nprobe=4", 0.9),
    ("IVF8,PQ8x4", "nprobe=8", 0.5),  # 4-bit codes: 8-bit PQ trains for seconds on this data
    ("RR16,IVF8,Flat", "nprobe=4", 0.85),  # a random rotation: an untrained pre-transform
    ("IVF8,PQ4x4,RFlat", "nprobe=8,k_factor_rf=8", 0.9),
    ("L2MIPS,IVF8,Flat", "nprobe=4", 0.9),  # our MIPS-to-L2 reduction
    ("L2MIPS,HNSW16", "efSearch=64", 0.95),
]


@pytest.fixture(scope="module", params=FACTORIES, ids=[f[0] for f in FACTORIES])
def any_index(request: pytest.FixtureRequest, data: tuple[np.ndarray, ...]) -> tuple[FaissIndex, float]:
    factory, search_params, tolerance = request.param
    ids, vectors, _ = data
    return FaissIndex.build(ids, vectors, factory, search_params), tolerance


def test_every_factory_against_exact(
    any_index: tuple[FaissIndex, float], data: tuple[np.ndarray, ...]
) -> None:
    index, tolerance = any_index
    ids, vectors, queries = data
    exact = FaissIndex.build(ids, vectors, "Flat")
    assert recall_at_k(index, exact, queries, 10) >= tolerance
    _, found = index.search(queries, 10)
    assert set(found.ravel().tolist()) <= set(ids.tolist())  # external ids, never row numbers


def brute_force_filtered(
    ids: np.ndarray, vectors: np.ndarray, queries: np.ndarray, k: int, keep: np.ndarray
) -> tuple[np.ndarray, ...]:
    """Oracle over the rows ``keep`` selects."""
    return brute_force(ids[keep], vectors[keep], queries, k)


@pytest.mark.parametrize("factory", [f[0] for f in FACTORIES])
def test_filters_never_leak_and_fill_k(factory: str, data: tuple[np.ndarray, ...]) -> None:
    ids, vectors, queries = data
    search_params = dict((f, p) for f, p, _ in FACTORIES)[factory]
    index = FaissIndex.build(ids, vectors, factory, search_params)
    _, best = FaissIndex.build(ids, vectors).search(queries[:1], 60)
    rng = np.random.default_rng(5)
    cases = {
        # the 60 best items of query 0 and a random third of the rest: the filter must do the work
        "exclude": SearchFilter.of(exclude=np.union1d(best[0], rng.choice(ids, 130, replace=False))),
        "small allow-list": SearchFilter.of(allow=rng.choice(ids, 25, replace=False)),
        "large allow-list": SearchFilter.of(allow=rng.choice(ids, 300, replace=False)),
        "allow and exclude": SearchFilter.of(exclude=best[0], allow=rng.choice(ids, 200, replace=False)),
        "allow-list of 3": SearchFilter.of(allow=ids[:3]),
    }
    for name, f in cases.items():
        scores, found = index.search(queries, 20, f)
        eligible = int(f.keep(ids).sum())
        for row, row_scores in zip(found, scores, strict=True):
            real = row[row >= 0]
            assert f.keep(real).all(), f"{name}: a filtered id came back"
            assert len(real) == min(20, eligible), f"{name}: {len(real)} results, {eligible} eligible"
            assert len(set(real.tolist())) == len(real)
            assert np.all(np.diff(row_scores[: len(real)]) <= 1e-6), f"{name}: not best first"
        if index.is_exact:
            _, expected_ids = brute_force_filtered(ids, vectors, queries, 20, f.keep(ids))
            np.testing.assert_array_equal(found[:, : expected_ids.shape[1]], expected_ids)


def test_flat_filter_equals_brute_force_with_scores(data: tuple[np.ndarray, ...]) -> None:
    ids, vectors, queries = data
    f = SearchFilter.of(exclude=ids[::3], allow=ids[:200])
    scores, found = FaissIndex.build(ids, vectors).search(queries, 10, f)
    expected_scores, expected_ids = brute_force_filtered(ids, vectors, queries, 10, f.keep(ids))
    np.testing.assert_array_equal(found, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-6)


def test_filter_with_nothing_allowed_pads(data: tuple[np.ndarray, ...]) -> None:
    ids, vectors, queries = data
    scores, found = FaissIndex.build(ids, vectors).search(queries, 5, SearchFilter.of(allow=[], exclude=[1]))
    assert np.all(found == -1) and np.all(np.isneginf(scores))


@pytest.mark.parametrize("factory", [f[0] for f in FACTORIES])
def test_add_remove_update(factory: str, data: tuple[np.ndarray, ...], tmp_path: Path) -> None:
    ids, vectors, queries = data
    search_params = dict((f, p) for f, p, _ in FACTORIES)[factory]
    index = FaissIndex.build(ids[:300], vectors[:300], factory, search_params)

    # Remove the items each query likes best: they must never come back, whatever k.
    _, best = index.search(queries, 5)
    removed = np.unique(best)
    assert index.remove(removed) == len(removed)
    assert index.remove(removed) == 0  # already gone
    assert index.ntotal == 300 - len(removed)
    _, found = index.search(queries, 300)
    assert not np.isin(found, removed).any()
    assert (found[:, 0] >= 0).all()  # still searchable
    np.testing.assert_array_equal(index.ids(), np.setdiff1d(ids[:300], removed))

    # Add new items; one of them equals a query, so it must rank first for that query.
    new_ids = np.array([10**13, 10**13 + 1])
    new_vectors = np.stack([queries[0], -queries[0]]).astype(np.float32)
    index.add(new_ids, new_vectors)
    assert index.ntotal == 302 - len(removed)
    assert index.search(queries[:1], 1)[1][0, 0] == new_ids[0]
    with pytest.raises(ValueError, match="already in the index"):
        index.add(new_ids[:1], new_vectors[:1])

    # Update: the id keeps its place in the catalogue, its vector changes.
    index.upsert(new_ids, new_vectors[::-1].copy())
    assert index.ntotal == 302 - len(removed)
    _, top = index.search(queries[:1], 300)
    assert top[0, 0] != new_ids[0] and new_ids[1] in top[0, :3]
    assert np.count_nonzero(top[0] == new_ids[1]) == 1  # the old vector left no second copy

    # A removed id can come back through add.
    index.add(removed[:1], queries[1:2])
    assert index.search(queries[1:2], 1)[1][0, 0] == removed[0]

    # The state survives a save/load round trip (removed HNSW nodes stay removed).
    index.save(tmp_path / "index.faiss")
    mips_norm = index.describe().get("mips_norm")  # kept in the manifest beside the file
    loaded = FaissIndex.load(tmp_path / "index.faiss", factory, search_params, mips_norm=mips_norm)
    assert loaded.ntotal == index.ntotal and loaded.describe() == index.describe()
    if mips_norm is not None:  # without it, M is read back from a stored vector
        recovered = FaissIndex.load(tmp_path / "index.faiss", factory, search_params)
        assert recovered.describe()["mips_norm"] == pytest.approx(mips_norm, rel=1e-5)
    np.testing.assert_array_equal(loaded.ids(), index.ids())
    _, again = loaded.search(queries, 300)
    assert not np.isin(again, removed[1:]).any()
    # Every vector still stored is the one its id was last given.
    keep = np.setdiff1d(ids[:300], removed)
    np.testing.assert_allclose(
        loaded.faiss_index.reconstruct_batch(keep[:20]) if factory in ("Flat", "HNSW16") else 0,
        vectors[:300][np.argsort(ids[:300])][np.searchsorted(np.sort(ids[:300]), keep[:20])]
        if factory in ("Flat", "HNSW16")
        else 0,
    )


def test_hnsw_removal_is_reported(data: tuple[np.ndarray, ...]) -> None:
    ids, vectors, _ = data
    index = FaissIndex.build(ids, vectors, "HNSW16")
    index.remove(ids[:10])
    assert index.describe()["removed_pending"] == 10 and index.ntotal == 390
    np.testing.assert_array_equal(index.ids(), np.sort(ids[10:]))


def test_searches_concurrent_with_updates_never_see_removed_ids(data: tuple[np.ndarray, ...]) -> None:
    ids, vectors, queries = data
    index = FaissIndex.build(ids, vectors, "HNSW16", "efSearch=32")
    removed: set[int] = set()
    errors: list[str] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            gone = set(removed)  # removed before this search started
            _, found = index.search(queries, 20)
            if leaked := gone & set(found.ravel().tolist()):
                errors.append(f"removed ids {sorted(leaked)[:3]} came back")

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for chunk in np.array_split(ids[:200], 20):
        index.remove(chunk)
        removed.update(chunk.tolist())
    done.set()
    for t in threads:
        t.join()
    assert not errors


def test_load_refuses_truncated_and_foreign_files(data: tuple[np.ndarray, ...], tmp_path: Path) -> None:
    ids, vectors, _ = data
    FaissIndex.build(ids, vectors, "IVF8,Flat").save(tmp_path / "index.faiss")
    whole = (tmp_path / "index.faiss").read_bytes()
    for cut in (0, 3, 10, 100, len(whole) // 2, len(whole) - 1):
        (tmp_path / "cut.faiss").write_bytes(whole[:cut])
        with pytest.raises(ValueError, match="not a readable FAISS index"):
            FaissIndex.load(tmp_path / "cut.faiss")
    # A FAISS index without IDMap2 (ids would be row numbers) is refused before FAISS reads it.
    import faiss

    faiss.write_index(faiss.IndexFlatIP(DIM), str(tmp_path / "plain.faiss"))
    with pytest.raises(ValueError, match="expected an IDMap2 index"):
        FaissIndex.load(tmp_path / "plain.faiss")
    with pytest.raises(ValueError, match="not a readable FAISS index"):
        FaissIndex.load(tmp_path / "missing.faiss")


@pytest.mark.parametrize("factory", ["Flat", "HNSW16", "IVF16,Flat", "IVF16,PQ8x4", "PQ8x4", "IVF16,SQ8"])
def test_memory_estimate_matches_serialized_size(factory: str, tmp_path: Path) -> None:
    n = 2000
    vectors = clustered(n, seed=6)
    FaissIndex.build(np.arange(n), vectors, factory).save(tmp_path / "index.faiss")
    actual = (tmp_path / "index.faiss").stat().st_size
    estimate = estimate_memory(factory, n, DIM)
    assert estimate.disk_bytes == pytest.approx(actual, rel=0.05)
    assert estimate.memory_bytes > estimate.disk_bytes
    # Flat: 4 d bytes per vector + 8 for the id (+ 40 for the in-memory id hash map).
    if factory == "Flat":
        assert estimate.per_vector_bytes - 40 == 4 * DIM + 8


def test_memory_estimate_scales_and_rejects_unknown() -> None:
    small, large = estimate_memory("IVF4096,PQ32", 10**5, 64), estimate_memory("IVF4096,PQ32", 10**6, 64)
    assert large.disk_bytes - small.disk_bytes == pytest.approx(9 * 10**5 * (32 + 8 + 8), rel=1e-6)
    assert "MiB" in str(large)
    with pytest.raises(ValueError, match="unknown component"):
        estimate_memory("LSH", 10, 8)


def test_l2mips_returns_inner_products(data: tuple[np.ndarray, ...]) -> None:
    ids, vectors, queries = data
    scaled = vectors * np.linspace(0.5, 2.0, len(vectors), dtype=np.float32)[:, None]  # varied norms
    index = FaissIndex.build(ids, scaled, "L2MIPS,Flat")
    scores, found = index.search(queries, 10)
    expected_scores, expected_ids = brute_force(ids, scaled, queries, 10)
    np.testing.assert_array_equal(found, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-4, atol=1e-4)
    assert index.is_exact and index.dim == DIM
    # M leaves 10% headroom for added items; beyond it the reduction breaks, so it is refused.
    norm = index.describe()["mips_norm"]
    index.add(np.array([1]), (queries[:1] / np.linalg.norm(queries[:1]) * norm * 0.99).astype(np.float32))
    with pytest.raises(ValueError, match="exceeds this L2MIPS index's M"):
        index.add(np.array([2]), (queries[:1] * norm * 2).astype(np.float32))


def test_failed_upsert_changes_nothing(data: tuple[np.ndarray, ...]) -> None:
    ids, vectors, queries = data
    index = FaissIndex.build(ids, vectors, "L2MIPS,HNSW16")
    before = index.search(queries, 5)
    with pytest.raises(ValueError, match="exceeds"):
        index.upsert(ids[:2], 10 * vectors[:2])
    assert index.ntotal == len(ids)
    for a, b in zip(index.search(queries, 5), before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_sorted_update_matches_set_arithmetic() -> None:
    from index import sorted_update

    rng = np.random.default_rng(0)
    for _ in range(50):
        ids = np.unique(rng.integers(0, 200, size=int(rng.integers(0, 80))))
        remove, add = (
            rng.integers(0, 220, size=int(rng.integers(0, 20))),
            rng.integers(0, 220, size=int(rng.integers(0, 20))),
        )
        want = np.union1d(np.setdiff1d(ids, remove), add)
        got = sorted_update(ids, remove, add)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.int64


def test_fast_scan_with_exact_refinement_reaches_the_target_on_clustered_vectors() -> None:
    """``--factory auto`` proposes the L2MIPS IVF with 4-bit fast-scan codes and an exact
    re-ranking stage; its grid sweeps the shortlist with nprobe, and it reaches recall 0.95 on
    clustered vectors of varied norms."""
    from index import candidate_factories, exact_neighbours, recall_of, tune
    from index.tuning import search_param_grid

    assert "L2MIPS,IVF4096,PQ65x4fs,RFlat" in candidate_factories(1_000_000, 64)
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(50, 16)).astype(np.float32)
    x = centers[rng.integers(50, size=20_000)] + 0.3 * rng.normal(size=(20_000, 16))
    x = (x * rng.uniform(0.3, 2.0, size=(20_000, 1))).astype(np.float32)  # norms vary, as learned ones
    ids = np.arange(1, 20_001)
    result = tune(ids, x, x[:200] + 0.1, k=10, target_recall=0.95, factories=["L2MIPS,IVF64,PQ17x4fs,RFlat"])
    assert result.reached and "k_factor_rf=" in result.chosen.search_params
    assert search_param_grid(result.index, 10)[:2] == ["nprobe=1,k_factor_rf=4", "nprobe=1,k_factor_rf=16"]
    _, found = result.index.search(x[:200] + 0.1, 10)
    assert recall_of(found, exact_neighbours(ids, x, x[:200] + 0.1, 10)) >= 0.95
