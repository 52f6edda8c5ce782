"""Inner-product FAISS index over int64 ids, described by a factory string and search parameters.

The index structure is a FAISS factory string (``"Flat"``, ``"HNSW32"``, ``"IVF1024,Flat"``,
``"OPQ16,IVF4096,PQ16"``) and the search-time knobs a FAISS parameter string (``"nprobe=16"``,
``"efSearch=128"``), so that an index is reproducible from two short strings. Ids are kept by
``IDMap2``, which, unlike ``IDMap``, can also reconstruct a stored vector from its id.

Filters run inside FAISS through an ``IDSelector`` where the index supports one (Flat, PQ, SQ,
IVF, HNSW); elsewhere (pre-transforms such as OPQ, refinement) the search over-fetches and
drops the filtered ids. Small allow-lists are searched exactly over their own vectors, and any
query an approximate filtered search leaves short of ``k`` is answered exactly over the
allowed items, so ``k`` results come back whenever ``k`` items pass the filter.

Maximum inner product is not a nearest-neighbour problem, and IVF clustering by inner product
on learned embeddings (whose norms vary with popularity) is badly unbalanced: on a trained
ComiRec model scaled to 50k items, ``IVF1024,Flat`` needs nprobe=64 for recall@50 0.83. The
``L2MIPS,`` prefix (ours, not FAISS's) applies the classic reduction to L2 search (Bachrach et
al., 2014): items ``x -> [x, sqrt(M^2 - |x|^2)]``, queries ``q -> [q, 0]``, so the nearest
item in L2 has the largest inner product; the same IVF then reaches 0.997 at nprobe=8. Scores
come back as inner products, ``(|q|^2 + M^2 - L2) / 2``. ``M`` is the largest item norm times
:data:`MIPS_HEADROOM`, so later additions up to that norm still fit.

Removal uses FAISS's ``remove_ids`` for flat storage (Flat, PQ, SQ). Elsewhere a removed item's
id is relabelled to a negative number, which every search filters out, so it never comes back:
HNSW cannot remove nodes (the node keeps routing the graph walk), and ``IDMap2`` over IVF
removes the wrong vectors after a first removal (IVF keeps stale row numbers in its lists).
Rebuilding compacts relabelled entries away (``describe()["removed_pending"]`` counts them).
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Collection
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from index.base import (
    METRIC,
    SearchFilter,
    VectorIndex,
    as_id_array,
    check_ids,
    check_k,
    check_matrix,
    members,
    sorted_update,
)

_FAISS: Any = faiss  # for the parts of FAISS its type stubs leave out
_IDMAP = "IDMap2,"
_IDMAP2_FOURCC = b"IxM2"
MIPS = "L2MIPS,"
MIPS_HEADROOM = 1.1
"""``M`` = largest item norm at build time x this: room for added items with larger norms."""
SMALL_ALLOW_LIST = 4096
"""Allow-lists up to this size are searched exactly over their own vectors (cheaper than
walking the index, and never short of results)."""
EXACT_FALLBACK_MAX = 65_536
"""A query an approximate search leaves short of ``k`` is answered exactly when at most this many
items pass its filter (a scan of that many stored vectors costs a few milliseconds)."""
_EXACT_CHUNK = 65_536
BLAS_THRESHOLD = 1024
"""FAISS computes the distances of a search to a flat set of vectors as one BLAS matrix product
when queries × dimensions reach this (16 queries of 64 dimensions), query by query below it;
its own default (128,000) is far above a serving batch. An IVF index's coarse quantizer is such
a search, and for a micro-batch's queries the matrix product is several times faster
(``python -m bench.floor`` times the search). Set when this module is imported. A BLAS
product's last bits depend on the other rows of the batch, so exhaustive (``Flat``) indexes
are searched in groups below the threshold, which keeps each query's scores independent of
its batch; in an IVF index those bits only rank the centroids to probe."""
_FAISS.cvar.distance_compute_blas_threshold = BLAS_THRESHOLD


def parse_search_params(search_params: str) -> dict[str, float]:
    """``"nprobe=16,efSearch=64"`` -> ``{"nprobe": 16, "efSearch": 64}`` (FAISS ``ParameterSpace`` syntax)."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in search_params.split(","))):
        name, sep, value = part.partition("=")
        try:
            if not sep:
                raise ValueError
            out[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"search parameter {part!r} is not name=number") from None
    return out


