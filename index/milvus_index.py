"""Milvus backend: the :class:`VectorIndex` interface over a Milvus collection, through pymilvus.

For catalogues that outgrow one machine: Milvus shards the collection and its index across
query nodes, and filters run inside its engine as boolean expressions on the primary key, so
``k`` results come back whenever ``k`` items pass. The same code talks to

* an embedded **milvus-lite** database: ``uri`` is a local path such as ``"runs/items.db"``
  (used by the tests), or
* a **Milvus cluster**: ``uri="http://milvus.internal:19530"``, with the token taken from an
  environment variable (``MILVUS_TOKEN`` unless ``token_env`` names another): the saved
  descriptor records the variable's name, never the token.

A collection has two fields, ``id`` (INT64 primary key) and ``vector`` (FLOAT_VECTOR, ``d``), and
one vector index with the inner-product metric (``FLAT``, ``HNSW``, ``IVF_FLAT``, ``IVF_PQ`` …).
Re-indexing without downtime: fill a new collection, then point an alias at it
(:meth:`MilvusIndex.point_alias`); readers that search the alias switch atomically.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from index.base import (
    METRIC,
    SearchFilter,
    VectorIndex,
    as_id_array,
    check_ids,
    check_k,
    check_matrix,
)

try:
    from pymilvus import DataType, MilvusClient
except ImportError:  # pragma: no cover - exercised only without the optional dependency
    MilvusClient = None

TOKEN_ENV = "MILVUS_TOKEN"
_ID, _VECTOR = "id", "vector"
_BATCH = 5_000  # rows per insert / ids per expression


def milvus_available() -> str | None:
    """``None`` when pymilvus can be imported, otherwise why not (for skip messages)."""
    if MilvusClient is None:
        return "pymilvus is not installed (pip install 'mitt-retrieval[milvus]')"
    return None


class MilvusIndex(VectorIndex):
    """Maximum-inner-product search over a Milvus collection.

    Example:
        >>> index = MilvusIndex.build(ids, vectors, uri="runs/items.db", collection="items_v2",
        ...                           index_type="HNSW", search_params={"ef": 128})
        >>> index.search(queries, 50, SearchFilter.of(exclude=history))
        >>> index.point_alias("items")  # readers of "items" now see items_v2
    """

    def __init__(
        self,
        client: Any,
        collection: str,
        *,
        uri: str,
        search_params: dict[str, Any] | None = None,
        token_env: str = TOKEN_ENV,
    ) -> None:
        """Wraps an existing, indexed collection (see :meth:`create` and :meth:`connect`)."""
        self._client = client
        self._collection = collection
        self._uri = uri
        self._search_params = dict(search_params or {})
        self._token_env = token_env
        info = client.describe_collection(collection)
        vector_fields = [f for f in info["fields"] if f["name"] == _VECTOR]
        if not vector_fields:
            raise ValueError(f"Milvus collection {collection!r} has no {_VECTOR!r} field")
        self._dim = int(vector_fields[0]["params"]["dim"])
        index = client.describe_index(collection, _VECTOR) or {}
        self._index_type = str(index.get("index_type", "FLAT"))
        if str(index.get("metric_type", "IP")) != "IP":
            raise ValueError(f"Milvus collection {collection!r} is not indexed with the IP metric")

    @staticmethod
    def _client_for(uri: str, token: str | None, token_env: str = TOKEN_ENV) -> Any:
        reason = milvus_available()
        if reason is not None:
            raise RuntimeError(reason)
        token = token if token is not None else os.environ.get(token_env, "")
        return MilvusClient(uri=uri, token=token) if token else MilvusClient(uri=uri)

    @classmethod
    def create(
        cls,
        uri: str,
        collection: str,
        dim: int,
        *,
        index_type: str = "HNSW",
        index_params: dict[str, Any] | None = None,
        search_params: dict[str, Any] | None = None,
        token: str | None = None,
        token_env: str = TOKEN_ENV,
        overwrite: bool = False,
    ) -> MilvusIndex:
        """Creates an empty collection with an inner-product vector index.

        Args:
            uri: a local milvus-lite file (``"runs/items.db"``) or a server (``"http://host:19530"``).
            collection: collection name.
            dim: vector dimension.
            index_type: Milvus index type (``FLAT``, ``HNSW``, ``IVF_FLAT``, ``IVF_PQ`` …).
            index_params: build parameters (``{"M": 32, "efConstruction": 200}``, ``{"nlist": 1024}``).
            search_params: search parameters (``{"ef": 128}``, ``{"nprobe": 16}``).
            token: credentials; default the environment variable ``token_env``.
            token_env: the variable holding the token (recorded by :meth:`save`, read again by
                :meth:`load`); ``MILVUS_TOKEN`` by default.
            overwrite: drop an existing collection of that name first.

        Raises:
            FileExistsError: the collection exists and ``overwrite`` is false.
        """
        client = cls._client_for(uri, token, token_env)
        if client.has_collection(collection):
            if not overwrite:
                raise FileExistsError(f"Milvus collection {collection!r} already exists at {uri}")
            client.drop_collection(collection)
        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field(_ID, DataType.INT64, is_primary=True)
        schema.add_field(_VECTOR, DataType.FLOAT_VECTOR, dim=dim)
        params = client.prepare_index_params()
        params.add_index(
            field_name=_VECTOR, index_type=index_type, metric_type="IP", params=index_params or {}
        )
        client.create_collection(collection, schema=schema, index_params=params)
        return cls(client, collection, uri=uri, search_params=search_params, token_env=token_env)

    @classmethod
    def build(
        cls,
        ids: np.ndarray,
        vectors: np.ndarray,
        *,
        uri: str,
        collection: str,
        **options: Any,
    ) -> MilvusIndex:
        """:meth:`create` (``options`` are its keyword arguments) for the vectors' dimension,
        followed by :meth:`add`."""
        vectors = check_matrix(vectors, "vectors")
        index = cls.create(uri, collection, vectors.shape[1], **options)
        index.add(ids, vectors)
        return index

    @classmethod
    def connect(
        cls,
        uri: str,
        collection: str,
        *,
        search_params: dict[str, Any] | None = None,
        token: str | None = None,
        token_env: str = TOKEN_ENV,
    ) -> MilvusIndex:
        """Opens an existing collection (or alias) and loads it for search (a collection written
        by another process, or by a server that restarted since, is released until loaded); the
        token as in :meth:`create`."""
        client = cls._client_for(uri, token, token_env)
        if not client.has_collection(collection):
            raise FileNotFoundError(f"Milvus collection {collection!r} not found at {uri}")
        client.load_collection(collection)
        return cls(client, collection, uri=uri, search_params=search_params, token_env=token_env)

    def point_alias(self, alias: str) -> None:
        """Points ``alias`` at this collection, atomically for readers searching the alias."""
        aliases = self._client.list_aliases(self._collection).get("aliases", [])
        if alias in aliases:
            return
        try:
            self._client.alter_alias(self._collection, alias)
        except Exception:  # the alias does not exist yet (the error type differs between servers)
            self._client.create_alias(self._collection, alias)

    # --------------------------------------------------------------------------------- updates

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        vectors = check_matrix(vectors, "vectors", self._dim)
        ids = check_ids(ids, len(vectors))
        with self._write_lock():
            clash = self._present(ids)
            if len(clash):
                raise ValueError(
                    f"{len(clash)} ids are already in the index (e.g. {clash[:5].tolist()}): use upsert"
                )
            self._write(self._client.insert, ids, vectors)

    def upsert(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        vectors = check_matrix(vectors, "vectors", self._dim)
        ids = check_ids(ids, len(vectors))
        with self._write_lock():
            self._write(self._client.upsert, ids, vectors)

    def _write(self, method: Any, ids: np.ndarray, vectors: np.ndarray) -> None:
        for start in range(0, len(ids), _BATCH):
            rows = [
                {_ID: int(i), _VECTOR: v}
                for i, v in zip(ids[start : start + _BATCH], vectors[start : start + _BATCH], strict=True)
            ]
            method(self._collection, rows)

    def remove(self, ids: Collection[int] | np.ndarray) -> int:
        with self._write_lock():
            present = self._present(as_id_array(ids))
            for start in range(0, len(present), _BATCH):
                self._client.delete(self._collection, ids=present[start : start + _BATCH].tolist())
            return len(present)

    def _present(self, ids: np.ndarray) -> np.ndarray:
        """The subset of ``ids`` stored in the collection."""
        found: list[int] = []
        for start in range(0, len(ids), _BATCH):
            chunk = ids[start : start + _BATCH].tolist()
            rows = self._client.query(self._collection, filter=f"{_ID} in {chunk}", output_fields=[_ID])
            found += [int(r[_ID]) for r in rows]
        return np.asarray(sorted(found), np.int64)

    # ---------------------------------------------------------------------------------- search

    def search(
        self, queries: np.ndarray, k: int, filter: SearchFilter | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        queries = check_matrix(queries, "queries", self._dim)
        check_k(k)
        scores = np.full((len(queries), k), -np.inf, np.float32)
        ids = np.full((len(queries), k), -1, np.int64)
        if not len(queries) or (filter is not None and filter.allow is not None and not len(filter.allow)):
            return scores, ids
        with self._read_lock():
            hits = self._client.search(
                self._collection,
                data=list(queries),
                limit=k,
                filter=_expression(filter),
                output_fields=[_ID],
                search_params={"metric_type": "IP", "params": self._search_params},
            )
        for row, found in enumerate(hits):
            found = list(found)[:k]
            ids[row, : len(found)] = [int(h[_ID]) for h in found]
            scores[row, : len(found)] = [float(h["distance"]) for h in found]
        return scores, ids

    # ------------------------------------------------------------------------------ properties

    @property
    def is_exact(self) -> bool:
        return self._index_type == "FLAT"

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def ntotal(self) -> int:
        rows = self._client.query(self._collection, filter="", output_fields=["count(*)"])
        return int(rows[0]["count(*)"])

    def ids(self) -> np.ndarray:
        return np.sort(np.fromiter(self._iter_ids(), np.int64))

    def _iter_ids(self) -> Iterator[int]:
        iterator = self._client.query_iterator(
            self._collection, batch_size=10_000, filter=f"{_ID} >= 0", output_fields=[_ID]
        )
        try:
            while batch := iterator.next():
                yield from (int(r[_ID]) for r in batch)
        finally:
            iterator.close()

    @property
    def collection(self) -> str:
        return self._collection

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "milvus",
            "uri": self._uri,
            "collection": self._collection,
            "index_type": self._index_type,
            "factory": f"milvus:{self._index_type}",
            "search_params": json.dumps(self._search_params, sort_keys=True),
            "metric": METRIC,
            "dim": self._dim,
            "count": self.ntotal,
            "is_exact": self.is_exact,
        }

    # ----------------------------------------------------------------------------- persistence

    def save(self, path: Path) -> None:
        """Writes a descriptor (uri, collection, search parameters, the token's variable) to the
        JSON file ``path``.

        The vectors live in Milvus, which persists them itself; the token itself is not written.
        A local milvus-lite path is stored absolute so the descriptor works from any folder.
        """
        uri = self._uri
        if "://" not in uri:
            uri = str(Path(uri).resolve())
        Path(path).write_text(
            json.dumps(
                {
                    "uri": uri,
                    "collection": self._collection,
                    "search_params": self._search_params,
                    "token_env": self._token_env,
                },
                indent=2,
                sort_keys=True,
            )
        )

    @classmethod
    def load(cls, path: Path) -> MilvusIndex:
        """Connects to the collection a descriptor written by :meth:`save` names.

        Raises:
            ValueError: the descriptor is not valid JSON or lacks ``uri``/``collection``.
            FileNotFoundError: the collection does not exist.
        """
        try:
            spec = json.loads(Path(path).read_text())
            uri, collection = str(spec["uri"]), str(spec["collection"])
            token_env = str(spec.get("token_env", TOKEN_ENV))
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path} is not a Milvus index descriptor: {e}") from e
        return cls.connect(uri, collection, search_params=spec.get("search_params"), token_env=token_env)

    def close(self) -> None:
        self._client.close()


def _expression(filter: SearchFilter | None) -> str:
    """Milvus boolean expression for ``filter`` (``""`` for none)."""
    if filter is None:
        return ""
    parts = []
    if filter.allow is not None:
        parts.append(f"{_ID} in {filter.allow.tolist()}")
    if len(filter.exclude):
        parts.append(f"{_ID} not in {filter.exclude.tolist()}")
    return " and ".join(parts)
