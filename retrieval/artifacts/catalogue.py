"""A living catalogue: items added, updated and removed after training, published as a new
version of a deployment (:mod:`retrieval.artifacts.deployment`) that a watching server swaps in.

An item the model never saw gets the vector of its attributes alone (:func:`cold_vectors`, the
item tower's attribute part: meaningful when the model was trained with ``side_features``
``attributes``, better with ``model.id_dropout``). It is appended to the vocabulary (new dense
ids past ``tower_items``: retrieved, never read as history) and upserted into a copy of the
index. A removed item leaves the index and is listed in ``removed_items.json``, so a rebuilt
index leaves it out too; it stays in the vocabulary, since histories may still hold it.

The new version hard-links every file it does not change (the user tower above all), so a
server loads only the vocabulary, the item table and the index again
(:func:`retrieval.artifacts.model.load_model`'s ``reuse``).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from index import FaissIndex
from retrieval.artifacts.deployment import (
    INDEX_DIR,
    MODEL_DIR,
    RANKERS_DIR,
    copy_listed,
    deployment_dirs,
    link_or_copy,
)
from retrieval.artifacts.index import load_index, save_index
from retrieval.artifacts.model import (
    ATTRIBUTE_EMBEDDINGS_FILE,
    ATTRIBUTES_FILE,
    EMBEDDINGS_FILE,
    KIND,
    REMOVED_FILE,
    SIDE_FILE,
    VOCAB_FILE,
    load_embeddings,
    load_vocab,
)
from retrieval.data.features import SideVocab, attribute_table
from retrieval.data.vocab import PAD, ItemVocab
from retrieval.storage.manifest import (
    MANIFEST,
    ArtifactError,
    derived_version,
    read_manifest,
    refuse_outside_links,
    sha256_file,
)
from retrieval.storage.versions import PUBLISH_GRACE, publish, resolve_current

__all__ = ["CatalogueChange", "CatalogueItem", "change_catalogue", "cold_vectors", "read_ids", "read_items"]

_REWRITTEN = (VOCAB_FILE, EMBEDDINGS_FILE, ATTRIBUTES_FILE, REMOVED_FILE)
"""The model files a catalogue change writes anew; the others are hard links of the old ones."""


@dataclass(frozen=True)
class CatalogueItem:
    """An item to add (or update, when its id is in the catalogue already).

    Attributes:
        id: its external id.
        attributes: its attribute values (categories, brand, genres), as in training's data.
        title: a human-readable title, if any.
    """

    id: str
    attributes: tuple[str, ...]
    title: str | None = None


@dataclass(frozen=True)
class CatalogueChange:
    """What :func:`change_catalogue` published: the version folder and the counts."""

    folder: Path
    model_version: str
    added: int
    updated: int
    removed: int
    items: int


def read_items(path: Path) -> list[CatalogueItem]:
    """Items from a JSON-lines file: ``{"id": "B01", "attributes": ["Lipstick"], "title": "…"}``
    per line (``title`` optional; blank lines skipped).

    Raises:
        ValueError: a line that is not such an object (its number is in the message), or an id
            given twice.
    """
    items: list[CatalogueItem] = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            items.append(_item(row))
        except (ValueError, TypeError, KeyError, RecursionError) as e:
            raise ValueError(f"{path}:{number}: {e}") from None
    _refuse_repeats([i.id for i in items], f"{path} gives")
    return items


def _item(row: Any) -> CatalogueItem:
    if not isinstance(row, dict) or not isinstance(row.get("id"), str) or not row["id"]:
        raise ValueError('expected {"id": "...", "attributes": [...], "title": "..."}')
    attributes = row.get("attributes", [])
    if not isinstance(attributes, list) or not all(isinstance(a, str) for a in attributes):
        raise ValueError(f"item {row['id']!r}: attributes must be a list of strings")
    title = row.get("title")
    if title is not None and not isinstance(title, str):
        raise ValueError(f"item {row['id']!r}: title must be a string")
    unknown = sorted(set(row) - {"id", "attributes", "title"})
    if unknown:
        raise ValueError(f"item {row['id']!r}: unknown fields {unknown}")
    return CatalogueItem(row["id"], tuple(attributes), title)


def read_ids(path: Path) -> list[str]:
    """Item ids, one per line (blank lines skipped)."""
    ids = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    _refuse_repeats(ids, f"{path} gives")
    return ids


def _refuse_repeats(ids: Sequence[str], where: str) -> None:
    repeated = [i for i, n in Counter(ids).items() if n > 1]
    if repeated:
        raise ValueError(f"{where} {len(repeated)} ids more than once (e.g. {repeated[0]!r})")


def cold_vectors(
    side: SideVocab, attribute_embeddings: np.ndarray, attributes: Sequence[Sequence[str]]
) -> np.ndarray:
    """The item tower's vectors of items it never saw, from their attributes: float32 ``[n, d]``,
    the mean embedding of each item's first ``side.max_attributes`` distinct known attributes
    (``towers.item.ItemTower.attributes``).

    Raises:
        ValueError: an item without any attribute the model knows (it has no vector).
    """
    vectors, counts = _attribute_means(side, attribute_embeddings, attributes)
    if (counts == 0).any():
        first = int(np.flatnonzero(counts == 0)[0])
        raise ValueError(
            f"{int((counts == 0).sum())} items have no attribute the model knows, e.g. "
            f"{list(attributes[first])[:5]}: they cannot be embedded"
        )
    return vectors


def _attribute_means(
    side: SideVocab, attribute_embeddings: np.ndarray, attributes: Sequence[Sequence[str]]
) -> tuple[np.ndarray, np.ndarray]:
    """(float32 ``[n, d]`` the mean embedding of each item's known attributes, zeros for an item
    with none; int ``[n]`` how many were known)."""
    table = attribute_table(side, dict(enumerate(attributes)), len(attributes))  # [n, A]
    present = table > 0
    counts = present.sum(axis=1)
    total = (attribute_embeddings[table] * present[..., None]).sum(axis=1)
    return (total / np.maximum(counts, 1)[:, None]).astype(np.float32), counts


@dataclass
class _Catalogue:
    """A model folder's catalogue files, read without the user tower."""

    manifest: dict[str, Any]
    vocab: ItemVocab
    embeddings: np.ndarray
    side: SideVocab
    attribute_embeddings: np.ndarray
    attributes: dict[str, list[str]]
    removed: set[str]