def default_train_size(factory: str, n: int) -> int:
    """Training-sample size for ``factory`` over ``n`` vectors.

    k-means needs about 40 points per centroid to be stable; 64 per coarse centroid (at least
    65,536, what FAISS's PQ training samples anyway) keeps training a 1M catalogue in seconds
    instead of the minute k-means over every vector would take.
    """
    nlist = max((int(p[3:].split("_")[0]) for p in factory.split(",") if _is_ivf(p)), default=0)
    return min(n, max(64 * nlist, 65_536))


def _is_ivf(part: str) -> bool:
    return part.startswith("IVF") and part[3:4].isdigit()


class FaissIndex(VectorIndex):
    """Maximum-inner-product search over vectors with int64 ids (FAISS backend).

    Build one with :meth:`build` or read one with :meth:`load`; the constructor wraps an
    existing FAISS ``IndexIDMap2``.

    Example:
        >>> index = FaissIndex.build(np.arange(1, 101), vectors, "HNSW32", "efSearch=128")
        >>> scores, ids = index.search(queries, k=10)  # float32 [n, 10], int64 [n, 10]
        >>> index.search(queries, 10, SearchFilter.of(exclude={3, 4}))
    """

    def __init__(
        self,
        index: faiss.Index,
        factory: str | None = None,
        search_params: str = "",
        *,
        mips_norm: float | None = None,
    ) -> None:
        """Wraps ``index`` and applies ``search_params`` to it.

        Args:
            index: a trained FAISS ``IndexIDMap2`` with inner-product metric.
            factory: the factory string it was built from (without the ``IDMap2,`` prefix);
                ``None`` names it by its FAISS class.
            search_params: FAISS ``ParameterSpace`` string, e.g. ``"nprobe=16"``; ``""`` for none.
            mips_norm: ``M`` of an ``L2MIPS,`` index (L2 metric over ``d + 1`` dimensions);
                ``None`` reads it back from a stored vector (all have norm ``M``).

        Raises:
            TypeError: ``index`` is not an ``IDMap2``.
            ValueError: ``index`` is not inner-product or a parameter does not apply to it.
        """
        # No faiss.downcast_index here: index_factory and read_index already return the concrete
        # class, and a downcast copy would let the owning wrapper free the index under us.
        if not isinstance(index, faiss.IndexIDMap2):
            raise TypeError(f"expected a FAISS IndexIDMap2, got {type(index).__name__}")
        self._mips = factory is not None and factory.startswith(MIPS)
        expected = faiss.METRIC_L2 if self._mips else faiss.METRIC_INNER_PRODUCT
        if index.metric_type != expected:
            raise ValueError(
                f"expected an {'L2 (L2MIPS)' if self._mips else 'inner-product'} index, "
                f"got FAISS metric {index.metric_type}"
            )
        self._index = index
        self._exhaustive = isinstance(faiss.downcast_index(index.index), faiss.IndexFlat)  # read per search
        self._mapped = False  # set by load(mmap=True): the vectors are the file's pages, read-only
        self._factory = factory if factory is not None else type(faiss.downcast_index(index.index)).__name__
        self._mips_norm = mips_norm
        self._search_params = ""
        self.set_search_params(search_params)
        labels = self._labels()
        self._live = np.sort(labels[labels >= 0])
        self._dead = int((labels < 0).sum())
        self._selector_ok: bool | None = None  # learnt on the first filtered search
        self._direct_map_lock = threading.Lock()
        self._direct_map_ready = False
        if self._mips and self._mips_norm is None and len(self._live):
            self._ensure_direct_map()
            self._mips_norm = float(np.linalg.norm(self._index.reconstruct(int(self._live[0]))))

    # ----------------------------------------------------------------------------------- build

    @classmethod
    def build(
        cls,
        ids: np.ndarray,
        vectors: np.ndarray,
        factory: str = "Flat",
        search_params: str = "",
        *,
        train_size: int | None = None,
        seed: int = 0,
    ) -> FaissIndex:
        """Indexes ``vectors`` under ``ids``, training the index first when it needs training.

        Args:
            ids: unique non-negative integer ids ``[n]`` (stored as int64).
            vectors: float32 ``[n, d]``; a random sample of them trains trainable indexes.
            factory: FAISS factory string; an ``IDMap2,`` prefix is added when missing.
            search_params: FAISS ``ParameterSpace`` string applied to every search.
            train_size: vectors sampled to train IVF/PQ (default :func:`default_train_size`).
            seed: seed of that sample.

        Raises:
            ValueError: bad shapes or dtypes, duplicate ids, an invalid factory string, too few
                vectors to train, or parameters that do not apply.
        """
        vectors = check_matrix(vectors, "vectors")
        ids = check_ids(ids, len(vectors))
        if len(vectors) == 0:
            raise ValueError("no vectors to index")
        index = cls.empty(vectors.shape[1], factory)
        inner = index._index
        if index._mips:
            index._mips_norm = float(np.linalg.norm(vectors, axis=1).max()) * MIPS_HEADROOM
        try:
            if not inner.is_trained:
                size = default_train_size(index.factory, len(vectors)) if train_size is None else train_size
                sample = vectors
                if size < len(vectors):
                    rows = np.random.default_rng(seed).choice(len(vectors), size, replace=False)
                    sample = vectors[np.sort(rows)]
                inner.train(index._augment(sample))
        except RuntimeError as e:
            raise ValueError(
                f"cannot build FAISS index {index.factory!r} on {vectors.shape} vectors: {e}"
            ) from e
        index.set_search_params(search_params)
        index.add(ids, vectors)
        return index

    @classmethod
    def empty(cls, dim: int, factory: str = "Flat") -> FaissIndex:
        """An untrained, empty index (train it through :meth:`build`, or add to a ``Flat`` one)."""
        factory = factory.strip().removeprefix(_IDMAP)
        mips = factory.startswith(MIPS)
        if factory.removeprefix(MIPS).startswith("IDMap"):
            raise ValueError(f"factory {factory!r}: ids are kept with IDMap2, leave the IDMap prefix out")
        try:
            index = faiss.index_factory(
                dim + mips,
                _IDMAP + factory.removeprefix(MIPS),
                faiss.METRIC_L2 if mips else faiss.METRIC_INNER_PRODUCT,
            )
        except RuntimeError as e:
            raise ValueError(f"cannot build FAISS index {factory!r}: {e}") from e
        return cls(index, factory)

    def set_search_params(self, search_params: str) -> None:
        """Applies a FAISS ``ParameterSpace`` string (``"nprobe=32"``) to every later search."""
        parse_search_params(search_params)  # a clear error for malformed strings
        with self._write_lock():
            try:
                # faiss's stub lists the (index, str) overload without @overload.
                faiss.ParameterSpace().set_index_parameters(self._index, search_params)  # type: ignore[arg-type]
            except RuntimeError as e:
                raise ValueError(
                    f"search parameters {search_params!r} do not apply to {self._factory!r}: {e}"
                ) from e
            self._search_params = search_params

    # --------------------------------------------------------------------------------- updates

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        vectors = check_matrix(vectors, "vectors", self.dim)
        ids = check_ids(ids, len(vectors))
        if not len(ids):
            return
        self._check_writable()
        with self._write_lock():
            clash = ids[members(ids, self._live)]
            if len(clash):
                raise ValueError(
                    f"{len(clash)} ids are already in the index (e.g. {clash[:5].tolist()}): use upsert"
                )
            if not self._index.is_trained:
                raise ValueError(f"{self._factory!r} is not trained: build it with FaissIndex.build")
            try:
                if self._mips and self._mips_norm is None:
                    self._mips_norm = float(np.linalg.norm(vectors, axis=1).max()) * MIPS_HEADROOM
                self._index.add_with_ids(self._augment(vectors), ids)
            except RuntimeError as e:
                raise ValueError(f"cannot add to {self._factory!r}: {e}") from e
            self._live = sorted_update(self._live, add=ids)

    def upsert(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Adds items, replacing the vectors of ids already present; all or nothing."""
        vectors = check_matrix(vectors, "vectors", self.dim)
        ids = check_ids(ids, len(vectors))
        with self._write_lock():
            if self._mips_norm is not None:
                self._augment(vectors)  # a vector too long for L2MIPS fails before anything is removed
            self.remove(ids)
            self.add(ids, vectors)

    def remove(self, ids: Collection[int] | np.ndarray) -> int:
        self._check_writable()
        with self._write_lock():
            wanted = as_id_array(ids)
            present = wanted[members(wanted, self._live)]
            if not len(present):
                return 0
            if isinstance(faiss.downcast_index(self._index.index), faiss.IndexFlatCodes):
                # Flat/PQ/SQ remove rows in place, in the same order IDMap2 compacts its ids.
                self._index.remove_ids(faiss.IDSelectorBatch(len(present), faiss.swig_ptr(present)))
            else:
                # HNSW cannot remove nodes, and IDMap2 over IVF removes the wrong rows once one
                # removal has shifted its table (IVF keeps the old row numbers in its lists):
                # relabel the entries to negative ids, which every search filters out.
                labels = self._labels()
                rows = np.flatnonzero(members(labels, present))
                labels[rows] = -2 - rows
                self._index.construct_rev_map()
                self._dead += len(rows)
            self._live = sorted_update(self._live, remove=present)
            return len(present)

    def _check_writable(self) -> None:
        """Raises ``ValueError`` for a memory-mapped index: FAISS would write into the file's
        read-only pages (and crash the process)."""
        if self._mapped:
            raise ValueError(f"this {self._factory!r} index is memory-mapped (read-only): change a copy()")

    # ---------------------------------------------------------------------------------- search

    def search(
        self, queries: np.ndarray, k: int, filter: SearchFilter | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        queries = check_matrix(queries, "queries", self.dim)
        check_k(k)
        with self._read_lock():
            return self._search(queries, k, None if filter is None or filter.is_empty else filter)

    def _search(
        self, queries: np.ndarray, k: int, filter: SearchFilter | None
    ) -> tuple[np.ndarray, np.ndarray]:
        scores = np.full((len(queries), k), -np.inf, np.float32)
        ids = np.full((len(queries), k), -1, np.int64)
        if not len(queries) or not len(self._live):
            return scores, ids
        if filter is None and not self._dead:
            fetch = min(k, self._index.ntotal)
            found_scores, found_ids = self._raw_search(queries, fetch)
            _fill(scores, ids, found_scores, found_ids)
            return scores, ids

        want = min(k, self._eligible_count(filter))
        if want == 0:
            return scores, ids
        if filter is not None and filter.allow is not None and len(filter.allow) <= SMALL_ALLOW_LIST:
            return self._exact(queries, self._eligible(filter), k)
        fetch = min(k, self._index.ntotal)
        selector = self._supports_selector()
        if selector:
            found_scores, found_ids = self._search_selected(queries, fetch, filter)
        else:
            found_scores, found_ids = self._search_overfetch(queries, k, want, filter)
        _fill(scores, ids, found_scores, found_ids)
        # An approximate walk may meet fewer than k allowed items (a narrow filter, few probes):
        # search those queries again with more effort, then exactly over the allowed items
        # when there are few enough of them to scan.
        short = np.flatnonzero((ids >= 0).sum(axis=1) < want)
        for effort in (4, 16, 64) if selector else ():
            if not len(short):
                break
            found_scores, found_ids = self._search_selected(queries[short], fetch, filter, effort)
            retry_scores, retry_ids = scores[short], ids[short]
            _fill(retry_scores, retry_ids, found_scores, found_ids)
            scores[short], ids[short] = retry_scores, retry_ids
            short = short[(retry_ids >= 0).sum(axis=1) < want]
        if len(short) and self._eligible_count(filter) <= EXACT_FALLBACK_MAX:
            scores[short], ids[short] = self._exact(queries[short], self._eligible(filter), k)
        return scores, ids

    def _eligible(self, filter: SearchFilter | None) -> np.ndarray:
        """Sorted live ids that pass ``filter`` (``O(n)`` without an allow-list: fallback only)."""
        if filter is None:
            return self._live
        if filter.allow is not None:
            allowed = filter.allow[members(filter.allow, self._live)]
            return allowed[~members(allowed, filter.exclude)]
        return self._live[~members(self._live, filter.exclude)]

    def _eligible_count(self, filter: SearchFilter | None) -> int:
        """``len(self._eligible(filter))`` in ``O(m log n)`` for ``m`` filtered ids: this runs on
        every filtered request, over catalogues of millions."""
        if filter is None:
            return len(self._live)
        if filter.allow is not None:
            return len(self._eligible(filter))
        return len(self._live) - int(members(filter.exclude, self._live).sum())

    def _supports_selector(self) -> bool:
        if self._selector_ok is None:
            probe = np.zeros((1, self.dim), np.float32)
            everything = faiss.IDSelectorAll()
            try:
                self._raw_search(probe, 1, self._params(everything))
                self._selector_ok = True
            except RuntimeError:
                self._selector_ok = False
        return self._selector_ok

    def _params(self, selector: faiss.IDSelector, effort: int = 1) -> faiss.SearchParameters:
        """Search parameters carrying ``selector`` and the index's own knobs (a bare
        ``SearchParametersIVF`` would reset nprobe to 1), ``nprobe``/``efSearch`` times ``effort``."""
        # faiss's type stubs lack these constructors' keywords and SearchParametersHNSW: set
        # the fields one by one through Any.
        inner = faiss.downcast_index(self._index.index)
        params: Any
        if isinstance(inner, faiss.IndexIVF):
            params = faiss.SearchParametersIVF()
            params.nprobe = min(inner.nlist, inner.nprobe * effort)
            params.max_codes = inner.max_codes
        elif isinstance(inner, faiss.IndexHNSW):
            params = _FAISS.SearchParametersHNSW()
            params.efSearch = inner.hnsw.efSearch * effort
        else:
            params = faiss.SearchParameters()
        params.sel = selector
        return params

    def _search_selected(
        self, queries: np.ndarray, fetch: int, filter: SearchFilter | None, effort: int = 1
    ) -> tuple[np.ndarray, np.ndarray]:
        """One FAISS search with the filter (and the removed-id guard) as an ``IDSelector``."""
        keep_alive: list[faiss.IDSelector] = []  # SWIG does not keep sub-selectors alive
        conditions: list[faiss.IDSelector] = []
        if self._dead:
            conditions.append(faiss.IDSelectorRange(0, np.iinfo(np.int64).max))
        if filter is not None and filter.allow is not None:
            allow = np.ascontiguousarray(filter.allow)
            conditions.append(faiss.IDSelectorBatch(len(allow), faiss.swig_ptr(allow)))
        if filter is not None and len(filter.exclude):
            exclude = np.ascontiguousarray(filter.exclude)
            banned = faiss.IDSelectorBatch(len(exclude), faiss.swig_ptr(exclude))
            keep_alive.append(banned)
            conditions.append(faiss.IDSelectorNot(banned))
        keep_alive += conditions
        selector = conditions[0]
        for condition in conditions[1:]:
            selector = faiss.IDSelectorAnd(selector, condition)
            keep_alive.append(selector)
        return self._raw_search(queries, fetch, self._params(selector, effort))

    def _search_overfetch(
        self, queries: np.ndarray, k: int, want: int, filter: SearchFilter | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Unfiltered searches with a growing ``k`` until every query keeps ``want`` results."""
        total = self._index.ntotal
        extra = self._dead + (len(filter.exclude) if filter is not None else 0)
        fetch = min(total, k + extra if filter is None or filter.allow is None else 4 * k + extra)
        while True:
            found_scores, found_ids = self._raw_search(queries, fetch)
            keep = found_ids >= 0
            if filter is not None:
                keep &= filter.keep(found_ids)
            if fetch >= total or (keep.sum(axis=1) >= want).all():
                break
            fetch = min(total, 4 * fetch)
        # Move each row's kept results to the front, in order.
        order = np.argsort(~keep, axis=1, kind="stable")[:, :k]
        kept = np.take_along_axis(keep, order, axis=1)
        out_ids = np.where(kept, np.take_along_axis(found_ids, order, axis=1), -1)
        out_scores = np.where(kept, np.take_along_axis(found_scores, order, axis=1), -np.inf)
        return out_scores.astype(np.float32), out_ids

    def _exact(self, queries: np.ndarray, candidates: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Brute force over the stored (reconstructed) vectors of ``candidates``."""
        self._ensure_direct_map()
        best_scores = np.full((len(queries), 0), -np.inf, np.float32)
        best_ids = np.zeros((len(queries), 0), np.int64)
        for start in range(0, len(candidates), _EXACT_CHUNK):
            chunk = np.ascontiguousarray(candidates[start : start + _EXACT_CHUNK])
            vectors = self._index.reconstruct_batch(chunk)[:, : self.dim]  # L2MIPS: drop the extra coordinate
            chunk_scores = queries @ vectors.T  # [n, chunk]
            best_scores = np.concatenate([best_scores, chunk_scores], axis=1)
            best_ids = np.concatenate([best_ids, np.broadcast_to(chunk, chunk_scores.shape)], axis=1)
            if best_scores.shape[1] > k:
                top = np.argpartition(-best_scores, k - 1, axis=1)[:, :k]
                best_scores = np.take_along_axis(best_scores, top, axis=1)
                best_ids = np.take_along_axis(best_ids, top, axis=1)
        # Best first; ties broken by the smaller id, as a sort over all candidates would.
        order = np.lexsort((best_ids, -best_scores), axis=1)
        scores = np.full((len(queries), k), -np.inf, np.float32)
        ids = np.full((len(queries), k), -1, np.int64)
        n = best_scores.shape[1]
        scores[:, :n] = np.take_along_axis(best_scores, order, axis=1)
        ids[:, :n] = np.take_along_axis(best_ids, order, axis=1)
        return scores, ids

    def _raw_search(
        self, queries: np.ndarray, k: int, params: faiss.SearchParameters | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """FAISS search returning inner products (converted back from L2 for ``L2MIPS``); an
        exhaustive index's queries go in groups below :data:`BLAS_THRESHOLD`."""
        group = max(1, (BLAS_THRESHOLD - 1) // self._index.d)
        if self.is_exact and len(queries) > group:
            found = [
                self._raw_search(queries[i : i + group], k, params) for i in range(0, len(queries), group)
            ]
            return np.vstack([f[0] for f in found]), np.vstack([f[1] for f in found])
        if not self._mips:
            return self._index.search(queries, k, params=params)
        augmented = np.hstack([queries, np.zeros((len(queries), 1), np.float32)])
        distances, ids = self._index.search(augmented, k, params=params)
        norms = (queries.astype(np.float64) ** 2).sum(axis=1, keepdims=True)
        scores = (norms + (self._mips_norm or 0.0) ** 2 - distances) / 2
        return np.where(ids >= 0, scores, -np.inf).astype(np.float32), ids

    def _augment(self, vectors: np.ndarray) -> np.ndarray:
        """``L2MIPS``: ``[x, sqrt(M^2 - |x|^2)]``, float32 ``[n, d + 1]``; other indexes: ``vectors``."""
        if not self._mips:
            return vectors
        assert self._mips_norm is not None
        squared = check_mips_norm(vectors, self._mips_norm)
        extra = np.sqrt(np.maximum(self._mips_norm**2 - squared, 0.0))[:, None]
        return np.ascontiguousarray(np.hstack([vectors, extra]), np.float32)

    def _ensure_direct_map(self) -> None:
        """IVF indexes reconstruct by id only with a direct map; build one the first time.

        An array map: adds keep it up to date, and IVF rows are never removed here (see
        :meth:`remove`), which is the one thing an array map cannot follow. (FAISS's hash-table
        map loses rows added after it was built.)
        """
        if self._direct_map_ready:
            return
        with self._direct_map_lock:
            # Searches only read the inverted lists, so building the map under a read lock is safe.
            ivf = faiss.try_extract_index_ivf(self._index.index)
            if ivf is not None and ivf.direct_map.type == _FAISS.DirectMap.NoMap:
                ivf.set_direct_map_type(_FAISS.DirectMap.Array)
            self._direct_map_ready = True

    # ------------------------------------------------------------------------------ properties

    @property
    def is_exact(self) -> bool:
        """True when searches are exhaustive (``Flat``), so results equal brute force."""
        return self._exhaustive

    @property
    def dim(self) -> int:
        return int(self._index.d) - self._mips

    @property
    def ntotal(self) -> int:
        """Number of live (searchable) items."""
        return len(self._live)

    def ids(self) -> np.ndarray:
        return self._live.copy()

    @property
    def factory(self) -> str:
        """Factory string without the ``IDMap2,`` prefix, e.g. ``"HNSW32"``."""
        return self._factory

    @property
    def search_params(self) -> str:
        return self._search_params

    @property
    def faiss_index(self) -> faiss.IndexIDMap2:
        """The wrapped FAISS index (for benchmarks; do not mutate it behind this object)."""
        return self._index

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary: backend, factory, search_params, metric, dim, count, is_exact.

        ``removed_pending`` (removed items still occupying graph nodes) appears once there are any.
        """
        out: dict[str, Any] = {
            "backend": "faiss",
            "factory": self.factory,
            "search_params": self.search_params,
            "metric": METRIC,
            "dim": self.dim,
            "count": self.ntotal,
            "is_exact": self.is_exact,
        }
        if self._mips:
            out["mips_norm"] = self._mips_norm
        if self._dead:
            out["removed_pending"] = self._dead
        return out

    # ----------------------------------------------------------------------------- persistence

    def copy(self) -> FaissIndex:
        """An independent copy in memory (FAISS ``clone_index``): changing one leaves the other as
        it was. A memory-mapped index is copied through its serialised form: ``clone_index``
        would share its read-only pages."""
        with self._read_lock():
            if self._mapped:
                clone = faiss.deserialize_index(faiss.serialize_index(self._index))
            else:
                clone = faiss.clone_index(self._index)
            return FaissIndex(clone, self._factory, self._search_params, mips_norm=self._mips_norm)

    def save(self, path: Path) -> None:
        """Writes the index to the file ``path`` in FAISS's own format (the factory string is not
        part of it: keep it beside the file; search parameters such as nprobe are).

        Raises:
            OSError: the file could not be written (a full disk, a file size limit).
        """
        with self._read_lock():
            try:
                faiss.write_index(self._index, str(path))
            except RuntimeError as e:  # FAISS reports failed writes as RuntimeError
                cause = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
                raise OSError(errno.EIO, cause.split("Error: ")[-1], str(path)) from e

    @classmethod
    def load(
        cls,
        path: Path,
        factory: str | None = None,
        search_params: str = "",
        *,
        mips_norm: float | None = None,
        mmap: bool = False,
    ) -> FaissIndex:
        """Reads a file written by :meth:`save`.

        With ``mmap`` the stored vectors (flat codes, IVF lists; FAISS's ``IO_FLAG_MMAP_IFC``)
        stay in the file and are read through a read-only shared mapping: processes serving the
        same file share its pages instead of holding a copy each. Such an index cannot be
        changed (``add``, ``upsert`` and ``remove`` raise ``ValueError``); :meth:`copy` gives a
        changeable one. The file must not be changed in place while it is mapped.

        The header is checked before FAISS parses anything, so a foreign or empty file is
        refused with a clear message; a truncated one fails in FAISS's reader, whose error is
        turned into the same ``ValueError``.

        Raises:
            ValueError: the file is missing, not an ``IDMap2`` FAISS index, truncated, or not an
                inner-product one.
        """
        path = Path(path)
        try:
            with open(path, "rb") as f:
                header = f.read(4)
        except OSError as e:
            raise ValueError(f"{path} is not a readable FAISS index: {e}") from e
        if header != _IDMAP2_FOURCC:
            raise ValueError(
                f"{path} is not a readable FAISS index: expected an IDMap2 index (header "
                f"{_IDMAP2_FOURCC!r}), found {header!r}"
            )
        try:
            index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC if mmap else 0)
        except RuntimeError as e:
            last = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise ValueError(f"{path} is not a readable FAISS index (truncated or corrupted?): {last}") from e
        loaded = cls(index, factory, search_params, mips_norm=mips_norm)
        loaded._mapped = mmap
        return loaded

    def _labels(self) -> np.ndarray:
        """A writable view of IDMap2's row -> id table, int64 ``[rows]``."""
        rows = self._index.id_map.size()
        if rows == 0:
            return np.zeros(0, np.int64)
        return faiss.rev_swig_ptr(self._index.id_map.data(), rows)


def _fill(scores: np.ndarray, ids: np.ndarray, found_scores: np.ndarray, found_ids: np.ndarray) -> None:
    """Copies FAISS results into padded outputs; FAISS marks missing results with id -1 and
    score -FLT_MAX, and -inf cannot be mistaken for a real score."""
    n = found_ids.shape[1]
    ids[:, :n] = found_ids
    scores[:, :n] = np.where(found_ids < 0, -np.inf, found_scores)


def check_mips_norm(vectors: np.ndarray, norm: float) -> np.ndarray:
    """The squared norms of ``vectors`` (float64 ``[n]``), all within an ``L2MIPS`` index's ``M``.

    Raises:
        ValueError: a vector is longer than ``norm``.
    """
    squared = (np.asarray(vectors, np.float64) ** 2).sum(axis=1)
    if len(squared) and squared.max() > norm**2 * (1 + 1e-6):
        raise ValueError(
            f"a vector of norm {np.sqrt(squared.max()):.4g} exceeds this L2MIPS index's M = "
            f"{norm:.4g}: rebuild the index (M is fixed at build time)"
        )
    return squared


def recall_at_k(index: VectorIndex, exact: VectorIndex, queries: np.ndarray, k: int) -> float:
    """Mean fraction of ``exact``'s top-``k`` ids that ``index`` also returns in its top-``k``.

    Args:
        index: the index to measure (usually approximate).
        exact: an exact index over the same ids and vectors.
        queries: float32 ``[n, d]``.
        k: cut-off.
    """
    _, found = index.search(queries, k)
    _, truth = exact.search(queries, k)
    return recall_of(found, truth)


def recall_of(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean over rows of ``|found ∩ truth| / |truth|`` (``-1`` padding ignored); int ``[n, k]`` each."""
    hits = [len(np.intersect1d(f[f >= 0], t[t >= 0])) for f, t in zip(found, truth, strict=True)]
    relevant = np.maximum((truth >= 0).sum(axis=1), 1)
    return float(np.mean(np.asarray(hits) / relevant)) if len(hits) else 1.0
