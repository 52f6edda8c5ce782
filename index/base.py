"""The index interface every backend implements, and the filter a search can carry.

A backend stores float32 vectors under unique int64 ids and answers maximum-inner-product
queries. Evaluation, tuning and serving only talk to :class:`VectorIndex`, so FAISS on one
machine and Milvus for a sharded catalogue are interchangeable.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

METRIC = "inner_product"


def as_id_array(ids: Collection[int] | np.ndarray | None) -> np.ndarray:
    """Any collection of integer ids -> sorted unique int64 ``[m]`` (empty for ``None``)."""
    if ids is None:
        return np.zeros(0, np.int64)
    if isinstance(ids, np.ndarray):
        array = ids.ravel()
    else:
        array = np.fromiter(ids, np.int64, len(ids)) if len(ids) else np.zeros(0, np.int64)
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"ids must be integers, got {array.dtype}")
    array = array.astype(np.int64, copy=False)
    if (array[1:] > array[:-1]).all():  # already sorted and unique (a request path's are): no sort
        return array.copy()
    return np.unique(array)


@dataclass(frozen=True)
class SearchFilter:
    """Which ids a search may return; applies to every query of one :meth:`VectorIndex.search`.

    Attributes:
        exclude: sorted unique int64 ``[e]``: never returned (a user's history, removed items).
        allow: sorted unique int64 ``[a]``: when given, only these ids are returned (an
            allow-list or a category); ``None`` allows everything.

    Example:
        >>> f = SearchFilter.of(exclude={3, 5}, allow=range(100))
        >>> f.keep(np.array([3, 4, 200]))  # array([False,  True, False])
    """

    exclude: np.ndarray
    allow: np.ndarray | None = None

    @classmethod
    def of(
        cls,
        exclude: Collection[int] | np.ndarray | None = None,
        allow: Collection[int] | np.ndarray | None = None,
    ) -> SearchFilter:
        """Builds a filter from any id collections (deduplicated and sorted here)."""
        allowed = None if allow is None else np.setdiff1d(as_id_array(allow), as_id_array(exclude))
        return cls(as_id_array(exclude), allowed)

    @property
    def is_empty(self) -> bool:
        """True when the filter lets every id through."""
        return self.allow is None and not len(self.exclude)

    def keep(self, ids: np.ndarray) -> np.ndarray:
        """Boolean mask, same shape as ``ids``: which ids pass (``-1`` padding never does)."""
        ok = ids >= 0
        if len(self.exclude):
            ok &= ~np.isin(ids, self.exclude)
        if self.allow is not None:
            ok &= np.isin(ids, self.allow)
        return ok


class VectorIndex(ABC):
    """Maximum-inner-product search over float32 vectors stored under unique int64 ids.

    Implementations are safe for concurrent searches, and for updates (``add``, ``remove``,
    ``upsert``) concurrent with searches: a search sees the catalogue either before or after an
    update, never half of it.
    """

    @abstractmethod
    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Adds new items: ``ids`` int ``[n]`` not yet in the index, ``vectors`` float32 ``[n, d]``.

        Raises:
            ValueError: an id is already present (use :meth:`upsert`), duplicate ids, bad shapes.
        """

    @abstractmethod
    def remove(self, ids: Collection[int] | np.ndarray) -> int:
        """Removes items by id (absent ids are ignored); they are never returned again.

        Returns:
            The number of items removed.
        """

    def upsert(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Adds items, replacing the vectors of ids already present."""
        ids = np.asarray(ids)
        with self._write_lock():
            self.remove(ids)
            self.add(ids, vectors)

    @abstractmethod
    def search(
        self, queries: np.ndarray, k: int, filter: SearchFilter | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ids by inner product for each query, honouring ``filter``.

        Args:
            queries: float32 ``[n, d]``.
            k: results per query, ``>= 1``; may exceed the number of items.
            filter: ids to exclude / allow; ``k`` results still come back when at least ``k``
                items pass the filter.

        Returns:
            ``(scores float32 [n, k], ids int64 [n, k])``, best first; slots without a result
            hold id ``-1`` and score ``-inf``.
        """

    @abstractmethod
    def save(self, path: Path) -> None:
        """Writes the index to ``path`` (a file for FAISS, a small descriptor for Milvus)."""

    @classmethod
    @abstractmethod
    def load(cls, path: Path) -> VectorIndex:
        """Reads what :meth:`save` wrote."""

    @property
    @abstractmethod
    def is_exact(self) -> bool:
        """True when searches are exhaustive, so results equal brute force."""

    @property
    @abstractmethod
    def dim(self) -> int:
        """Vector dimension ``d``."""

    @property
    @abstractmethod
    def ntotal(self) -> int:
        """Number of live (searchable) items."""

    @abstractmethod
    def ids(self) -> np.ndarray:
        """Sorted int64 ``[ntotal]``: the live ids."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """JSON-ready summary; always has ``backend``, ``metric``, ``dim``, ``count``, ``is_exact``."""

    # Readers-writer lock shared by the backends: many searches at once, updates alone.
    _rw: _RWLock | None = None

    def _lock(self) -> _RWLock:
        if self._rw is None:
            self._rw = _RWLock()
        return self._rw

    @contextmanager
    def _read_lock(self) -> Iterator[None]:
        with self._lock().reading():
            yield

    @contextmanager
    def _write_lock(self) -> Iterator[None]:
        with self._lock().writing():
            yield


class _RWLock:
    """Many readers or one writer, writers first: a waiting update holds back new searches so a
    steady stream of searches cannot starve it. The writer may re-enter (``upsert`` = ``remove``
    + ``add``) and read its own state."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer: int | None = None
        self._depth = 0
        self._waiting_writers = 0

    @contextmanager
    def reading(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:
                self._depth += 1
            else:
                self._cond.wait_for(lambda: self._writer is None and not self._waiting_writers)
                self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                if self._writer == me:
                    self._depth -= 1
                else:
                    self._readers -= 1
                    self._cond.notify_all()

    @contextmanager
    def writing(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:
                self._depth += 1
            else:
                self._waiting_writers += 1
                self._cond.wait_for(lambda: self._writer is None and self._readers == 0)
                self._waiting_writers -= 1
                self._writer, self._depth = me, 1
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if self._depth == 0:
                    self._writer = None
                    self._cond.notify_all()


def check_matrix(x: np.ndarray, name: str, dim: int | None = None) -> np.ndarray:
    """``x`` as a C-contiguous float32 ``[n, dim]`` matrix, or a ``ValueError`` saying what is wrong."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise ValueError(f"{name} must be float32, got {x.dtype}")
    if x.ndim != 2 or (dim is not None and x.shape[1] != dim):
        expected = f"[n, {dim}]" if dim is not None else "[n, d]"
        raise ValueError(f"{name} must have shape {expected}, got {list(x.shape)}")
    return np.ascontiguousarray(x)


def check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k <= 0:
        raise ValueError(f"k must be a positive integer, got {k!r}")


def members(values: np.ndarray, sorted_ids: np.ndarray) -> np.ndarray:
    """Boolean mask over ``values``: which occur in the sorted unique array ``sorted_ids``
    (``O(len(values) log len(sorted_ids))``, no hashing of either)."""
    if not len(sorted_ids) or not len(values):
        return np.zeros(len(values), bool)
    at = np.minimum(np.searchsorted(sorted_ids, values), len(sorted_ids) - 1)
    return sorted_ids[at] == values


def sorted_update(
    sorted_ids: np.ndarray, remove: np.ndarray | Sequence[int] = (), add: np.ndarray | Sequence[int] = ()
) -> np.ndarray:
    """The sorted unique int64 ``sorted_ids`` without ``remove`` and with ``add`` (any order,
    repeats allowed), still sorted and unique: a few passes over ``sorted_ids``, not a new sort
    of it, so a small change to a large set costs little.

    Example:
        >>> sorted_update(np.array([1, 3, 5]), remove=[3], add=[4, 1])
        array([1, 4, 5])
    """
    out = sorted_ids
    if len(remove):
        out = out[~members(out, np.unique(np.asarray(remove, np.int64)))]
    if len(add):
        new = np.unique(np.asarray(add, np.int64))
        new = new[~members(new, out)]
        out = np.insert(out, np.searchsorted(out, new), new)
    return out


def check_ids(ids: np.ndarray, n: int) -> np.ndarray:
    """``ids`` as unique int64 ``[n]``, or a ``ValueError``."""
    ids = np.asarray(ids)
    if not np.issubdtype(ids.dtype, np.integer) or ids.shape != (n,):
        raise ValueError(f"ids must be integers of shape ({n},), got {ids.dtype} {ids.shape}")
    if len(np.unique(ids)) != n:
        # IDMap2 would accept duplicates and return the same id twice.
        raise ValueError("ids must be unique")
    if n and ids.min() < 0:
        raise ValueError("ids must be >= 0 (negative ids are reserved for removed items)")
    return ids.astype(np.int64, copy=False)
