"""A living catalogue: items added, updated and removed after training, published as a new
version of a deployment (:mod:`retrieval.artifacts.deployment`) that a watching server swaps in.

An item the model never saw gets the vector of its attributes alone (:func:`cold_vectors`, the
item tower's attribute part: meaningful when the model was trained with ``side_features``
``attributes``, better with ``model.id_dropout``). It is appended to the vocabulary (new dense
ids past ``tower_items``: retrieved, never read as history) and upserted into the index. A
removed item leaves the index; it stays in the vocabulary, since histories may still hold it
(removing needs no vector: a model trained without attributes removes items too). A model that
scores by cosine stores unit-length vectors, from which a trained item's id part cannot be
separated: it takes new items, removals, and updates that keep a trained item's attribute part
(:func:`_vectors`).

A change costs its own size: the new version hard-links every file of the current one and adds
the changes since those files were written (:mod:`retrieval.artifacts.changes`), which a
watching server applies to the catalogue and the index it already holds
(:meth:`retrieval.serving.retriever.Retriever.from_dirs`'s ``reuse``). Once the changes exceed
:data:`COMPACT_SHARE` of the catalogue (or with ``compact``), the version is written whole
instead: its files hold the changes, and the next changes start from them.

A change holds the root's writer lock (:func:`retrieval.storage.versions.writer_lock`) from
reading the current version to publishing the next, so changes and deploys made at the same
time apply one after the other, each to the version the one before published. A change with no
item to add and no id to take out (none given, or all removed already) publishes nothing.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from index import check_mips_norm
from retrieval.artifacts.arrays import load_vectors, scored_rows
from retrieval.artifacts.changes import (
    CHANGE_VECTORS_FILE,
    CHANGES_FILE,
    CatalogueChanges,
    CatalogueItem,
    IndexChanges,
    grown_vocab,
)
from retrieval.artifacts.deployment import INDEX_DIR, MODEL_DIR, RANKERS_DIR, copy_listed, deployment_dirs
from retrieval.artifacts.index import KIND as INDEX_KIND
from retrieval.artifacts.index import load_index, save_index
from retrieval.artifacts.model import (
    ATTRIBUTE_EMBEDDINGS_FILE,
    ATTRIBUTES_FILE,
    EMBEDDINGS_FILE,
    KIND,
    REMOVED_FILE,
    SIDE_FILE,
    VOCAB_FILE,
    load_catalogue,
    load_vocab,
    manifest_similarity,
    read_item_attributes,
)
from retrieval.data.features import SideVocab, attribute_table
from retrieval.data.vocab import PAD, ItemVocab
from retrieval.storage.folders import derive_folder, remove_folder
from retrieval.storage.manifest import ArtifactError, read_manifest, refuse_outside_links, sha256_file
from retrieval.storage.versions import PUBLISH_GRACE, publish, resolve_current, writer_lock

__all__ = ["CatalogueChange", "CatalogueItem", "change_catalogue", "cold_vectors", "read_ids", "read_items"]

COMPACT_SHARE, COMPACT_MIN = 0.1, 10_000
"""A catalogue change is written whole once the changes it carries exceed both this share of
the items its base files hold and this many items (small catalogues never need it)."""


@dataclass(frozen=True)
class CatalogueChange:
    """What :func:`change_catalogue` published: the version folder and the counts (``removed``
    counts the ids taken out, ``already_removed`` those that were out already)."""

    folder: Path
    model_version: str
    added: int
    updated: int
    removed: int
    items: int
    compacted: bool
    already_removed: int = 0


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
    side: SideVocab,
    attribute_embeddings: np.ndarray,
    attributes: Sequence[Sequence[str]],
    similarity: str = "dot",
) -> np.ndarray:
    """The item tower's vectors of items it never saw, from their attributes: float32 ``[n, d]``,
    the mean embedding of each item's first ``side.max_attributes`` distinct known attributes
    (``towers.item.ItemTower.attributes``), at unit length for a model whose ``similarity`` is
    ``"cosine"`` (as its ``item_embeddings``).

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
    return scored_rows(vectors, similarity)


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
class _Current:
    """What a change reads of the current version's model folder (never the user tower, nor
    the whole item table): ``side`` and ``attribute_embeddings`` only for a model trained with
    item attributes, ``removed`` the external ids out of the index now."""

    folder: Path
    manifest: dict[str, Any]
    vocab: ItemVocab
    base_items: int
    changes: CatalogueChanges
    removed: frozenset[str]
    similarity: str
    side: SideVocab | None = None
    attribute_embeddings: np.ndarray | None = None

    def attribute_tables(self) -> tuple[SideVocab, np.ndarray]:
        """The side vocabulary and the attribute embeddings that embed items from attributes.

        Raises:
            ArtifactError: the model was trained without item attributes.
        """
        if self.side is None or self.attribute_embeddings is None:
            raise ArtifactError(
                f"model {self.manifest['version']} was trained without item attributes, so it cannot "
                "embed items it never saw: train with --set model.side_features=attributes (and "
                "model.id_dropout, e.g. 0.5) on data with item attributes"
            )
        return self.side, self.attribute_embeddings


