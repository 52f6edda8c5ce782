"""Side features: the vocabularies and the per-event encodings shared by training and serving.

A model trained with side information keeps a :class:`SideVocab` in its artifact
(``side_vocab.json``); the server encodes each request's events with the same functions the
training data went through, so the two can never drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retrieval.data import SequenceData

SIDE_FEATURES = ("attributes", "action", "gap_prev")
ACTION_COLUMNS = ("action", "rating")
"""Event columns read as the ``action`` feature, first found wins."""
GAP_BUCKETS = 24
"""``gap_prev`` values: 1 = first event of the history, ``2 + floor(log2(1 + seconds))`` capped."""


@dataclass(frozen=True)
class SideVocab:
    """Which side features a model uses, and their value vocabularies (ids start at 1; 0 = none).

    Attributes:
        features: the features used, a subset of :data:`SIDE_FEATURES`.
        actions: action values (as strings), id ``i + 1`` for ``actions[i]``.
        attributes: item attribute values, id ``i + 1`` for ``attributes[i]``.
        max_attributes: attributes kept per item.
    """

    features: tuple[str, ...] = ()
    actions: tuple[str, ...] = ()
    attributes: tuple[str, ...] = ()
    max_attributes: int = 0

    @property
    def event_features(self) -> tuple[str, ...]:
        """The per-event inputs of the user tower besides ``items``."""
        return tuple(f for f in self.features if f != "attributes")

    def vocab_sizes(self) -> dict[str, int]:
        """Per-event feature -> number of values, for ``towers.side.SideEmbedding``."""
        sizes = {"action": len(self.actions), "gap_prev": GAP_BUCKETS}
        return {f: sizes[f] for f in self.event_features}

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.__dict__, ensure_ascii=False))

    @classmethod
    def load(cls, path: Path) -> SideVocab:
        payload = json.loads(Path(path).read_text())
        return cls(
            tuple(payload["features"]),
            tuple(payload["actions"]),
            tuple(payload["attributes"]),
            int(payload["max_attributes"]),
        )


def parse_side_features(spec: str) -> tuple[str, ...]:
    """``"attributes,action"`` -> ``("attributes", "action")``; ``""`` -> ``()``."""
    names = tuple(dict.fromkeys(n.strip() for n in spec.split(",") if n.strip()))
    unknown = [n for n in names if n not in SIDE_FEATURES]
    if unknown:
        raise ValueError(f"unknown side features {unknown}; choose from {list(SIDE_FEATURES)}")
    return names


def action_column(columns: Sequence[str]) -> str | None:
    """The event column that holds actions, if any."""
    return next((c for c in ACTION_COLUMNS if c in columns), None)


def gap_prev_buckets(timestamps: np.ndarray) -> np.ndarray:
    """Bucketised seconds since the previous event, int32 ``[n]`` (1 for the first event)."""
    t = np.asarray(timestamps, np.float64)
    gaps = np.diff(t, prepend=t[:1])
    buckets = 2 + np.floor(np.log2(1.0 + np.maximum(gaps, 0.0)))
    buckets = np.minimum(buckets, GAP_BUCKETS).astype(np.int32)
    if len(buckets):
        buckets[0] = 1
    return buckets


def encode_events(vocab: SideVocab, timestamps: np.ndarray | None, actions: Sequence[str] | None) -> dict:
    """One history's per-event side inputs ``{name: int32 [n]}`` (0 where a value is unknown)."""
    out: dict[str, np.ndarray] = {}
    if "action" in vocab.event_features:
        index = {a: i + 1 for i, a in enumerate(vocab.actions)}
        out["action"] = np.array([index.get(str(a), 0) for a in (actions or [])], np.int32)
    if "gap_prev" in vocab.event_features:
        out["gap_prev"] = gap_prev_buckets(np.asarray(timestamps if timestamps is not None else [], np.int64))
    return out


def attribute_table(
    vocab: SideVocab, item_attributes: Mapping[int, Sequence[str]], num_embeddings: int
) -> np.ndarray:
    """Item -> attribute ids, int32 ``[num_embeddings, max_attributes]`` (0 = none)."""
    index = {a: i + 1 for i, a in enumerate(vocab.attributes)}
    table = np.zeros((num_embeddings, vocab.max_attributes), np.int32)
    for item, attributes in item_attributes.items():
        ids = [index[a] for a in dict.fromkeys(attributes) if a in index][: vocab.max_attributes]
        table[item, : len(ids)] = ids
    return table


MAX_ATTRIBUTES = 16
"""Attributes kept per item (the rest are dropped): bounds the item tower's lookup table."""


def build_side_vocab(data: SequenceData, features: Sequence[str]) -> SideVocab:
    """Vocabularies of the requested side features, read from the data.

    Raises:
        ValueError: the data lacks what a feature needs (attributes, an action column, real time).
    """
    if "attributes" in features and not data.item_attributes:
        raise ValueError("side feature 'attributes' needs item attributes, and this data has none")
    column = action_column(list(data.event_columns))
    if "action" in features and column is None:
        raise ValueError(f"side feature 'action' needs an event column named one of {ACTION_COLUMNS}")
    if "gap_prev" in features and not data.has_time:
        raise ValueError("side feature 'gap_prev' needs timestamps, and this data only orders events")
    actions: tuple[str, ...] = ()
    if "action" in features and column is not None:
        actions = tuple(sorted({str(a) for seq in data.event_columns[column] for a in seq}))
    attributes: tuple[str, ...] = ()
    max_attributes = 0
    if "attributes" in features and data.item_attributes:
        attributes = tuple(sorted({a for values in data.item_attributes.values() for a in values}))
        max_attributes = min(MAX_ATTRIBUTES, max(len(set(v)) for v in data.item_attributes.values()))
    return SideVocab(tuple(f for f in SIDE_FEATURES if f in features), actions, attributes, max_attributes)


def user_event_features(data: SequenceData, vocab: SideVocab) -> dict[str, tuple[np.ndarray, ...]]:
    """Every user's encoded per-event side inputs, aligned with ``data.sequences``."""
    column = action_column(list(data.event_columns))
    timestamps = data.event_columns.get("timestamp")
    encoded = [
        encode_events(
            vocab,
            None if timestamps is None else timestamps[u],
            None if column is None else [str(a) for a in data.event_columns[column][u]],
        )
        for u in range(len(data.sequences))
    ]
    return {name: tuple(e[name] for e in encoded) for name in vocab.event_features}