def _read_catalogue(model_dir: Path) -> _Catalogue:
    """Reads and verifies the files a change rewrites or reads (never the user tower's).

    Raises:
        ArtifactError: a corrupted file, or a model that cannot embed new items.
    """
    manifest = read_manifest(model_dir, KIND, verify=False)
    listed = set(manifest.get("files", {}))
    if ATTRIBUTE_EMBEDDINGS_FILE not in listed:
        raise ArtifactError(
            f"model {manifest['version']} was trained without item attributes, so it cannot embed "
            "items it never saw: train with --set model.side_features=attributes (and "
            "model.id_dropout, e.g. 0.5) on data with item attributes"
        )
    read = {*_REWRITTEN, SIDE_FILE, ATTRIBUTE_EMBEDDINGS_FILE}
    manifest = read_manifest(model_dir, KIND, verified=listed - read)
    vocab = load_vocab(model_dir)
    side = SideVocab.load(model_dir / SIDE_FILE)
    dim = int(manifest["dim"])
    catalogue = _Catalogue(
        manifest,
        vocab,
        load_embeddings(model_dir / EMBEDDINGS_FILE, len(vocab) + 1, dim),
        side,
        load_embeddings(model_dir / ATTRIBUTE_EMBEDDINGS_FILE, len(side.attributes) + 1, dim),
        _read_json(model_dir, ATTRIBUTES_FILE, listed, {}),
        set(_read_json(model_dir, REMOVED_FILE, listed, [])),
    )
    return catalogue


def _read_json(folder: Path, name: str, listed: set[str], default: Any) -> Any:
    return json.loads((folder / name).read_text(encoding="utf-8")) if name in listed else default