def _read_current(model_dir: Path) -> _Current:
    """Reads and verifies the small files a change needs.

    Raises:
        ArtifactError: a corrupted file.
    """
    manifest = read_manifest(model_dir, KIND, verify=False)
    listed = set(manifest.get("files", {}))
    read = {VOCAB_FILE, SIDE_FILE, ATTRIBUTE_EMBEDDINGS_FILE, REMOVED_FILE, CHANGES_FILE, CHANGE_VECTORS_FILE}
    manifest = read_manifest(model_dir, KIND, verified=listed - read)
    dim = int(manifest["dim"])
    base = load_vocab(model_dir)
    changes = CatalogueChanges.load(model_dir, dim) if CHANGES_FILE in listed else CatalogueChanges.none(dim)
    removed = _removed_now(model_dir, listed, changes)
    vocab = grown_vocab(base, changes)
    current = _Current(model_dir, manifest, vocab, len(base), changes, removed, manifest_similarity(manifest))
    if ATTRIBUTE_EMBEDDINGS_FILE in listed:
        current.side = SideVocab.load(model_dir / SIDE_FILE)
        current.attribute_embeddings = load_vectors(
            model_dir / ATTRIBUTE_EMBEDDINGS_FILE, len(current.side.attributes) + 1, dim
        )
    return current


def _removed_now(model_dir: Path, listed: set[str], changes: CatalogueChanges) -> frozenset[str]:
    """The external ids out of the index: the base files' removed items, then the changes'."""
    base: set[str] = set()
    if REMOVED_FILE in listed:
        ids = json.loads((model_dir / REMOVED_FILE).read_text(encoding="utf-8"))
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ArtifactError(f"{model_dir / REMOVED_FILE} is not a list of item ids")
        base = set(ids)
    out = {item.id for item, gone in zip(changes.items, changes.removed, strict=True) if gone}
    return frozenset((base - set(changes.ids)) | out)


def _vectors(current: _Current, items: Sequence[CatalogueItem], remove: Sequence[str]) -> np.ndarray:
    """The vectors of ``items``: cold-start vectors, except that a trained item keeps its id
    part (new attribute part, same id embedding); on a cosine model, whose stored vectors are
    unit length, a trained item keeps its latest vector and must keep its attribute part.

    Raises:
        ArtifactError: items to add to a model trained without item attributes.
        ValueError: an id both added and removed, an unknown id to remove, an item without a
            known attribute, or a cosine model's trained item with another attribute part.
    """
    both = sorted({i.id for i in items} & set(remove))
    if both:
        raise ValueError(f"{len(both)} ids are both added and removed, e.g. {both[0]!r}")
    unknown = [i for i in remove if i not in current.vocab]
    if unknown:
        raise ValueError(f"{len(unknown)} ids to remove are not in the catalogue, e.g. {unknown[0]!r}")
    if not items:  # removing needs no vector
        return np.zeros((0, int(current.manifest["dim"])), np.float32)
    side, attribute_embeddings = current.attribute_tables()
    means = cold_vectors(side, attribute_embeddings, [i.attributes for i in items])
    vectors = scored_rows(means, current.similarity)  # the new items' cold vectors
    dense = current.vocab.lookup([i.id for i in items])
    trained = (dense != PAD) & (dense <= int(current.manifest.get("tower_items", current.base_items)))
    if trained.any():
        ids = [i.id for i, t in zip(items, trained, strict=True) if t]
        table = np.load(_verified(current, EMBEDDINGS_FILE), mmap_mode="r", allow_pickle=False)
        now = _latest(current, ids, table, dense[trained])
        before, _ = _attribute_means(side, attribute_embeddings, [a for a, _ in now])
        latest = np.stack([v for _, v in now])
        if current.similarity == "cosine":
            _refuse_new_attribute_parts(ids, before, means[trained])
            vectors[trained] = latest
        else:
            vectors[trained] += latest - before
    return vectors


