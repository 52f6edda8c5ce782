"""Catalogue changes layered over a model's and an index's files.

``mitt add-items`` does not rewrite a million-item catalogue to add a thousand items: the new
version hard-links the files of the one it changed and adds, per folder, the change since those
files were written (cumulative: the latest state of every item changed since):

    model/catalogue_changes.json  {"items": [{"id", "attributes", "title", "removed"}, ...]},
                                  in the order the items were first changed
    model/catalogue_vectors.npy   float32 [changes, d], their vectors (aligned)
    index/changes.npz             int64 ids [changes], float32 vectors [changes, d], bool removed

A reader applies them to what the base files hold (:func:`grown_vocab`, :func:`changed_attributes`
and the model and index loaders); a server applies them to the version it serves instead when
that version's own changes are a prefix of these (:meth:`CatalogueChanges.extends`), so that a
change costs its own size, not the catalogue's. Items never seen in the vocabulary are appended
in order, so dense ids never move.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.artifacts.arrays import checked_vectors, load_vectors
from retrieval.data.vocab import ItemVocab
from retrieval.storage.manifest import ArtifactError

CHANGES_FILE = "catalogue_changes.json"
CHANGE_VECTORS_FILE = "catalogue_vectors.npy"
INDEX_CHANGES_FILE = "changes.npz"


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
class CatalogueChanges:
    """The latest state of every item changed since a model's files were written.

    Attributes:
        items: the changed items, in the order they were first changed (a removed one keeps
            the attributes and title of its last change, none if it had none).
        removed: bool ``[n]``, whether each is removed (out of the index, still in the vocabulary).
        vectors: float32 ``[n, d]``, each item's vector (its last one, for a removed item).
    """

    items: tuple[CatalogueItem, ...]
    removed: np.ndarray
    vectors: np.ndarray

    @classmethod
    def none(cls, dim: int) -> CatalogueChanges:
        """No change."""
        return cls((), np.zeros(0, bool), np.zeros((0, dim), np.float32))

    @property
    def ids(self) -> list[str]:
        return [item.id for item in self.items]

    def __len__(self) -> int:
        return len(self.items)

    @property
    def has_vector(self) -> np.ndarray:
        """bool ``[n]``: whether each item's vector is known (it was added or updated; an item
        that was only removed keeps the vector its base files hold)."""
        return np.array([bool(i.attributes) for i in self.items], bool)

    def extends(self, earlier: CatalogueChanges) -> bool:
        """Whether these changes continue ``earlier`` (its items come first, in its order), so
        that applying them over a state ``earlier`` was applied to gives what applying them
        over the base gives."""
        return len(earlier) <= len(self) and self.ids[: len(earlier)] == earlier.ids

    def since(self, earlier: CatalogueChanges) -> CatalogueChanges:
        """The items whose state differs from ``earlier``'s, which these extend (:meth:`extends`):
        what applying them over a state ``earlier`` was applied to still has to do."""
        n = len(earlier)
        same = (self.removed[:n] == earlier.removed) & (self.vectors[:n] == earlier.vectors).all(axis=1)
        same &= np.array([a == b for a, b in zip(self.items[:n], earlier.items, strict=True)], bool)
        keep = np.concatenate([~same, np.ones(len(self) - n, bool)])
        rows = [item for item, k in zip(self.items, keep, strict=True) if k]
        return CatalogueChanges(tuple(rows), self.removed[keep], self.vectors[keep])

    def then(
        self, items: Sequence[CatalogueItem], vectors: np.ndarray, removed: Sequence[str]
    ) -> CatalogueChanges:
        """These changes followed by ``items`` (added or updated, ``vectors`` aligned) and the
        removal of ``removed``: an item changed again keeps its place (and its title, unless
        given a new one), a new one goes last."""
        position = {item.id: n for n, item in enumerate(self.items)}
        rows = list(self.items)
        gone, vecs = list(self.removed), list(self.vectors)
        for item, vector, out in [
            *((i, v, False) for i, v in zip(items, vectors, strict=True)),
            *((CatalogueItem(r, ()), None, True) for r in removed),
        ]:
            n = position.setdefault(item.id, len(rows))
            if n == len(rows):
                rows.append(item)
                gone.append(out)
                vecs.append(np.zeros(self.vectors.shape[1], np.float32) if vector is None else vector)
                continue
            title = rows[n].title if item.title is None else item.title  # an update keeps a title
            rows[n] = rows[n] if out else CatalogueItem(item.id, item.attributes, title)
            gone[n] = out
            vecs[n] = vecs[n] if vector is None else vector
        dim = self.vectors.shape[1]
        return CatalogueChanges(
            tuple(rows), np.array(gone, bool), np.array(vecs, np.float32).reshape(-1, dim)
        )

    def save(self, folder: Path) -> list[str]:
        """Writes the model folder's change files; returns their names."""
        rows = [
            {"id": i.id, "attributes": list(i.attributes), "title": i.title, "removed": bool(r)}
            for i, r in zip(self.items, self.removed, strict=True)
        ]
        (folder / CHANGES_FILE).write_text(json.dumps({"items": rows}, ensure_ascii=False))
        np.save(folder / CHANGE_VECTORS_FILE, self.vectors)
        return [CHANGES_FILE, CHANGE_VECTORS_FILE]

    @classmethod
    def load(cls, folder: Path, dim: int) -> CatalogueChanges:
        """Reads the model folder's change files, checked.

        Raises:
            ArtifactError: unreadable or inconsistent files.
        """
        file = folder / CHANGES_FILE
        try:
            rows = json.loads(file.read_text(encoding="utf-8"))["items"]
            items = tuple(_item(row) for row in rows)
            removed = np.array([row["removed"] is True for row in rows], bool)
        except (ValueError, TypeError, KeyError, RecursionError, UnicodeDecodeError) as e:
            raise ArtifactError(f"{file} is not a valid list of catalogue changes: {e}") from e
        if len({i.id for i in items}) != len(items):
            raise ArtifactError(f"{file} names an item twice")
        vectors = load_vectors(folder / CHANGE_VECTORS_FILE, len(items), dim)
        return cls(items, removed, vectors)


