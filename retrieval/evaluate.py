"""Full-ranking evaluation: exact (brute force) or through an index, plus a popularity baseline."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from index import FaissIndex
from retrieval.data import build_sequences, leave_one_out, load_interactions
from retrieval.features import user_event_features
from retrieval.metrics import DEFAULT_KS, ranking_metrics
from retrieval.model_artifact import Features, ModelArtifact
from retrieval.search import search_interests
from retrieval.vocab import PAD

_USER_BATCH = 256


def encode_histories(
    model: ModelArtifact,
    histories: Sequence[np.ndarray],
    features: Features | None = None,
    batch_size: int = 1024,
) -> np.ndarray:
    """Interests for every history, float32 ``[U, K, d]``, in batches (``features`` as in
    :meth:`ModelArtifact.encode`)."""
    parts = [
        model.encode(
            histories[i : i + batch_size],
            None if features is None else {k: v[i : i + batch_size] for k, v in features.items()},
        )
        for i in range(0, len(histories), batch_size)
    ]
    return np.concatenate(parts) if parts else np.zeros((0, model.num_interests, model.dim), np.float32)


def _top_k_rows(scores: np.ndarray, exclude: Sequence[np.ndarray], k: int) -> np.ndarray:
    """Masks padding (column 0) and each row's excluded ids, then returns the top-k ids per row.

    Slots that no retrievable item fills hold -1.
    """
    scores[:, 0] = -np.inf
    for row, ids in zip(scores, exclude, strict=True):
        row[ids] = -np.inf
    n = min(k, scores.shape[1] - 1)
    part = np.argpartition(-scores, n - 1, axis=1)[:, :n]
    part_scores = np.take_along_axis(scores, part, axis=1)
    order = np.argsort(-part_scores, axis=1, kind="stable")
    top = np.take_along_axis(part, order, axis=1)
    top[np.take_along_axis(part_scores, order, axis=1) == -np.inf] = -1  # excluded, not retrievable
    return np.pad(top, ((0, 0), (0, k - n)), constant_values=-1)  # a catalogue smaller than k


def exact_top_k(
    interests: np.ndarray, item_embeddings: np.ndarray, exclude: Sequence[np.ndarray], k: int
) -> np.ndarray:
    """Brute-force multi-interest retrieval, the oracle for every index.

    Args:
        interests: ``[U, K, d]``.
        item_embeddings: ``[V, d]`` (row 0 = padding, never returned).
        exclude: per user, dense ids never to return (their history).
        k: list length.

    Returns:
        int64 ``[U, k]``: items by their best score over the K interests, best first. All-zero
        (masked) interests are skipped, as the search does.
    """

    def scores(rows: slice) -> np.ndarray:
        per_interest = np.einsum("ukd,vd->ukv", interests[rows], item_embeddings)  # [u, K, V]
        masked = ~np.any(interests[rows] != 0, axis=2)  # [u, K]
        per_interest[masked] = -np.inf
        return per_interest.max(axis=1)

    return _batched_top_k(scores, exclude, k)


def popularity_top_k(counts: np.ndarray, exclude: Sequence[np.ndarray], k: int) -> np.ndarray:
    """The most-popular baseline: items by training count, each user's history excluded."""
    counts = np.asarray(counts, np.float64)
    return _batched_top_k(lambda rows: np.tile(counts, (len(exclude[rows]), 1)), exclude, k)


def _batched_top_k(
    scores_for: Callable[[slice], np.ndarray], exclude: Sequence[np.ndarray], k: int
) -> np.ndarray:
    """Top-k ids for every user, computing the ``[b, V]`` scores of ``_USER_BATCH`` users at a time."""
    out = [
        _top_k_rows(scores_for(rows), exclude[rows], k)
        for rows in (slice(i, i + _USER_BATCH) for i in range(0, len(exclude), _USER_BATCH))
    ]
    return np.concatenate(out).astype(np.int64) if out else np.zeros((0, k), np.int64)


def evaluate_ranking(
    model: ModelArtifact,
    histories: Sequence[np.ndarray],
    targets: np.ndarray,
    ks: Sequence[int] = DEFAULT_KS,
    features: Features | None = None,
    index: FaissIndex | None = None,
) -> dict[str, float]:
    """Full-ranking metrics, each user's history items excluded: exact search (the oracle), or
    the multi-interest search of ``index`` (possibly approximate) when one is given."""
    interests = encode_histories(model, histories, features)
    if index is None:
        top = exact_top_k(interests, model.item_embeddings, histories, max(ks))
    else:
        top = search_interests(index, interests, max(ks), exclude=[set(h.tolist()) for h in histories]).ids
    return ranking_metrics(top, targets, ks)


def evaluate_model_on_data(
    model: ModelArtifact,
    data_path: str | Path,
    data_format: str | None = None,
    split: str = "test",
    index: FaissIndex | None = None,
) -> dict[str, float]:
    """Leave-one-out metrics of a trained model on a dataset (exact, or through ``index``).

    The data is re-split as in training and its item ids are mapped through the model's
    vocabulary: history items the model does not know are dropped, unknown targets count
    as misses.
    """
    if split not in ("valid", "test"):
        raise ValueError(f"split must be 'valid' or 'test', got {split!r}")
    data = build_sequences(load_interactions(data_path, data_format))
    loo = leave_one_out(data)
    test = split == "test"
    to_model = np.concatenate([[PAD], model.vocab.lookup(list(data.vocab.ids))])  # data id -> model id
    users = loo.test_users if test else loo.valid_users
    raw = [to_model[h] for h in (loo.test_histories if test else loo.valid_histories)]
    known = [h != PAD for h in raw]
    histories = [h[k] for h, k in zip(raw, known, strict=True)]
    per_user = user_event_features(data, model.side)  # encoded with the model's vocabularies
    features = {
        name: [values[u][: len(k)][k] for u, k in zip(users, known, strict=True)]
        for name, values in per_user.items()
    }
    targets = to_model[loo.test_targets if test else loo.valid_targets]
    return evaluate_ranking(model, histories, targets, features=features, index=index)