def _refuse_new_attribute_parts(ids: Sequence[str], before: np.ndarray, after: np.ndarray) -> None:
    """Refuses the trained items ``ids`` of a cosine model whose attribute part (``before``,
    float32 ``[n, d]``) would become ``after``.

    Raises:
        ValueError: some of them change it.
    """
    # The same attributes in another order sum in another order: equal up to float32 rounding.
    same = np.isclose(after, before, rtol=1e-5, atol=1e-6).all(axis=1)
    if not same.all():
        raise ValueError(
            f"{int((~same).sum())} trained items would change attributes, e.g. "
            f"{ids[int(np.flatnonzero(~same)[0])]!r}: the model scores by cosine, so its stored "
            "vectors are unit length and an item's id part cannot be separated from its attribute "
            "part; add it under a new id, or remove it, or train with --set model.similarity=dot "
            "--set train.temperature=1 to update attributes in place"
        )


def _latest(
    current: _Current, ids: Sequence[str], table: np.ndarray, dense: np.ndarray
) -> list[tuple[list[str], np.ndarray]]:
    """(attributes, vector) of trained items now: their last change's, else (never changed, or
    only removed) the base files'."""
    changes = current.changes
    pairs = zip(changes.items, changes.vectors, changes.has_vector, strict=True)
    changed = {i.id: (list(i.attributes), v) for i, v, known in pairs if known}
    if all(i in changed for i in ids) or ATTRIBUTES_FILE not in current.manifest["files"]:
        base: dict[str, list[str]] = {}
    else:
        base = json.loads(_verified(current, ATTRIBUTES_FILE).read_text(encoding="utf-8"))
    return [
        changed.get(i) or (base.get(i, []), np.asarray(table[d], np.float32))
        for i, d in zip(ids, dense, strict=True)
    ]


def _verified(current: _Current, name: str) -> Path:
    """The model folder's file ``name``, its checksum verified (the large files are read only
    when a change needs them).

    Raises:
        ArtifactError: it does not match the manifest.
    """
    if sha256_file(current.folder / name) != current.manifest["files"][name]:
        raise ArtifactError(f"{current.folder / name} does not match its checksum in the manifest")
    return current.folder / name


def change_catalogue(
    root: Path,
    items: Sequence[CatalogueItem] = (),
    remove: Sequence[str] = (),
    *,
    keep: int = 3,
    grace: float = PUBLISH_GRACE,
    check: Callable[[Path], object] | None = None,
    compact: bool | None = None,
) -> CatalogueChange:
    """Adds, updates and removes items of the current version of the deployment ``root`` and
    publishes the result as its new current version (:func:`retrieval.storage.versions.publish`).

    The root's writer lock (:func:`retrieval.storage.versions.writer_lock`) is held from reading
    the current version to publishing the new one: a change made while another writer publishes
    waits for it (one WARNING says so), then applies to what that writer published.

    Args:
        items: items to add; an id already in the catalogue is updated (new attributes and
            title; a trained item keeps its id embedding) and comes back if it was removed.
        remove: external ids to take out of the index (they stay readable as history).
        keep: versions kept on disk (:func:`retrieval.storage.versions.publish`).
        grace: seconds an older version stays on disk after it stopped being current (idem).
        check: called with the new version's folder before it becomes current (as
            :func:`retrieval.artifacts.deployment.publish_deployment`'s).
        compact: write the version whole (``True``) or as changes over the current files
            (``False``); by default whole once the changes exceed :data:`COMPACT_SHARE` and
            :data:`COMPACT_MIN`.

    Raises:
        ArtifactError: ``root`` has no current version, its model cannot embed items to add,
            or its index is not a FAISS file.
        ValueError: a bad change (see :func:`cold_vectors`; an id both added and removed, an
            unknown id to remove, new attributes for a trained item of a cosine model), or one
            with no item to add and no id to take out (none, or all removed already).
    """
    root = Path(root)
    deployment_dirs(root)  # a root that is not a deployment is refused before the lock file is made
    with writer_lock(root):
        return _publish_change(root, items, remove, keep, grace, check, compact)


