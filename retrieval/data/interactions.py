"""Interactions in memory (:class:`Interactions`) and per-user sequences (:class:`SequenceData`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from retrieval.data.vocab import ItemVocab


@dataclass(frozen=True)
class Interactions:
    """Interactions in one common form, whatever file format they came from.

    Attributes:
        events: one row per interaction, in file order (but for a table's timestamps finer
            than seconds: each user's rows in exact time order): ``user`` (str), ``item`` (str),
            ``timestamp`` (int64 Unix seconds; the 0-based position among the user's events
            for order-only formats) and any side columns (e.g. ``rating``).
        items: one row per known item: ``item`` (str), optionally ``title`` (str) and
            ``attributes`` (list of str, e.g. genres or categories; ``None`` when unknown).
        source: the path the data was read from (``DataFrame`` for one given in memory).
        has_time: False when ``timestamp`` is only the order of events (S3-Rec and SASRec
            files, RecBole files without a time field), so no time features can be derived from it.
    """

    events: pd.DataFrame
    items: pd.DataFrame
    source: str
    has_time: bool = True


@dataclass(frozen=True)
class SequenceData:
    """Per-user chronological sequences of dense item ids.

    Attributes:
        vocab: external item ids -> dense ``1..n`` (0 is padding), with titles when known.
        users: external user ids, in order of first appearance in the events.
        sequences: per user, int64 ``[len]`` dense item ids, oldest first.
        item_attributes: dense item id -> attributes, for items whose attributes are known;
            ``None`` when the data has no attributes.
        event_columns: ``timestamp`` and every side column of the events (e.g. ``rating``),
            per user, aligned with :attr:`sequences`.
        has_time: whether ``timestamp`` is real time (see :class:`Interactions`).
    """

    vocab: ItemVocab
    users: tuple[str, ...]
    sequences: tuple[np.ndarray, ...]
    item_attributes: dict[int, tuple[str, ...]] | None
    event_columns: dict[str, tuple[np.ndarray, ...]] = field(default_factory=dict)
    has_time: bool = True


def build_sequences(data: Interactions) -> SequenceData:
    """Groups the events into per-user chronological sequences of dense item ids.

    Events are sorted by timestamp with a stable sort, so ties keep their file order. The
    vocabulary lists items in order of first appearance in the sorted events; items that are
    in ``data.items`` but have no events are left out.
    """
    events = data.events
    order = np.argsort(events["timestamp"].to_numpy(), kind="stable")
    codes, ids = pd.factorize(events["item"].to_numpy()[order])  # ids in order of first appearance
    dense = codes.astype(np.int64) + 1
    titles = None
    if "title" in data.items.columns:
        titles = {
            i: t
            for i, t in zip(data.items["item"].tolist(), data.items["title"].tolist(), strict=True)
            if isinstance(t, str)
        }
    vocab = ItemVocab.from_ids(ids, titles)
    user_codes, users = pd.factorize(events["user"])  # users in file order
    user_codes = user_codes[order]
    by_user = np.argsort(user_codes, kind="stable")
    ends = np.cumsum(np.bincount(user_codes, minlength=len(users))).tolist()
    spans = list(zip([0, *ends[:-1]], ends, strict=True))

    def per_user_sorted(values: np.ndarray) -> tuple[np.ndarray, ...]:
        """Values already in chronological order -> per-user slices of one grouped array."""
        grouped = values[by_user]
        return tuple(grouped[start:end] for start, end in spans)

    sequences = per_user_sorted(dense)
    columns = [c for c in events.columns if c not in ("user", "item")]
    event_columns = {c: per_user_sorted(events[c].to_numpy()[order]) for c in columns}
    item_attributes = None
    if "attributes" in data.items.columns:
        index = vocab.lookup(data.items["item"].astype(str).tolist())
        item_attributes = {
            int(i): tuple(a)
            for i, a in zip(index, data.items["attributes"], strict=True)
            if i != 0 and a is not None
        }
    return SequenceData(
        vocab, tuple(map(str, users.tolist())), sequences, item_attributes, event_columns, data.has_time
    )
