"""Side features: the vocabularies and the per-event encodings shared by training and serving.

A model trained with side information keeps a :class:`SideVocab` in its artifact
(``side_vocab.json``); the server encodes each request's events with the same functions the
training data went through, so the two can never drift apart.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retrieval.data.interactions import SequenceData

SIDE_FEATURES = ("attributes", "action", "gap_prev", "gap_now")
ACTION_COLUMNS = ("action", "rating")
"""Event columns read as the ``action`` feature, first found wins."""
GAP_BUCKETS = 24
"""Values of the time features: ``2 + floor(log2(1 + seconds))`` capped at this; ``gap_prev``
uses 1 for the first event of a history."""


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
        sizes = {"action": len(self.actions), "gap_prev": GAP_BUCKETS, "gap_now": GAP_BUCKETS}
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


def gap_buckets(seconds: np.ndarray) -> np.ndarray:
    """``2 + floor(log2(1 + seconds))`` capped at :data:`GAP_BUCKETS` (negative gaps count as 0), int32."""
    gaps = np.maximum(np.asarray(seconds, np.float64), 0.0)
    return np.minimum(2 + np.floor(np.log2(1.0 + gaps)), GAP_BUCKETS).astype(np.int32)


def gap_prev_buckets(timestamps: np.ndarray) -> np.ndarray:
    """Bucketised seconds since the previous event, int32 ``[n]`` (1 for the first event)."""
    t = np.asarray(timestamps, np.float64)
    buckets = gap_buckets(np.diff(t, prepend=t[:1]))
    if len(buckets):
        buckets[0] = 1
    return buckets


def encode_events(
    vocab: SideVocab,
    timestamps: np.ndarray | None,
    actions: Sequence[str] | None,
    request_time: int | None = None,
) -> dict[str, np.ndarray]:
    """One history's per-event side inputs ``{name: int32 [n]}`` (0 where a value is unknown).

    ``request_time`` (seconds since the epoch) is when the history's next item is asked for:
    ``gap_now`` is the bucketised time from each event to it.

    Raises:
        ValueError: the vocabulary has ``gap_now`` and no ``request_time`` is given.
    """
    out: dict[str, np.ndarray] = {}
    t = np.asarray(timestamps if timestamps is not None else [], np.int64)
    if "action" in vocab.event_features:
        index = {a: i + 1 for i, a in enumerate(vocab.actions)}
        out["action"] = np.array([index.get(str(a), 0) for a in (actions or [])], np.int32)
    if "gap_prev" in vocab.event_features:
        out["gap_prev"] = gap_prev_buckets(t)
    if "gap_now" in vocab.event_features:
        if request_time is None:
            raise ValueError("side feature 'gap_now' needs the request time")
        out["gap_now"] = gap_buckets(request_time - t) if timestamps is not None else np.zeros(0, np.int32)
    return out


def history_features(
    per_user: Mapping[str, Sequence[np.ndarray]],
    users: Sequence[int] | np.ndarray,
    lengths: Sequence[int],
    *,
    request_time: bool = True,
) -> dict[str, list[np.ndarray]]:
    """Side inputs of histories that are prefixes of the users' sequences (:func:`user_event_features`):
    user ``users[i]``'s first ``lengths[i]`` events, with ``gap_now`` measured to the time of
    the event that follows the history (the request it stands for; the last event's own time
    when the history is the whole sequence). ``request_time=False`` keeps ``gap_now``'s raw
    timestamps, for ``retrieval.training.examples`` to measure each training example's gaps to its target."""
    out: dict[str, list[np.ndarray]] = {}
    for name, values in per_user.items():
        cut = [values[u][:n] for u, n in zip(users, lengths, strict=True)]
        if name == "gap_now" and request_time:
            cut = [
                gap_buckets(values[u][min(n, len(values[u]) - 1)] - c) if len(c) else c.astype(np.int32)
                for u, n, c in zip(users, lengths, cut, strict=True)
            ]
        out[name] = cut
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
    for name in ("gap_prev", "gap_now"):
        if name in features and not data.has_time:
            raise ValueError(f"side feature {name!r} needs timestamps, and this data only orders events")
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
    """Every user's encoded per-event side inputs, aligned with ``data.sequences``.

    ``gap_now`` depends on when a history is asked about, so it holds each event's raw
    timestamp (int64) here; :func:`history_features` and ``retrieval.training.examples`` turn it into
    buckets once the request time is known.
    """
    column = action_column(list(data.event_columns))
    timestamps = data.event_columns.get("timestamp")
    events = dataclasses.replace(vocab, features=tuple(f for f in vocab.features if f != "gap_now"))
    encoded = [
        encode_events(
            events,
            None if timestamps is None else timestamps[u],
            None if column is None else [str(a) for a in data.event_columns[column][u]],
        )
        for u in range(len(data.sequences))
    ]
    out = {name: tuple(e[name] for e in encoded) for name in events.event_features}
    if "gap_now" in vocab.event_features and timestamps is not None:
        out["gap_now"] = tuple(np.asarray(t, np.int64) for t in timestamps)
    return {name: out[name] for name in vocab.event_features}
