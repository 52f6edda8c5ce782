"""What a ranker reads besides item ids, built the same way in training, evaluation and serving:
each item's attribute ids (:class:`AttributeTable`) and a request's context (:func:`context_of`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from retrieval.data.vocab import PAD, ItemVocab

if TYPE_CHECKING:  # for types only: the model artifact's module loads pandas
    from retrieval.artifacts.model import ModelArtifact


MAX_ATTRIBUTES = 16
"""Attributes kept per item (the first ones, duplicates dropped), as the item tower does."""


@dataclass(frozen=True)
class AttributeTable:
    """Item attributes as ids a ranker embeds.

    Attributes:
        names: attribute values; attribute id ``i`` is ``names[i - 1]`` (0 = padding).
        table: int32 ``[num_items + 1, A]``: row ``i`` holds dense item ``i``'s attribute ids,
            left-aligned and 0-padded; row 0 (padding) is all 0.

    Example:
        >>> t = AttributeTable.from_external(vocab, {"B01": ["Lipstick", "Brand 7"]})
        >>> t.table[vocab.lookup(["B01"])[0]]  # array([1, 2], dtype=int32)
    """

    names: tuple[str, ...]
    table: np.ndarray

    @classmethod
    def from_external(
        cls,
        vocab: ItemVocab,
        item_attributes: Mapping[str, Sequence[Any]],
        max_attributes: int = MAX_ATTRIBUTES,
    ) -> AttributeTable:
        """From external item id -> attribute values (ids unknown to ``vocab`` are ignored).

        Attribute ids follow the sorted attribute names; each item keeps its first
        ``max_attributes`` distinct values.
        """
        dense = vocab.lookup(list(item_attributes))
        per_item = {
            int(d): list(dict.fromkeys(str(v) for v in values))[:max_attributes]
            for d, values in zip(dense, item_attributes.values(), strict=True)
            if d != PAD
        }
        names = tuple(sorted({v for values in per_item.values() for v in values}))
        index = {name: i + 1 for i, name in enumerate(names)}
        width = max([len(v) for v in per_item.values()] + [1])
        table = np.zeros((vocab.num_embeddings, width), np.int32)
        for item, values in per_item.items():
            table[item, : len(values)] = [index[v] for v in values]
        return cls(names, table)

    @classmethod
    def from_model(cls, model: ModelArtifact) -> AttributeTable | None:
        """The attributes saved with a retrieval model (``item_attributes.json``, catalogue
        changes applied); ``None`` when the model folder has none or the attributes are empty."""
        from retrieval.artifacts.model import read_item_attributes

        raw = None if model.path is None else read_item_attributes(model.path)
        if raw is None:
            return None
        table = cls.from_external(model.vocab, raw)
        return table if table.names else None

    @property
    def num_attributes(self) -> int:
        return len(self.names)

    @property
    def width(self) -> int:
        """``A``, attribute slots per item."""
        return int(self.table.shape[1])


def context_of(candidates: np.ndarray, width: int) -> np.ndarray:
    """Each row's first ``width`` real candidates (id > 0) in the order given, 0-padded: int32
    ``[B, width]``. Candidates come in the retriever's order, so this is the request's top
    retrieved items, DSTN's ``"context"`` (:mod:`rankers.dstn`)."""
    present = candidates > 0
    order = np.argsort(~present, axis=1, kind="stable")[:, :width]  # real ones first, in order
    top = np.where(
        np.take_along_axis(present, order, axis=1), np.take_along_axis(candidates, order, axis=1), 0
    )
    return np.pad(top, ((0, 0), (0, width - top.shape[1]))).astype(np.int32)
