"""Inner-product FAISS index over int64 ids, described by a factory string and search parameters.

The index structure is a FAISS factory string (``"Flat"``, ``"HNSW32"``, ``"IVF1024,Flat"``)
and the search-time knobs a FAISS parameter string (``"nprobe=16"``, ``"efSearch=128"``), so
that an index is reproducible from two short strings. Ids are kept by ``IDMap2``, which,
unlike ``IDMap``, can also reconstruct a stored vector from its id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import faiss
import numpy as np

METRIC = "inner_product"
_IDMAP = "IDMap2,"


class FaissIndex:
    """Maximum-inner-product search over vectors with int64 ids.

    Build one with :meth:`build` or read one with :meth:`load`; the constructor wraps an
    existing FAISS ``IndexIDMap2``.

    Example:
        >>> index = FaissIndex.build(np.arange(1, 101), vectors, "HNSW32", "efSearch=128")
        >>> scores, ids = index.search(queries, k=10)  # float32 [n, 10], int64 [n, 10]
    """

    def __init__(self, index: faiss.Index, factory: str, search_params: str = "") -> None:
        """Wraps ``index`` and applies ``search_params`` to it.

        Args:
            index: a trained FAISS ``IndexIDMap2`` with inner-product metric.
            factory: the factory string it was built from (without the ``IDMap2,`` prefix).
            search_params: FAISS ``ParameterSpace`` string, e.g. ``"nprobe=16"``; ``""`` for none.

        Raises:
            TypeError: ``index`` is not an ``IDMap2``.
            ValueError: ``index`` is not inner-product or a parameter does not apply to it.
        """
        # No faiss.downcast_index here: index_factory and read_index already return the concrete
        # class, and a downcast copy would let the owning wrapper free the index under us.
        if not isinstance(index, faiss.IndexIDMap2):
            raise TypeError(f"expected a FAISS IndexIDMap2, got {type(index).__name__}")
        if index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise ValueError(f"expected an inner-product index, got FAISS metric {index.metric_type}")
        try:
            # Set once here: searches may run concurrently, and FAISS indexes are only safe
            # for concurrent reads.
            # faiss's stub lists the (index, str) overload without @overload.
            faiss.ParameterSpace().set_index_parameters(index, search_params)  # type: ignore[arg-type]
        except RuntimeError as e:
            raise ValueError(f"search parameters {search_params!r} do not apply to {factory!r}: {e}") from e
        self._index = index
        self._factory = factory
        self._search_params = search_params

    @classmethod
    def build(
        cls, ids: np.ndarray, vectors: np.ndarray, factory: str = "Flat", search_params: str = ""
    ) -> FaissIndex:
        """Indexes ``vectors`` under ``ids``, training the index first when it needs training.

        Args:
            ids: unique integer ids ``[n]`` (stored as int64).
            vectors: float32 ``[n, d]``, also the training set of trainable indexes (IVF, PQ).
            factory: FAISS factory string; an ``IDMap2,`` prefix is added when missing.
            search_params: FAISS ``ParameterSpace`` string applied to every search.

        Raises:
            ValueError: bad shapes or dtypes, duplicate ids, an invalid factory string, too few
                vectors to train, or parameters that do not apply.
        """
        vectors = _check_matrix(vectors, "vectors")
        ids = np.asarray(ids)
        if not np.issubdtype(ids.dtype, np.integer) or ids.shape != (len(vectors),):
            raise ValueError(f"ids must be integers of shape ({len(vectors)},), got {ids.dtype} {ids.shape}")
        if len(vectors) == 0:
            raise ValueError("no vectors to index")
        if len(np.unique(ids)) != len(ids):
            # IDMap2 would accept duplicates and return the same id twice.
            raise ValueError("ids must be unique")
        factory = factory.removeprefix(_IDMAP)
        if factory.startswith("IDMap"):
            raise ValueError(f"factory {factory!r}: ids are kept with IDMap2, leave the IDMap prefix out")
        try:
            index = faiss.index_factory(vectors.shape[1], _IDMAP + factory, faiss.METRIC_INNER_PRODUCT)
            if not index.is_trained:
                index.train(vectors)
            index.add_with_ids(vectors, ids.astype(np.int64))
        except RuntimeError as e:
            raise ValueError(f"cannot build FAISS index {factory!r} on {vectors.shape} vectors: {e}") from e
        return cls(index, factory, search_params)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ids by inner product for each query.

        Args:
            queries: float32 ``[n, d]``.
            k: results per query, ``>= 1``; may exceed :attr:`ntotal`.

        Returns:
            ``(scores float32 [n, k], ids int64 [n, k])``, best first; slots without a result
            hold id ``-1`` and score ``-inf``.
        """
        queries = _check_matrix(queries, "queries", self.dim)
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k <= 0:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        scores = np.full((len(queries), k), -np.inf, np.float32)
        ids = np.full((len(queries), k), -1, np.int64)
        fetch = min(k, self.ntotal)
        if fetch and len(queries):
            found_scores, found_ids = self._index.search(queries, fetch)
            # FAISS marks missing results with id -1 and score -FLT_MAX; -inf cannot be
            # mistaken for a real score.
            scores[:, :fetch] = np.where(found_ids < 0, -np.inf, found_scores)
            ids[:, :fetch] = found_ids
        return scores, ids

    @property
    def is_exact(self) -> bool:
        """True when searches are exhaustive (``Flat``), so results equal brute force."""
        return isinstance(faiss.downcast_index(self._index.index), faiss.IndexFlat)

    @property
    def dim(self) -> int:
        return int(self._index.d)

    @property
    def ntotal(self) -> int:
        """Number of indexed vectors."""
        return int(self._index.ntotal)

    @property
    def factory(self) -> str:
        """Factory string without the ``IDMap2,`` prefix, e.g. ``"HNSW32"``."""
        return self._factory

    @property
    def search_params(self) -> str:
        return self._search_params

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary: factory, search_params, metric, dim, count, is_exact."""
        return {
            "factory": self.factory,
            "search_params": self.search_params,
            "metric": METRIC,
            "dim": self.dim,
            "count": self.ntotal,
            "is_exact": self.is_exact,
        }

    def save(self, path: Path) -> None:
        """Writes the index to the file ``path`` in FAISS's own format (factory and parameters
        are not part of it: keep them beside the file)."""
        faiss.write_index(self._index, str(path))

    @classmethod
    def load(cls, path: Path, factory: str, search_params: str = "") -> FaissIndex:
        """Reads a file written by :meth:`save`.

        Raises:
            ValueError: the file is not a FAISS index, or not an inner-product one.
            TypeError: the index is not an ``IDMap2``.
        """
        try:
            index = faiss.read_index(str(path))
        except RuntimeError as e:
            raise ValueError(f"{path} is not a readable FAISS index: {e}") from e
        return cls(index, factory, search_params)


def recall_at_k(index: FaissIndex, exact: FaissIndex, queries: np.ndarray, k: int) -> float:
    """Mean fraction of ``exact``'s top-``k`` ids that ``index`` also returns in its top-``k``.

    Args:
        index: the index to measure (usually approximate).
        exact: an exact index over the same ids and vectors.
        queries: float32 ``[n, d]``.
        k: cut-off.
    """
    _, found = index.search(queries, k)
    _, truth = exact.search(queries, k)
    hits = [len(np.intersect1d(f[f >= 0], t[t >= 0])) for f, t in zip(found, truth, strict=True)]
    relevant = np.maximum((truth >= 0).sum(axis=1), 1)
    return float(np.mean(np.asarray(hits) / relevant))


def _check_matrix(x: np.ndarray, name: str, dim: int | None = None) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise ValueError(f"{name} must be float32, got {x.dtype}")
    if x.ndim != 2 or (dim is not None and x.shape[1] != dim):
        expected = f"[n, {dim}]" if dim is not None else "[n, d]"
        raise ValueError(f"{name} must have shape {expected}, got {list(x.shape)}")
    return np.ascontiguousarray(x)
