"""The index artifact: an index over a model's item embeddings, tied to that model's version.

Folder layout (``tools/build_index.py --out DIR``)::

    DIR/manifest.json   kind "index", backend, model_version, factory, search_params, dim, count,
                        metric, faiss_version, measured recall@k and latency, tuning, checksums
    DIR/index.faiss     FAISS IDMap2 index; ids are the model's dense item ids 1..n
    DIR/milvus.json     (backend "milvus" instead) uri and collection of a Milvus collection
    DIR/changes.npz     catalogue changes over index.faiss, when a catalogue change wrote the
                        folder (:mod:`retrieval.artifacts.changes`); ``count`` is before them

Re-indexing without downtime (``tools/build_index.py --publish``) keeps versions side by side
and swaps a symlink (:func:`retrieval.storage.versions.publish`), so a reader resolves either the old
or the new version, never a half.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from index import FaissIndex, VectorIndex, exact_neighbours, recall_of, tune
from index.tuning import TuningResult, measure_latency
from retrieval.artifacts.changes import INDEX_CHANGES_FILE, IndexChanges
from retrieval.artifacts.model import ModelArtifact, data_options
from retrieval.storage.folders import write_artifact
from retrieval.storage.manifest import (
    ArtifactError,
    contained_file,
    derived_version,
    read_manifest,
    same_files,
)
from retrieval.storage.versions import PUBLISH_GRACE, publish, resolve_current

log = logging.getLogger(__name__)

KIND = "index"
INDEX_FILE = "index.faiss"
MILVUS_FILE = "milvus.json"


def item_vectors(model: ModelArtifact) -> tuple[np.ndarray, np.ndarray]:
    """(dense ids int64 ``[n]``, float32 ``[n, d]``) of the model's items: ``1..len(vocab)``
    without the padding row and without the items removed from the catalogue."""
    embeddings = model.item_embeddings
    if embeddings.shape[0] != model.vocab.num_embeddings:
        raise ValueError(
            f"item_embeddings has {embeddings.shape[0]} rows for {len(model.vocab)} items (+1 padding row)"
        )
    ids = np.arange(1, embeddings.shape[0], dtype=np.int64)
    if len(model.removed):
        ids = ids[~np.isin(ids, model.removed)]
    return ids, np.ascontiguousarray(embeddings[ids], np.float32)


def build_index_from_model(
    model: ModelArtifact,
    factory: str = "Flat",
    search_params: str = "",
    *,
    train_size: int | None = None,
    seed: int = 0,
) -> FaissIndex:
    """Indexes rows ``1..n`` of ``model.item_embeddings`` under the dense ids ``1..n`` (items
    removed from the catalogue left out).

    The padding row 0 is left out so it can never be retrieved; external ids come back
    through ``model.vocab``. IVF/PQ train on ``train_size`` sampled items (FaissIndex's default).
    """
    ids, vectors = item_vectors(model)
    return FaissIndex.build(ids, vectors, factory, search_params, train_size=train_size, seed=seed)


def build_milvus_index_from_model(
    model: ModelArtifact,
    uri: str,
    collection: str,
    *,
    index_type: str = "HNSW",
    index_params: dict[str, Any] | None = None,
    search_params: dict[str, Any] | None = None,
    token_env: str | None = None,
    overwrite: bool = False,
) -> VectorIndex:
    """:func:`build_index_from_model` into a Milvus collection (a milvus-lite file or a server).

    Args:
        model: the model whose item embeddings are indexed.
        uri: where (``"runs/items.db"`` or ``"http://host:19530"``).
        collection: under which name.
        index_type: Milvus' index (``HNSW``, ``IVF_FLAT``, ...).
        index_params: its build parameters.
        search_params: its search parameters.
        token_env: the environment variable holding the server's token (``MILVUS_TOKEN`` by
            default); the artifact records its name, never the token.
        overwrite: replace an existing collection of that name.

    Raises:
        RuntimeError: pymilvus is not installed.
        FileExistsError: the collection exists and ``overwrite`` is false.
    """
    from index.milvus_index import TOKEN_ENV, MilvusIndex  # pymilvus: the milvus extra only

    ids, vectors = item_vectors(model)
    return MilvusIndex.build(
        ids,
        vectors,
        uri=uri,
        collection=collection,
        index_type=index_type,
        index_params=index_params,
        search_params=search_params,
        token_env=token_env or TOKEN_ENV,
        overwrite=overwrite,
    )


def user_interest_queries(
    model: ModelArtifact,
    data_path: str | Path,
    data_format: str | None = None,
    num_users: int = 1000,
    seed: int = 0,
) -> np.ndarray:
    """Interest vectors of real users, float32 ``[U, K, d]``: the queries to tune an index on.

    ``num_users`` users are sampled from the data's test histories (the whole sequence but the
    last item, mapped through the model's vocabulary) and encoded by the model's user tower.
    """
    from retrieval.artifacts.model import encode_histories
    from retrieval.data.interactions import build_sequences
    from retrieval.data.loaders import load_interactions
    from retrieval.data.splits import leave_one_out
    from retrieval.data.vocab import PAD

    data = build_sequences(load_interactions(data_path, data_format, **data_options(model.path)))
    to_model = np.concatenate([[PAD], model.vocab.lookup(list(data.vocab.ids))])
    histories = [to_model[h] for h in leave_one_out(data).test_histories]
    histories = [h[h != PAD] for h in histories if (h != PAD).any()]
    if not histories:
        raise ValueError(f"{data_path}: no user history shares items with the model")
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(histories), min(num_users, len(histories)), replace=False)
    return encode_histories(model, [histories[r] for r in np.sort(rows)]).astype(np.float32)


def item_queries(model: ModelArtifact, num_queries: int = 1000, seed: int = 0) -> np.ndarray:
    """Item vectors sampled without replacement, float32 ``[q, d]``: stand-ins for user queries
    when no user data is at hand (they find themselves first, which flatters approximate indexes)."""
    rng = np.random.default_rng(seed)
    rows = rng.choice(
        np.arange(1, model.vocab.num_embeddings), min(num_queries, len(model.vocab)), replace=False
    )
    return np.ascontiguousarray(model.item_embeddings[rows], np.float32)


def tune_index_for_model(
    model: ModelArtifact,
    queries: np.ndarray,
    k: int = 50,
    target_recall: float = 0.99,
    factory: str = "auto",
    *,
    train_size: int | None = None,
    seed: int = 0,
    max_build_seconds: float | None = None,
) -> TuningResult:
    """:func:`index.tune` over the model's items.

    Args:
        queries: float32 ``[U, K, d]`` user interests (one request = one user's K vectors) or
            ``[q, d]`` vectors (timed 4 at a time).
    """
    ids, vectors = item_vectors(model)
    batch = queries.shape[1] if queries.ndim == 3 else 4
    flat = queries.reshape(-1, queries.shape[-1])
    return tune(
        ids, vectors, flat, k, target_recall, factory,
        batch_size=batch, train_size=train_size, seed=seed, max_build_seconds=max_build_seconds,
    )  # fmt: skip


def measure_index(
    index: VectorIndex, model: ModelArtifact, queries: np.ndarray, k: int = 50, threads: int = 1
) -> dict[str, Any]:
    """Recall@k against exact search and per-request latency of an already built index.

    Args:
        queries: ``[U, K, d]`` or ``[q, d]``, as in :func:`tune_index_for_model`; zero rows dropped.
        threads: FAISS threads while timing (one request is only K vectors, see :func:`index.tune`).
    """
    batch = queries.shape[1] if queries.ndim == 3 else 4
    flat = queries.reshape(-1, queries.shape[-1]).astype(np.float32)
    flat = np.ascontiguousarray(flat[np.any(flat != 0, axis=1)])
    ids, vectors = item_vectors(model)
    _, found = index.search(flat, k)
    recall = recall_of(found, exact_neighbours(ids, vectors, flat, k))
    out: dict[str, Any] = {"k": k, "recall": round(recall, 5), "num_queries": len(flat)}
    if isinstance(index, FaissIndex):
        p50, p99 = measure_latency(index, flat, k, batch, threads=threads)
        out.update(p50_ms=round(p50, 4), p99_ms=round(p99, 4), batch_size=batch, threads=threads)
    return out


def save_index(
    index: VectorIndex,
    out_dir: Path,
    model: ModelArtifact | str,
    overwrite: bool = False,
    *,
    measured: dict[str, Any] | None = None,
    tuning: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Writes ``index`` as an artifact folder tied to ``model`` (an artifact or its version).

    The folder is written under a temporary name and renamed into place (``retrieval.storage``).

    Args:
        measured: recall@k / latency measured on the index, stored in the manifest.
        tuning: the auto-tuner's record (:meth:`index.TuningResult.summary`).

    Returns:
        The manifest written.
    """
    model_version = model if isinstance(model, str) else model.version
    meta: dict[str, Any] = {"model_version": model_version, **index.describe()}
    if isinstance(index, FaissIndex):
        meta["faiss_version"] = faiss.__version__
        meta["index_file"] = INDEX_FILE
    else:
        meta["index_file"] = MILVUS_FILE
    if measured is not None:
        meta["measured"] = measured
    if tuning is not None:
        meta["tuning"] = tuning
    with write_artifact(out_dir, KIND, meta, overwrite) as tmp:
        index.save(tmp / meta["index_file"])
        # The manifest is written when the block exits, so the size can still go into it:
        # a truncated copy is then refused with its size before any checksum or FAISS read.
        meta["index_bytes"] = (tmp / meta["index_file"]).stat().st_size
    return read_manifest(out_dir, KIND, verify=False)


def publish_index(
    index: VectorIndex,
    root: Path,
    model: ModelArtifact | str,
    *,
    measured: dict[str, Any] | None = None,
    tuning: dict[str, Any] | None = None,
    keep: int = 3,
    grace: float = PUBLISH_GRACE,
) -> Path:
    """Writes ``index`` as a new version under ``root`` and atomically makes it the current one
    (:func:`retrieval.storage.versions.publish`, with its ``keep`` and ``grace``); :func:`load_index`
    on ``root`` loads the current one.

    Returns:
        The new version folder.
    """
    return publish(
        root, lambda folder: save_index(index, folder, model, measured=measured, tuning=tuning), keep, grace
    )


def load_index(
    path: Path,
    expected_model_version: str | None = None,
    previous: tuple[Path, VectorIndex] | None = None,
    *,
    mmap: bool = False,
) -> tuple[VectorIndex, dict[str, Any]]:
    """Loads an index artifact (or the current version of a published root).

    The manifest's fields are checked (types, a plain ``index_file`` name listed with a
    checksum), then the file's size, checksum and header before FAISS parses anything, so a
    truncated, corrupted or mismatched file is refused with an :class:`ArtifactError`.
    Catalogue changes (``changes.npz``) are applied after the file is read, or to a copy of
    ``previous`` (a folder and the index loaded from it, the one in service) when that folder
    holds the same index file and changes that these extend: a catalogue change then costs a
    copy of the index in memory and the rows that differ, not a read of the file.

    With ``mmap`` (a server's load) a FAISS index without catalogue changes is memory-mapped
    (:meth:`FaissIndex.load`): the processes of a serving group share the file's pages. One with
    changes is read (or copied) into memory, where the changes apply.

    Raises:
        ArtifactError: missing, incomplete or corrupted folder, a malformed manifest, an index
            that disagrees with its manifest, or an index built from another model than
            ``expected_model_version``.
    """
    path = resolve_current(Path(path))
    manifest = read_manifest(path, KIND, verify=False)
    _check_index_manifest(path, manifest)
    file = contained_file(path, manifest["index_file"])
    expected_bytes = manifest.get("index_bytes")
    if expected_bytes is not None and file.is_file() and file.stat().st_size != expected_bytes:
        raise ArtifactError(
            f"{file} is truncated or replaced: {file.stat().st_size} bytes, "
            f"the manifest says {expected_bytes}"
        )
    same = _same_file(path, manifest, previous)
    manifest = read_manifest(path, KIND, verified={manifest["index_file"]} if same else set())
    _check_index_manifest(path, manifest)  # read again: the file may have changed in between
    if expected_model_version is not None and manifest["model_version"] != expected_model_version:
        raise ArtifactError(
            f"{path} was built from model {manifest['model_version']!r}, not from model "
            f"{expected_model_version!r}: rebuild it with tools/build_index.py"
        )
    dim = int(manifest["dim"])
    changes = IndexChanges.load(path, dim) if INDEX_CHANGES_FILE in manifest["files"] else None
    index: VectorIndex
    if (
        same is not None
        and changes is not None
        and changes.extends(earlier := same[1] or IndexChanges.none(dim))
    ):
        index, changes = same[0].copy(), changes.since(earlier)
    else:
        if same is not None:  # the file is read after all: verified like any other
            read_manifest(path, KIND, verified=set(manifest["files"]) - {manifest["index_file"]})
        index = _read_index(path, manifest, file, mmap=mmap and changes is None)
    if changes is not None:
        _apply(index, changes, path)
    if manifest["version"] != derived_version(manifest["files"]):  # save_index never names one
        raise ArtifactError(f"{path}: version {manifest['version']!r} does not match the files' checksums")
    return index, manifest


def _same_file(
    path: Path, manifest: dict[str, Any], previous: tuple[Path, VectorIndex] | None
) -> tuple[FaissIndex, IndexChanges | None] | None:
    """``previous``'s FAISS index and changes (``None``: none) when its folder holds this
    folder's index file (a hard link with the same checksum): verified when it was loaded."""
    if previous is None or not isinstance(previous[1], FaissIndex):
        return None
    folder, index = previous[0], previous[1]
    try:
        theirs = read_manifest(folder, KIND, verify=False)
        if manifest["index_file"] not in same_files(path, manifest, folder, theirs):
            return None
        has_changes = INDEX_CHANGES_FILE in theirs["files"]
        return index, IndexChanges.load(folder, int(manifest["dim"])) if has_changes else None
    except ArtifactError:
        return None  # the full read says what is wrong


def _read_index(path: Path, manifest: dict[str, Any], file: Path, mmap: bool = False) -> VectorIndex:
    """The index file, checked against the manifest (type, metric, exactness); ``mmap``: a
    FAISS index memory-mapped."""
    backend = manifest["backend"]
    index: VectorIndex
    try:
        if backend == "faiss":
            index = FaissIndex.load(
                file,
                manifest["factory"],
                manifest["search_params"],
                mips_norm=manifest.get("mips_norm"),
                mmap=mmap,
            )
        else:
            from index.milvus_index import MilvusIndex

            index = MilvusIndex.load(file)
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as e:
        raise ArtifactError(f"{path} holds an unusable index: {e}") from e
    if isinstance(index, FaissIndex):
        _check_factory(path, manifest, index)
    if manifest.get("metric", index.describe()["metric"]) != index.describe()["metric"]:
        raise ArtifactError(
            f"{path}: the manifest says metric {manifest['metric']!r}, the index uses another"
        )
    if manifest.get("is_exact", index.is_exact) != index.is_exact:
        raise ArtifactError(
            f"{path}: the manifest describes {manifest['factory']!r}, the file holds another index type"
        )
    if (index.dim, index.ntotal) != (manifest["dim"], manifest["count"]):  # before any change
        raise ArtifactError(
            f"{path}: index has dim {index.dim} and {index.ntotal} items, "
            f"manifest says dim {manifest['dim']} and {manifest['count']}"
        )
    return index


def _apply(index: VectorIndex, changes: IndexChanges, path: Path) -> None:
    """Removes and upserts the changed items."""
    try:
        index.remove(changes.ids[changes.removed])
        index.upsert(changes.ids[~changes.removed], changes.vectors[~changes.removed])
    except ValueError as e:
        raise ArtifactError(f"{path}: the catalogue changes do not apply to the index: {e}") from e


def _check_factory(path: Path, manifest: dict[str, Any], index: FaissIndex) -> None:
    """The file holds the index type (and IVF list count) the manifest's factory string builds."""
    try:
        empty = FaissIndex.empty(manifest["dim"], manifest["factory"])
    except ValueError as e:
        raise ArtifactError(
            f"{path}: the manifest's factory {manifest['factory']!r} is not valid: {e}"
        ) from e
    # ``empty`` and ``index`` own the FAISS objects: they must outlive the downcast views.
    expected = faiss.downcast_index(empty.faiss_index.index)
    found = faiss.downcast_index(index.faiss_index.index)
    # Built and read back, the same index can differ by a subclass (IndexFlat / IndexFlatIP).
    related = isinstance(found, type(expected)) or isinstance(expected, type(found))
    if not related or getattr(expected, "nlist", None) != getattr(found, "nlist", None):
        raise ArtifactError(
            f"{path}: the manifest describes {manifest['factory']!r} ({type(expected).__name__}), "
            f"the file holds a {type(found).__name__}"
        )
    del expected, found, empty


_INDEX_FIELDS: dict[str, tuple[type, ...]] = {
    "model_version": (str,),
    "factory": (str,),
    "search_params": (str,),
    "dim": (int,),
    "count": (int,),
}
_BACKEND_FILES = {"faiss": INDEX_FILE, "milvus": MILVUS_FILE}


def _check_index_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Refuses a manifest whose fields have the wrong type or range, or whose index file is not a
    plain file name listed (with a checksum) in it. Fills the defaults of older manifests."""
    where = path / "manifest.json"
    manifest.setdefault("backend", "faiss")
    manifest.setdefault("index_file", _BACKEND_FILES.get(manifest["backend"], INDEX_FILE))
    for key, types in _INDEX_FIELDS.items():
        value = manifest.get(key)
        if not isinstance(value, types) or isinstance(value, bool):
            raise ArtifactError(f"{where}: {key} must be a {types[0].__name__}, found {value!r}")
    if manifest["dim"] < 1 or manifest["count"] < 0:
        raise ArtifactError(f"{where}: dim {manifest['dim']} and count {manifest['count']} are out of range")
    if manifest["backend"] not in _BACKEND_FILES:
        raise ArtifactError(f"{where}: unknown index backend {manifest['backend']!r}")
    name = manifest["index_file"]
    if not isinstance(name, str) or "/" in name or name != _BACKEND_FILES[manifest["backend"]]:
        raise ArtifactError(
            f"{where}: index_file {name!r} is not the {manifest['backend']} index file "
            f"{_BACKEND_FILES[manifest['backend']]!r}"
        )
    if name not in manifest.get("files", {}):
        raise ArtifactError(f"{path} is incomplete: {name} is not listed in the manifest")
    for key in ("index_bytes",):
        value = manifest.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ArtifactError(f"{where}: {key} must be a non-negative integer, found {value!r}")
    norm = manifest.get("mips_norm")
    if norm is not None and (isinstance(norm, bool) or not isinstance(norm, int | float) or not norm > 0):
        raise ArtifactError(f"{where}: mips_norm must be a positive number, found {norm!r}")


def recall_against_exact(
    index: VectorIndex,
    model: ModelArtifact,
    k: int = 10,
    num_queries: int = 1000,
    seed: int = 0,
    *,
    queries: np.ndarray | None = None,
) -> float:
    """Recall@k of ``index`` against exact search over the model's item embeddings.

    Args:
        queries: float32 ``[q, d]`` or ``[U, K, d]`` query vectors (real user interests, see
            :func:`user_interest_queries`); by default ``num_queries`` sampled item vectors,
            which flatter approximate indexes.
    """
    if queries is None:
        queries = item_queries(model, num_queries, seed)
    flat = queries.reshape(-1, queries.shape[-1]).astype(np.float32)
    flat = np.ascontiguousarray(flat[np.any(flat != 0, axis=1)])
    ids, vectors = item_vectors(model)
    _, found = index.search(flat, k)
    return recall_of(found, exact_neighbours(ids, vectors, flat, k))
