"""Auto-tuning: the cheapest index and search parameters that reach a recall target.

Recall@k is measured against exact search (the oracle) on the query vectors given, which
should be real user-interest vectors: item vectors as queries find themselves first and flatter
every approximate index. Cost is the p99 latency of one request, i.e. one search of
``batch_size`` vectors (a user's K interests searched as one batch).

Recall grows with the search effort (``nprobe``, ``efSearch``), so each candidate index sweeps
its effort upwards and stops at the first setting that reaches the target; the candidate whose
stopping point has the lowest p99 wins.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import faiss
import numpy as np

from index.base import check_matrix
from index.faiss_index import FaissIndex, recall_of

log = logging.getLogger(__name__)

HNSW_MAX_AUTO_ITEMS = 300_000
"""``--factory auto`` leaves HNSW out above this size: at 1M items the HNSW that reaches recall 0.99
(``L2MIPS,HNSW32``) took 123.9 s to build on two loaded cores, over the 60 s build budget, and IVF
reaches the same recall (index benchmark, ``python -m bench.index``, docs/benchmarks.md)."""


@dataclass(frozen=True)
class OperatingPoint:
    """One measured (index, search parameters) setting.

    Attributes:
        factory: FAISS factory string.
        search_params: FAISS parameter string (``""`` for none).
        recall: mean recall@k against exact search over the tuning queries.
        p50_ms: median latency of one request (``batch_size`` query vectors).
        p99_ms: 99th-percentile latency of one request.
        build_seconds: time to train and fill the index.
    """

    factory: str
    search_params: str
    recall: float
    p50_ms: float
    p99_ms: float
    build_seconds: float

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("recall",):
            out[key] = round(out[key], 5)
        for key in ("p50_ms", "p99_ms", "build_seconds"):
            out[key] = round(out[key], 4)
        return out


@dataclass(frozen=True)
class TuningResult:
    """What :func:`tune` chose, and everything it measured on the way.

    Attributes:
        index: the chosen index, built and configured with the chosen search parameters.
        chosen: its measured operating point.
        reached: whether ``chosen.recall >= target_recall``.
        target_recall: the target.
        k: the recall cut-off.
        tried: every point measured, in order.
        num_queries: query vectors recall was measured on.
        batch_size: query vectors per timed request.
        threads: FAISS threads during the latency measurement.
        max_build_seconds: the build budget the choice respected (``None``: none).
    """

    index: FaissIndex
    chosen: OperatingPoint
    reached: bool
    target_recall: float
    k: int
    tried: tuple[OperatingPoint, ...]
    num_queries: int
    batch_size: int
    threads: int
    max_build_seconds: float | None = None

    def summary(self) -> dict[str, Any]:
        """JSON-ready record for an index manifest."""
        return {
            "target_recall": self.target_recall,
            "reached": self.reached,
            "k": self.k,
            "num_queries": self.num_queries,
            "batch_size": self.batch_size,
            "threads": self.threads,
            "max_build_seconds": self.max_build_seconds,
            "chosen": self.chosen.to_json(),
            "tried": [p.to_json() for p in self.tried],
        }


def nlist_choices(n: int) -> list[int]:
    """Coarse-cluster counts worth trying for ``n`` vectors: powers of two near ``sqrt(n)`` and
    ``4 sqrt(n)``, keeping at least 39 training points per cluster."""
    if n < 39 * 16:
        return []
    out = []
    for factor in (1, 4):
        nlist = 2 ** round(math.log2(factor * math.sqrt(n)))
        nlist = min(nlist, 2 ** int(math.log2(n // 39)))
        if nlist >= 16 and nlist not in out:
            out.append(nlist)
    return out


def candidate_factories(n: int, d: int) -> list[str]:
    """The index types ``factory="auto"`` compares for ``n`` vectors of dimension ``d``.

    Flat is always there (exact, so it always reaches the target); IVF-Flat with the
    MIPS-to-L2 reduction (``L2MIPS,``, see :mod:`index.faiss_index`) at the nlist choices and,
    for comparison, plain inner-product IVF-Flat at the larger one; IVF-PQ with ``d/2``
    one-byte sub-quantizers (a quarter of Flat's memory, usually short of 0.99 recall at
    k = 50; ``np``: no polysemous training, which takes minutes); the ``L2MIPS`` IVF with 4-bit
    fast-scan PQ codes, one per dimension (``PQ{d+1}x4fs``, scored in SIMD registers), whose
    shortlist is re-ranked exactly (``RFlat``: it keeps the vectors, so it costs Flat's memory
    and more, for speed);
    HNSW32 up to :data:`HNSW_MAX_AUTO_ITEMS` items.
    """
    out = ["Flat"]
    nlists = nlist_choices(n)
    out += [f"L2MIPS,IVF{nlist},Flat" for nlist in nlists]
    if nlists:
        out.append(f"IVF{nlists[-1]},Flat")
    if n <= HNSW_MAX_AUTO_ITEMS:
        out.append("HNSW32")
    if nlists and d % 2 == 0 and n >= 256 * 39:
        out.append(f"IVF{nlists[-1]},PQ{d // 2}np")
        out.append(f"L2MIPS,IVF{nlists[-1]},PQ{d + 1}x4fs,RFlat")
    return out


REFINE_FACTORS = (4, 16, 64)
"""Shortlist sizes (× k) an index with an exact re-ranking stage (``RFlat``) is tried with: 4-bit
codes rank coarsely, and re-ranking a longer shortlist exactly costs little next to the scan."""


def search_param_grid(index: FaissIndex, k: int) -> list[str]:
    """Search settings from cheapest to most thorough for ``index`` (``[""]`` when it has none)."""
    ivf = faiss.try_extract_index_ivf(index.faiss_index.index)
    if ivf is not None:
        top = int(ivf.nlist)
        probes = [f"nprobe={p}" for p in _powers_of_two(1, top)] + (
            [f"nprobe={top}"] if top & (top - 1) else []
        )
        if isinstance(faiss.downcast_index(index.faiss_index.index), faiss.IndexRefine):
            return [f"{p},k_factor_rf={f}" for p in probes for f in REFINE_FACTORS]
        return probes
    inner = faiss.downcast_index(index.faiss_index.index)
    if isinstance(inner, faiss.IndexHNSW):
        return [f"efSearch={e}" for e in _powers_of_two(max(16, 2 ** math.ceil(math.log2(k))), 4096)]
    return [index.search_params]


def _powers_of_two(low: int, high: int) -> list[int]:
    return [2**e for e in range(int(math.log2(low)), int(math.log2(high)) + 1)]


def exact_neighbours(ids: np.ndarray, vectors: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Ground truth: int64 ``[n, k]`` ids of the top-``k`` inner products (brute force)."""
    flat = faiss.IndexFlatIP(vectors.shape[1])
    flat.add(vectors)
    _, rows = flat.search(queries, min(k, len(vectors)))
    out = np.full((len(queries), k), -1, np.int64)
    out[:, : rows.shape[1]] = np.where(rows >= 0, ids[rows], -1)
    return out


