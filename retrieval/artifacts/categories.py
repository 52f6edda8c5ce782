"""The items' attributes as serving uses them: a category code per item for the diversity merge,
and the members of every category for ``category`` filters.

Built once from a model's ``item_attributes.json`` (:meth:`Categories.of`) and then, for each
catalogue change, from the previous one and the changed items only (:meth:`Categories.changed`),
so that a change costs its own size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from index import ItemCategories, sorted_update
from retrieval.data.vocab import PAD, ItemVocab


@dataclass(frozen=True)
class Categories:
    """Attributes:
    attributes: external id -> attribute values (the first is the item's category).
    codes: int64 ``[num_items + 1]``, a category code per dense id: items with the same first
        attribute share one; an item without attributes (and the padding row) has a code of
        its own, ``num_items + 1 + id``, above every shared code.
    names: first attribute -> its shared code.
    members: category -> the dense ids of the items whose attributes contain it.
    """

    attributes: dict[str, list[str]]
    codes: np.ndarray
    names: dict[str, int]
    members: ItemCategories

    @classmethod
    def of(cls, vocab: ItemVocab, attributes: Mapping[str, Sequence[str]]) -> Categories:
        """From external id -> attributes; ids missing from ``vocab`` are left out."""
        n = vocab.num_embeddings
        none = cls({}, np.arange(n, dtype=np.int64) + n, {}, ItemCategories({}))
        return none.changed(vocab, attributes)

    def changed(self, vocab: ItemVocab, attributes: Mapping[str, Sequence[str]]) -> Categories:
        """These categories for ``vocab`` (this one's, grown) with the items of ``attributes``
        given those attributes instead of their own."""
        n, before = vocab.num_embeddings, len(self.codes)
        codes = np.arange(n, dtype=np.int64) + n
        shared = self.codes < before  # own codes are at least the row count
        codes[:before][shared] = self.codes[shared]
        names = dict(self.names)
        drop: dict[str, list[int]] = {}
        add: dict[str, list[int]] = {}
        external = list(attributes)
        dense = vocab.lookup(external) if external else np.zeros(0, np.int64)
        for item, d in zip(external, dense.tolist(), strict=True):
            if d == PAD:
                continue
            for value in set(self.attributes.get(item, ())):
                drop.setdefault(str(value), []).append(d)
            values = attributes[item]
            for value in set(values):
                add.setdefault(str(value), []).append(d)
            codes[d] = names.setdefault(str(values[0]), len(names)) if values else d + n
        members = dict(self.members.ids_by_category)
        for name in drop.keys() | add.keys():
            ids = sorted_update(
                members.get(name, np.zeros(0, np.int64)), drop.get(name, ()), add.get(name, ())
            )
            if len(ids):
                members[name] = ids
            else:
                members.pop(name, None)
        merged = {**self.attributes, **{k: list(v) for k, v in attributes.items()}}
        return Categories(merged, codes, names, ItemCategories(members))