def _apply(
    catalogue: _Catalogue, items: Sequence[CatalogueItem], remove: Sequence[str]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Applies the change to ``catalogue`` in place.

    Returns:
        (dense ids to upsert, their vectors, dense ids to remove from the index, items updated).

    Raises:
        ValueError: an id both added and removed, an unknown id to remove, or an item without a
            known attribute.
    """
    both = sorted({i.id for i in items} & set(remove))
    if both:
        raise ValueError(f"{len(both)} ids are both added and removed, e.g. {both[0]!r}")
    vocab = catalogue.vocab
    unknown = [i for i in remove if i not in vocab]
    if unknown:
        raise ValueError(f"{len(unknown)} ids to remove are not in the catalogue, e.g. {unknown[0]!r}")
    vectors = cold_vectors(catalogue.side, catalogue.attribute_embeddings, [i.attributes for i in items])
    dense = vocab.lookup([i.id for i in items])
    tower_items = int(catalogue.manifest.get("tower_items", len(vocab)))
    trained = (dense != PAD) & (dense <= tower_items)
    if trained.any():  # a trained item keeps its id part: new attribute part, same id embedding
        old = [catalogue.attributes.get(i.id, []) for i, t in zip(items, trained, strict=True) if t]
        before, _ = _attribute_means(catalogue.side, catalogue.attribute_embeddings, old)
        vectors[trained] += catalogue.embeddings[dense[trained]] - before
    new = [i for i, d in zip(items, dense, strict=True) if d == PAD]
    catalogue.vocab = _grown(vocab, new, {i.id: i.title for i in items if i.title is not None})
    ids = catalogue.vocab.lookup([i.id for i in items])
    table = np.zeros((len(catalogue.vocab) + 1, catalogue.embeddings.shape[1]), np.float32)
    table[: len(catalogue.embeddings)] = catalogue.embeddings
    table[ids] = vectors
    catalogue.embeddings = table
    for item in items:
        catalogue.attributes[item.id] = list(item.attributes)
    catalogue.removed = (catalogue.removed - {i.id for i in items}) | set(remove)
    return ids, vectors, vocab.lookup(list(remove)), int((dense != PAD).sum())


def _grown(vocab: ItemVocab, new: Sequence[CatalogueItem], titles: Mapping[str, str]) -> ItemVocab:
    """``vocab`` with ``new`` appended and titles updated (ids stand for missing titles)."""
    ids = (*vocab.ids, *(i.id for i in new))
    if vocab.titles is None and not titles:
        return ItemVocab(ids)
    old = vocab.titles or vocab.ids
    return ItemVocab(
        ids, tuple(titles.get(i, t) for i, t in zip(ids, (*old, *(i.id for i in new)), strict=True))
    )


def _write_model(catalogue: _Catalogue, src: Path, dst: Path) -> str:
    """Writes the changed model folder ``dst``: the rewritten files, hard links of the others,
    and a manifest whose version derives from the new checksums. Returns that version."""
    dst.mkdir()
    files = dict(catalogue.manifest["files"])
    for name in [n for n in files if n not in _REWRITTEN]:
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(src / name, dst / name)
    catalogue.vocab.save(dst / VOCAB_FILE)
    np.save(dst / EMBEDDINGS_FILE, catalogue.embeddings)
    (dst / ATTRIBUTES_FILE).write_text(json.dumps(catalogue.attributes, ensure_ascii=False))
    (dst / REMOVED_FILE).write_text(json.dumps(sorted(catalogue.removed), ensure_ascii=False))
    for name in _REWRITTEN:
        files[name] = sha256_file(dst / name)
    manifest = {
        **catalogue.manifest,
        "files": files,
        "num_items": len(catalogue.vocab),
        "tower_items": int(catalogue.manifest.get("tower_items", catalogue.manifest["num_items"])),
        "previous_version": catalogue.manifest["version"],
        "created": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "version": derived_version(files),
    }
    (dst / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return str(manifest["version"])


def change_catalogue(
    root: Path,
    items: Sequence[CatalogueItem] = (),
    remove: Sequence[str] = (),
    *,
    keep: int = 3,
    grace: float = PUBLISH_GRACE,
    check: Callable[[Path], object] | None = None,
) -> CatalogueChange:
    """Adds, updates and removes items of the current version of the deployment ``root`` and
    publishes the result as its new current version (:func:`retrieval.storage.versions.publish`).

    Args:
        items: items to add; an id already in the catalogue is updated (new attributes and
            title; a trained item keeps its id embedding) and comes back if it was removed.
        remove: external ids to take out of the index (they stay readable as history).
        keep: versions kept on disk (:func:`retrieval.storage.versions.publish`).
        grace: seconds an older version stays on disk after it stopped being current (idem).
        check: called with the new version's folder before it becomes current (as
            :func:`retrieval.artifacts.deployment.publish_deployment`'s).

    Raises:
        ArtifactError: ``root`` has no current version, its model cannot embed new items, or
            its index is not a FAISS file.
        ValueError: a bad change (see :func:`cold_vectors`; an id both added and removed, an
            unknown id to remove).
    """
    folder = resolve_current(Path(root))
    model_dir, index_dir = deployment_dirs(folder)
    refuse_outside_links(folder)
    catalogue = _read_catalogue(model_dir)
    index, index_manifest = load_index(index_dir, expected_model_version=catalogue.manifest["version"])
    if not isinstance(index, FaissIndex):
        raise ArtifactError(
            f"{index_dir} is a {index_manifest['backend']} index: items are added to FAISS deployments "
            "only (upsert into the collection itself)"
        )
    ids, vectors, gone, updated = _apply(catalogue, items, remove)
    keep_ids = ~np.isin(ids, catalogue.vocab.lookup(sorted(catalogue.removed)))
    index.remove(gone)
    try:
        index.upsert(ids[keep_ids], vectors[keep_ids])
    except ValueError as e:
        raise ValueError(f"the index refuses the new vectors: {e}") from e
    rankers = [p for p in sorted((folder / RANKERS_DIR).glob("*")) if p.is_dir()]
    versions: list[str] = []

    def write(new: Path) -> None:
        new.mkdir()
        versions.append(_write_model(catalogue, model_dir, new / MODEL_DIR))
        extra = {k: index_manifest[k] for k in ("measured", "tuning") if k in index_manifest}
        save_index(index, new / INDEX_DIR, versions[0], **extra)
        for ranker in rankers:
            copy_listed(
                ranker, read_manifest(ranker, "ranker", verify=False), new / RANKERS_DIR / ranker.name
            )
        if check is not None:
            check(new)

    published = publish(Path(root), write, keep, grace)
    return CatalogueChange(
        published, versions[0], len(items) - updated, updated, len(remove), len(catalogue.vocab)
    )
