"""Item vocabulary: external item ids (strings) <-> dense indices, 0 kept for padding."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path

import numpy as np

PAD = 0


@dataclass(frozen=True)
class ItemVocab:
    """Dense item indices ``1..len(vocab)`` for external ids; index 0 is padding.

    Attributes:
        ids: external ids; ``ids[i]`` has dense index ``i + 1``.
        titles: optional human-readable titles aligned with ``ids``.
    """

    ids: tuple[str, ...]
    titles: tuple[str, ...] | None = None
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    _by_index: np.ndarray = field(init=False, repr=False, compare=False)  # object [n + 1], row 0 ""

    def __post_init__(self) -> None:
        index = dict(zip(self.ids, range(1, len(self.ids) + 1), strict=True))
        if len(index) != len(self.ids):
            raise ValueError("ItemVocab ids must be unique")
        if self.titles is not None and len(self.titles) != len(self.ids):
            raise ValueError(f"{len(self.titles)} titles for {len(self.ids)} items")
        object.__setattr__(self, "_index", index)
        by_index = np.empty(len(self.ids) + 1, object)
        by_index[0], by_index[1:] = "", self.ids
        object.__setattr__(self, "_by_index", by_index)

    @classmethod
    def from_ids(cls, ids: Iterable[str], titles: dict[str, str] | None = None) -> ItemVocab:
        """Builds a vocabulary in the given order (duplicates keep their first place)."""
        unique = tuple(dict.fromkeys(str(i) for i in ids))
        aligned = None if titles is None else tuple(titles.get(i, i) for i in unique)
        return cls(unique, aligned)

    def extended(self, ids: Sequence[str], titles: Mapping[str, str] | None = None) -> ItemVocab:
        """This vocabulary with the unknown ``ids`` appended in order (known dense ids never
        move) and ``titles`` (external id -> title) replacing those of their items. Costs a copy
        of the id index, not a rebuild of it.
        """
        index = dict(self._index)
        new = [i for i in dict.fromkeys(map(str, ids)) if i not in index]
        index.update({item: len(self.ids) + 1 + n for n, item in enumerate(new)})
        vocab = object.__new__(ItemVocab)
        all_titles = self.titles
        if titles or all_titles is not None:
            old = all_titles if all_titles is not None else self.ids
            all_titles = (*old, *new)
            if titles:
                changed = list(all_titles)
                for item, title in titles.items():
                    changed[index[item] - 1] = title
                all_titles = tuple(changed)
        object.__setattr__(vocab, "ids", (*self.ids, *new))
        object.__setattr__(vocab, "titles", all_titles)
        object.__setattr__(vocab, "_index", index)
        object.__setattr__(vocab, "_by_index", np.concatenate([self._by_index, np.array(new, object)]))
        return vocab

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def num_embeddings(self) -> int:
        """Rows an embedding table needs: every item plus the padding row."""
        return len(self.ids) + 1

    def __contains__(self, item_id: str) -> bool:
        return item_id in self._index

    def lookup(self, item_ids: Sequence[str]) -> np.ndarray:
        """External ids -> int64 dense indices ``[n]``; unknown ids map to ``PAD`` (0)."""
        return np.fromiter(map(self._index.get, item_ids, repeat(PAD)), np.int64, len(item_ids))

    def external(self, indices: np.ndarray | Sequence[int]) -> list[str]:
        """Dense indices (``>= 1``) -> external ids.

        Raises:
            IndexError: an index outside ``1..len(vocab)``.
        """
        dense = np.asarray(indices, np.int64)
        if dense.size and (dense.min() < 1 or dense.max() > len(self.ids)):
            bad = dense[(dense < 1) | (dense > len(self.ids))][0]
            raise IndexError(f"dense index {bad} is not in 1..{len(self.ids)}")
        return self._by_index[dense].tolist()

    def title(self, index: int) -> str:
        """Title of dense index ``index`` (its external id when titles are unknown)."""
        return (self.titles or self.ids)[index - 1]

    def save(self, path: Path) -> None:
        """Writes the vocabulary as JSON."""
        payload = {"ids": list(self.ids), "titles": None if self.titles is None else list(self.titles)}
        Path(path).write_text(json.dumps(payload, ensure_ascii=False))

    @classmethod
    def load(cls, path: Path) -> ItemVocab:
        """Reads a vocabulary written by :meth:`save`."""
        payload = json.loads(Path(path).read_text())
        titles = payload.get("titles")
        return cls(tuple(payload["ids"]), None if titles is None else tuple(titles))
