"""Explanations: which history events made each of a user's interests (a query's ``explain``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from retrieval.api.types import EXPLAIN_TOP, ExplanationKind, Explanations
from retrieval.artifacts.model import ModelArtifact

WEIGHED = (ExplanationKind.ATTENTION, ExplanationKind.ROUTING)
"""Kinds whose explanations list events; the others carry the kind alone."""


def explain_histories(
    model: ModelArtifact,
    histories: Sequence[Sequence[str]],
    known: Sequence[np.ndarray],
    positions: Sequence[np.ndarray],
    features: Mapping[str, Sequence[np.ndarray]] | None = None,
) -> list[Explanations]:
    """The explanations of several users, from one call of the model's interest weights.

    Args:
        histories: per user, the request's external ids.
        known: per user, the dense ids of the known ones, oldest first (what the tower reads).
        positions: per user, the index in ``histories[u]`` of each ``known`` event.
        features: per side feature of the tower, per user, aligned with ``known``.

    Returns:
        One per user; only the kind when the model has no weights to show
        (:attr:`ModelArtifact.explanation`).
    """
    kind = ExplanationKind(model.explanation)
    if kind not in WEIGHED:
        return [Explanations(kind) for _ in histories]
    # As wide as the longest history the tower reads: less work for short ones, same weights.
    width = min(model.max_len, max(len(k) for k in known))
    weights = model.weigh(known, features, width)  # [U, K, width], right-aligned
    return [
        Explanations(kind, top_events(w, h, p)) for w, h, p in zip(weights, histories, positions, strict=True)
    ]


def top_events(
    weights: np.ndarray, history: Sequence[str], positions: np.ndarray, top: int = EXPLAIN_TOP
) -> list[list[tuple[str, float, int]]]:
    """Per interest, the ``top`` events with the largest non-zero weights, largest first.

    Args:
        weights: float32 ``[K, w]``: per interest, the weights of the last ``w`` known events,
            right-aligned (columns before a short history's first event are padding).
        history: the request's external ids.
        positions: int ``[n]``, the index in ``history`` of each known event, oldest first.

    Returns:
        Per interest, ``(external id, weight, position)``; ties keep the older event first.

    Example:
        >>> top_events(np.array([[0.0, 0.2, 0.5, 0.3]]), ["a", "x", "b", "c"], np.array([0, 2, 3]), 2)
        [[('b', 0.5, 2), ('c', 0.3, 3)]]
    """
    read = min(len(positions), weights.shape[1])  # the events the tower read
    shown = positions[len(positions) - read :]
    out = []
    for row in weights[:, weights.shape[1] - read :]:
        weighed = np.flatnonzero(row != 0)  # a masked interest or an unread event weighs exactly 0
        best = weighed[np.argsort(-row[weighed], kind="stable")[:top]]
        out.append([(history[shown[j]], float(row[j]), int(shown[j])) for j in best])
    return out