def _item(row: Mapping[str, Any]) -> CatalogueItem:
    attributes, title = row["attributes"], row["title"]
    if not isinstance(row["id"], str) or not isinstance(row["removed"], bool):
        raise ValueError(f"bad item {row!r:.80}")
    if not isinstance(attributes, list) or not all(isinstance(a, str) for a in attributes):
        raise ValueError(f"item {row['id']!r}: attributes must be a list of strings")
    if title is not None and not isinstance(title, str):
        raise ValueError(f"item {row['id']!r}: title must be a string")
    return CatalogueItem(row["id"], tuple(attributes), title)


def grown_vocab(vocab: ItemVocab, changes: CatalogueChanges) -> ItemVocab:
    """``vocab`` with the changed items it lacks appended and the changed titles set."""
    titles = {i.id: i.title for i in changes.items if i.title is not None}
    return vocab.extended(changes.ids, titles)


def changed_attributes(
    attributes: Mapping[str, list[str]], changes: CatalogueChanges
) -> dict[str, list[str]]:
    """A copy of external id -> attributes with those of the items changes add or update (one
    only removed keeps what it had)."""
    out = dict(attributes)
    known = zip(changes.items, changes.has_vector, strict=True)
    out.update({i.id: list(i.attributes) for i, k in known if k})
    return out


@dataclass(frozen=True)
class IndexChanges:
    """An index folder's changes: dense ``ids`` int64 ``[n]`` with their ``vectors`` float32
    ``[n, d]``, and whether each is ``removed`` (bool ``[n]``), in the model's change order."""

    ids: np.ndarray
    vectors: np.ndarray
    removed: np.ndarray

    def save(self, folder: Path) -> list[str]:
        np.savez(folder / INDEX_CHANGES_FILE, ids=self.ids, vectors=self.vectors, removed=self.removed)
        return [INDEX_CHANGES_FILE]

    @classmethod
    def load(cls, folder: Path, dim: int) -> IndexChanges:
        """Reads an index folder's change file, checked.

        Raises:
            ArtifactError: unreadable or inconsistent.
        """
        file = folder / INDEX_CHANGES_FILE
        try:
            with np.load(file, allow_pickle=False) as z:
                ids, vectors, removed = z["ids"], z["vectors"], z["removed"]
        except (ValueError, OSError, EOFError, KeyError) as e:
            raise ArtifactError(f"{file} is not a readable change file: {e}") from e
        if ids.dtype != np.int64 or removed.dtype != bool or ids.shape != removed.shape or ids.ndim != 1:
            raise ArtifactError(f"{file}: expected int64 ids and bool removed of one length")
        if len(ids) and (ids.min() < 1 or len(np.unique(ids)) != len(ids)):
            raise ArtifactError(f"{file}: ids must be distinct and >= 1")
        return cls(ids, checked_vectors(vectors, len(ids), dim, str(file)), removed)

    @classmethod
    def none(cls, dim: int) -> IndexChanges:
        """No change."""
        return cls(np.zeros(0, np.int64), np.zeros((0, dim), np.float32), np.zeros(0, bool))

    def since(self, earlier: IndexChanges) -> IndexChanges:
        """The rows that differ from ``earlier``'s, which these extend (:meth:`extends`): what
        applying them over a state ``earlier`` was applied to still has to do."""
        n = len(earlier.ids)
        same = (self.removed[:n] == earlier.removed) & (self.vectors[:n] == earlier.vectors).all(axis=1)
        keep = np.concatenate([~same, np.ones(len(self.ids) - n, bool)])
        return IndexChanges(self.ids[keep], self.vectors[keep], self.removed[keep])

    def extends(self, earlier: IndexChanges) -> bool:
        """Whether ``earlier``'s ids come first here, in its order."""
        n = len(earlier.ids)
        return n <= len(self.ids) and bool((self.ids[:n] == earlier.ids).all())