def _publish_change(
    root: Path,
    items: Sequence[CatalogueItem],
    remove: Sequence[str],
    keep: int,
    grace: float,
    check: Callable[[Path], object] | None,
    compact: bool | None,
) -> CatalogueChange:
    """:func:`change_catalogue` once the root's writer lock is held."""
    folder = resolve_current(root)
    model_dir, index_dir = deployment_dirs(folder)
    refuse_outside_links(folder)
    current = _read_current(model_dir)
    index_manifest = read_manifest(index_dir, INDEX_KIND, verify=False)
    if index_manifest.get("backend") != "faiss":
        raise ArtifactError(
            f"{index_dir} is a {index_manifest.get('backend')} index: items are added to FAISS "
            "deployments only (upsert into the collection itself)"
        )
    already = [i for i in remove if i in current.removed]
    if not compact and not items and len(already) == len(remove):
        why = f"the {len(remove)} ids to remove are removed already" if remove else "no item to add or remove"
        raise ValueError(f"nothing to publish: {why}")
    vectors = _vectors(current, items, remove)
    if index_manifest.get("mips_norm"):
        try:
            check_mips_norm(vectors, float(index_manifest["mips_norm"]))
        except ValueError as e:
            raise ValueError(f"the index refuses the new vectors: {e}") from e
    changes = current.changes.then(items, vectors, remove)
    if compact is None:
        compact = len(changes) > max(COMPACT_MIN, COMPACT_SHARE * current.base_items)
    rankers = [p for p in sorted((folder / RANKERS_DIR).glob("*")) if p.is_dir()]
    versions: list[str] = []

    vocab = grown_vocab(current.vocab, changes)
    index = IndexChanges(vocab.lookup(changes.ids), changes.vectors, changes.removed)

    def write(new: Path) -> None:
        new.mkdir()
        model = _write_changes(current, changes, len(vocab), new / MODEL_DIR)
        derive_folder(
            index_dir, index_manifest, new / INDEX_DIR, index.save, {"model_version": model["version"]}
        )
        if compact:
            model = _compact(new)
        versions.append(str(model["version"]))
        for ranker in rankers:
            copy_listed(
                ranker, read_manifest(ranker, "ranker", verify=False), new / RANKERS_DIR / ranker.name
            )
        if check is not None:
            check(new)

    published = publish(root, write, keep, grace)
    updated = int((current.vocab.lookup([i.id for i in items]) != PAD).sum())
    added, removed = len(items) - updated, len(remove) - len(already)
    return CatalogueChange(published, versions[0], added, updated, removed, len(vocab), compact, len(already))


def _write_changes(current: _Current, changes: CatalogueChanges, items: int, dst: Path) -> dict[str, Any]:
    """The model folder ``dst``: the current one's files (hard links) and ``changes``."""
    updates = {
        "num_items": items,
        "tower_items": int(current.manifest.get("tower_items", current.base_items)),
        "previous_version": current.manifest["version"],
    }
    return derive_folder(current.folder, current.manifest, dst, changes.save, updates)


def _compact(new: Path) -> dict[str, Any]:
    """Rewrites the version ``new`` (written as changes) whole: its model files and its index
    hold the changes, and carry none. Returns the model's manifest."""
    model_dir, index_dir = new / MODEL_DIR, new / INDEX_DIR
    manifest = read_manifest(model_dir, KIND, verify=False)
    read = {VOCAB_FILE, EMBEDDINGS_FILE, ATTRIBUTES_FILE, REMOVED_FILE, CHANGES_FILE, CHANGE_VECTORS_FILE}
    # What is read is verified: a damaged base file must not become a whole file with a new checksum.
    manifest = read_manifest(model_dir, KIND, verified=set(manifest["files"]) - read)
    catalogue = load_catalogue(model_dir, manifest)
    attributes = read_item_attributes(model_dir)  # None: the model has none (removals only)
    removed = sorted(catalogue.vocab.external(catalogue.removed)) if len(catalogue.removed) else []

    def write(dst: Path) -> list[str]:
        catalogue.vocab.save(dst / VOCAB_FILE)
        np.save(dst / EMBEDDINGS_FILE, catalogue.embeddings)
        (dst / REMOVED_FILE).write_text(json.dumps(removed, ensure_ascii=False))
        if attributes is None:
            return [VOCAB_FILE, EMBEDDINGS_FILE, REMOVED_FILE]
        (dst / ATTRIBUTES_FILE).write_text(json.dumps(attributes, ensure_ascii=False))
        return [VOCAB_FILE, EMBEDDINGS_FILE, ATTRIBUTES_FILE, REMOVED_FILE]

    whole = dict(manifest)
    whole["files"] = {
        k: v for k, v in manifest["files"].items() if k not in (CHANGES_FILE, CHANGE_VECTORS_FILE)
    }
    staged = new / ".model"
    model = derive_folder(model_dir, whole, staged, write, {})
    index, index_manifest = load_index(index_dir)
    extra = {k: index_manifest[k] for k in ("measured", "tuning") if k in index_manifest}
    save_index(index, index_dir, model["version"], overwrite=True, **extra)
    remove_folder(model_dir)
    staged.rename(model_dir)
    return model