def measure_latency(
    index: FaissIndex,
    queries: np.ndarray,
    k: int,
    batch_size: int = 4,
    max_requests: int = 400,
    rounds: int = 3,
    threads: int | None = None,
) -> tuple[float, float]:
    """(p50, p99) milliseconds of one ``index.search`` of ``batch_size`` query vectors.

    The requests are timed ``rounds`` times and the median of each percentile is kept, so one
    burst of load from another process on a small machine does not decide a tuning choice.
    ``threads``: FAISS threads while timing (restored afterwards); ``None`` leaves them as set.
    """
    before = faiss.omp_get_max_threads()
    if threads is not None:
        faiss.omp_set_num_threads(threads)
    try:
        return _measure_latency(index, queries, k, batch_size, max_requests, rounds)
    finally:
        faiss.omp_set_num_threads(before)


def _measure_latency(
    index: FaissIndex, queries: np.ndarray, k: int, batch_size: int, max_requests: int, rounds: int
) -> tuple[float, float]:
    requests = max(1, min(max_requests, len(queries) // batch_size))
    for r in range(min(20, requests)):  # warm-up: caches, OpenMP threads
        index.search(queries[r * batch_size : (r + 1) * batch_size], k)
    p50s, p99s = [], []
    for _ in range(rounds):
        times = np.empty(requests)
        for r in range(requests):
            batch = queries[r * batch_size : (r + 1) * batch_size]
            start = time.perf_counter()
            index.search(batch, k)
            times[r] = time.perf_counter() - start
        p50s.append(np.percentile(times, 50) * 1e3)
        p99s.append(np.percentile(times, 99) * 1e3)
    return float(np.median(p50s)), float(np.median(p99s))


def _cost(point: OperatingPoint, max_build_seconds: float | None) -> tuple[bool, float, float]:
    """Sort key among points reaching the target: within the build budget first, then p99."""
    over = max_build_seconds is not None and point.build_seconds > max_build_seconds
    return over, point.p99_ms, point.build_seconds


def tune(
    ids: np.ndarray,
    vectors: np.ndarray,
    queries: np.ndarray,
    k: int = 50,
    target_recall: float = 0.99,
    factories: Sequence[str] | str = "auto",
    *,
    batch_size: int = 4,
    train_size: int | None = None,
    seed: int = 0,
    max_latency_requests: int = 400,
    latency_threads: int | None = 1,
    max_build_seconds: float | None = None,
) -> TuningResult:
    """Builds the candidate indexes and returns the cheapest one reaching ``target_recall``.

    Args:
        ids: unique int ids ``[n]``.
        vectors: float32 ``[n, d]`` item vectors.
        queries: float32 ``[q, d]`` query vectors (real user interests; zero rows are dropped).
            Consecutive groups of ``batch_size`` rows form one timed request.
        k: recall cut-off.
        target_recall: recall@k to reach, in ``(0, 1]``.
        factories: ``"auto"`` (see :func:`candidate_factories`), one factory string, or a list.
        batch_size: query vectors per request (K interests).
        train_size: training-sample size for IVF/PQ (default: FaissIndex's).
        seed: training-sample seed.
        max_latency_requests: requests timed per operating point.
        max_build_seconds: prefer indexes built within this time: a slower one is chosen only
            when no faster-built index reaches the target.
        latency_threads: FAISS threads while timing (``None``: as configured). One by default:
            a request is only K vectors, and OpenMP threads waiting on a busy machine turn a
            0.3 ms search into 15 ms, which would decide the choice by noise.

    Returns:
        The chosen index and the measurements. When no candidate reaches the target the
        best-recall point is returned with ``reached=False`` (``"auto"`` always includes Flat,
        which reaches any target).

    Example:
        >>> result = tune(ids, item_vectors, user_interests.reshape(-1, d), k=50, target_recall=0.99)
        >>> result.chosen.factory, result.chosen.search_params  # ('IVF1024,Flat', 'nprobe=16')
    """
    vectors = check_matrix(vectors, "vectors")
    queries = _tuning_queries(check_matrix(queries, "queries", vectors.shape[1]), target_recall)
    ids = np.asarray(ids, np.int64)
    if isinstance(factories, str):
        factories = (
            candidate_factories(len(vectors), vectors.shape[1]) if factories == "auto" else [factories]
        )
    truth = exact_neighbours(ids, vectors, queries, k)
    threads = faiss.omp_get_max_threads() if latency_threads is None else latency_threads
    bench = _Bench(queries, truth, k, batch_size, max_latency_requests, threads)
    choice = _Choice(target_recall, max_build_seconds)
    for factory in factories:
        start = time.perf_counter()
        try:
            index = FaissIndex.build(ids, vectors, factory, train_size=train_size, seed=seed)
        except ValueError as e:
            log.warning("skipping %s: %s", factory, e)
            continue
        _sweep(index, factory, time.perf_counter() - start, bench, choice)
    chosen = choice.best or choice.fallback
    if chosen is None:
        raise ValueError(f"no index could be built from {list(factories)}")
    point, index = chosen
    return TuningResult(
        index=index,
        chosen=point,
        reached=choice.best is not None,
        target_recall=target_recall,
        k=k,
        tried=tuple(choice.tried),
        num_queries=len(queries),
        batch_size=batch_size,
        threads=threads,
        max_build_seconds=max_build_seconds,
    )


def _tuning_queries(queries: np.ndarray, target_recall: float) -> np.ndarray:
    """The non-zero query rows; refuses a target outside ``(0, 1]`` or no such row."""
    if not 0 < target_recall <= 1:
        raise ValueError(f"target_recall must be in (0, 1], got {target_recall}")
    queries = queries[np.any(queries != 0, axis=1)]
    if not len(queries):
        raise ValueError("no non-zero query vectors to tune on")
    return queries


@dataclass(frozen=True)
class _Bench:
    """How :func:`tune` measures a point: recall@``k`` of ``queries`` against ``truth``, then latency."""

    queries: np.ndarray
    truth: np.ndarray
    k: int
    batch_size: int
    max_requests: int
    threads: int

    def measure(self, index: FaissIndex, factory: str, params: str, build_seconds: float) -> OperatingPoint:
        """``index`` set to ``params``, measured (and logged)."""
        index.set_search_params(params)
        _, found = index.search(self.queries, self.k)
        recall = recall_of(found, self.truth)
        p50, p99 = measure_latency(
            index, self.queries, self.k, self.batch_size, self.max_requests, threads=self.threads
        )
        log.info(
            "%-16s %-14s recall@%d %.4f  p50 %.3f ms  p99 %.3f ms", factory, params, self.k, recall, p50, p99
        )
        return OperatingPoint(factory, params, recall, p50, p99, build_seconds)


@dataclass
class _Choice:
    """The points measured so far, the cheapest reaching the target, and the best recall short of it."""

    target_recall: float
    max_build_seconds: float | None
    tried: list[OperatingPoint] = field(default_factory=list)
    best: tuple[OperatingPoint, FaissIndex] | None = None
    fallback: tuple[OperatingPoint, FaissIndex] | None = None

    def cheaper(self, point: OperatingPoint) -> bool:
        """Whether ``point`` costs less than the best point so far (:func:`_cost`), or there is none."""
        if self.best is None:
            return True
        return _cost(point, self.max_build_seconds) < _cost(self.best[0], self.max_build_seconds)


def _sweep(index: FaissIndex, factory: str, build_seconds: float, bench: _Bench, choice: _Choice) -> None:
    """Measures ``index`` from its cheapest search setting up to the first reaching the target
    (or one dearer than the best so far), and leaves it at its setting ``choice`` keeps."""
    for params in search_param_grid(index, bench.k):
        point = bench.measure(index, factory, params, build_seconds)
        choice.tried.append(point)
        if point.recall >= choice.target_recall:
            if choice.cheaper(point):
                choice.best = (point, index)
            break
        if choice.best is None and (choice.fallback is None or point.recall > choice.fallback[0].recall):
            choice.fallback = (point, index)
        if choice.best is not None and point.p50_ms > choice.best[0].p99_ms:
            break  # already dearer than the best point that reaches the target
    # Leave the index at its cheapest setting reaching the target (or its best recall).
    for kept in (choice.best, choice.fallback):  # the best point first: it may share the index
        if kept is not None and kept[1] is index:
            index.set_search_params(kept[0].search_params)
            break
