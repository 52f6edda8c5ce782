"""Evaluation of a model under the three protocols of :mod:`retrieval.data.splits`.

Full ranking is exact (brute force) or through an index; sampled ranking scores the target and
its negatives directly. Also the popularity baseline, and the comparison of runs' metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from index import VectorIndex
from index.multi_interest import search_interests
from retrieval.artifacts.model import Features, ModelArtifact, encode_histories
from retrieval.data.vocab import PAD
from retrieval.evaluation.metrics import (
    COMIREC_KS,
    DEFAULT_KS,
    SAMPLED_KS,
    comirec_metrics,
    diversity_at_k,
    ranking_metrics,
    sampled_metrics,
)

_USER_BATCH = 256
_SCORES_PER_BATCH = 1 << 24
"""Scores computed at once by the full rankings (64 MiB of float32): users per batch follow
the catalogue's size."""


def mask_excluded(scores: np.ndarray, exclude: Sequence[np.ndarray]) -> np.ndarray:
    """Sets, in place, padding (column 0) and each row's ``exclude`` ids of ``scores`` ``[U, V]``
    to ``-inf``, so that they are never ranked; returns ``scores``."""
    scores[:, 0] = -np.inf
    excluded = [np.asarray(ids, np.int64).ravel() for ids in exclude]
    rows = np.repeat(np.arange(len(excluded)), [len(ids) for ids in excluded])
    scores[rows, np.concatenate([np.zeros(0, np.int64), *excluded])] = -np.inf
    return scores


def _top_k_rows(scores: np.ndarray, exclude: Sequence[np.ndarray], k: int) -> np.ndarray:
    """Masks padding (column 0) and each row's excluded ids, then returns the top-k ids per row,
    best first, the lower id first among equal scores.

    Slots that no retrievable item fills hold -1.
    """
    import tensorflow as tf  # its top-k is several times faster than numpy's argpartition

    mask_excluded(scores, exclude)
    n = min(k, scores.shape[1] - 1)
    values, top = (t.numpy() for t in tf.math.top_k(scores, n))
    top = top.astype(np.int64)
    top[values == -np.inf] = -1  # excluded, not retrievable
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
        block = interests[rows]  # [u, K, d]
        # One BLAS matmul (numpy's einsum does not use BLAS for this contraction: ~15x slower).
        per_interest = (block.reshape(-1, block.shape[2]) @ item_embeddings.T).reshape(
            block.shape[0], block.shape[1], -1
        )  # [u, K, V]
        masked = ~np.any(block != 0, axis=2)  # [u, K]
        per_interest[masked] = -np.inf
        return per_interest[:, 0] if block.shape[1] == 1 else per_interest.max(axis=1)

    return _batched_top_k(scores, exclude, k, len(item_embeddings))


def popularity_top_k(counts: np.ndarray, exclude: Sequence[np.ndarray], k: int) -> np.ndarray:
    """The most-popular baseline: items by training count, each user's history excluded."""
    counts = np.asarray(counts, np.float64)
    return _batched_top_k(lambda rows: np.tile(counts, (len(exclude[rows]), 1)), exclude, k, len(counts))


def _batched_top_k(
    scores_for: Callable[[slice], np.ndarray], exclude: Sequence[np.ndarray], k: int, num_items: int
) -> np.ndarray:
    """Top-k ids for every user, computing the ``[b, num_items]`` scores of a batch of users at a
    time (about ``_SCORES_PER_BATCH`` scores)."""
    users = max(1, _SCORES_PER_BATCH // max(num_items, 1))
    out = [
        _top_k_rows(scores_for(rows), exclude[rows], k)
        for rows in (slice(i, i + users) for i in range(0, len(exclude), users))
    ]
    return np.concatenate(out).astype(np.int64) if out else np.zeros((0, k), np.int64)


def full_ranking_top_k(
    model: ModelArtifact,
    histories: Sequence[np.ndarray],
    k: int,
    features: Features | None = None,
    index: VectorIndex | None = None,
) -> np.ndarray:
    """Each user's top-``k`` over the whole catalogue, history excluded, interests max-merged.

    Exact search (the oracle), or the multi-interest search of ``index`` when one is given.

    Returns:
        int64 ``[U, k]``, best first, -1 where no item is left.
    """
    interests = encode_histories(model, histories, features)
    if index is None:
        return exact_top_k(interests, model.item_embeddings, histories, k)
    return search_interests(index, interests, k, exclude=[set(h.tolist()) for h in histories]).ids


def evaluate_ranking(
    model: ModelArtifact,
    histories: Sequence[np.ndarray],
    targets: np.ndarray,
    ks: Sequence[int] = DEFAULT_KS,
    features: Features | None = None,
    index: VectorIndex | None = None,
) -> dict[str, float]:
    """Full-ranking metrics (:func:`~retrieval.evaluation.metrics.ranking_metrics`), each user's history
    items excluded: exact search (the oracle), or the multi-interest search of ``index``
    (possibly approximate) when one is given."""
    return ranking_metrics(full_ranking_top_k(model, histories, max(ks), features, index), targets, ks)


def candidate_scores(
    interests: np.ndarray, item_embeddings: np.ndarray, candidates: np.ndarray, batch: int = _USER_BATCH
) -> np.ndarray:
    """Each candidate's best inner product over the user's interests.

    Args:
        interests: ``[U, K, d]``; all-zero (masked) interests are skipped.
        item_embeddings: ``[V, d]``.
        candidates: int ``[U, C]`` item ids; padding (0) scores ``-inf``.
        batch: users scored at once.

    Returns:
        float32 ``[U, C]``.
    """
    out = np.empty(candidates.shape, np.float32)
    for start in range(0, len(candidates), batch):
        rows = slice(start, start + batch)
        per_interest = np.matmul(interests[rows], item_embeddings[candidates[rows]].transpose(0, 2, 1))
        per_interest[~np.any(interests[rows] != 0, axis=2)] = -np.inf  # masked interests
        best = per_interest.max(axis=1)  # [u, C]
        best[candidates[rows] == PAD] = -np.inf
        out[rows] = best
    return out


def evaluate_sampled(
    model: ModelArtifact,
    histories: Sequence[np.ndarray],
    targets: np.ndarray,
    negatives: np.ndarray,
    features: Features | None = None,
    ks: Sequence[int] = SAMPLED_KS,
) -> dict[str, float]:
    """Sampled-ranking metrics: each target against its user's negatives (SASRec's protocol).

    Args:
        model: the model; every candidate is scored exactly (best interest).
        histories: per user, dense ids, oldest first.
        targets: int ``[U]``, the held-out items (0 = unknown to the model: a miss).
        negatives: int ``[U, n]``, e.g. from :func:`retrieval.data.splits.sample_negatives`.
        features: side inputs aligned with ``histories``.
        ks: cut-offs.

    Returns:
        ``{"sampled_hr@10": …, "sampled_ndcg@10": …}``, see
        :func:`~retrieval.evaluation.metrics.sampled_metrics`.
    """
    interests = encode_histories(model, histories, features)
    candidates = np.concatenate([np.asarray(targets, np.int64)[:, None], negatives], axis=1)  # [U, 1 + n]
    return sampled_metrics(candidate_scores(interests, model.item_embeddings, candidates), ks)


def evaluate_comirec(
    model: ModelArtifact,
    histories: Sequence[np.ndarray],
    targets: Sequence[np.ndarray],
    features: Features | None = None,
    categories: np.ndarray | None = None,
    ks: Sequence[int] = COMIREC_KS,
    index: VectorIndex | None = None,
) -> dict[str, float]:
    """ComiRec's metrics: top-N over the catalogue (history excluded, max-score merge over the
    interests), then Recall, HitRate, NDCG and, with ``categories``, diversity at each N.

    Args:
        model: the model.
        histories: per user, dense ids, oldest first (the first 80% of the sequence).
        targets: per user, int ``[m]`` held-out items (0 = unknown to the model: a miss).
        features: side inputs aligned with ``histories``.
        categories: int ``[V]`` category code per item (:func:`category_codes`); ``None``
            leaves diversity out.
        ks: the N values.
        index: search through this index instead of exactly.
    """
    top = full_ranking_top_k(model, histories, max(ks), features, index)
    metrics = comirec_metrics(top, targets, ks)
    if categories is not None:
        metrics.update(diversity_at_k(top, categories, ks))
    return metrics


def category_codes(first_attributes: Mapping[int, str], num_embeddings: int) -> np.ndarray:
    """Category code per item id, for :func:`~retrieval.evaluation.metrics.diversity_at_k`.

    Args:
        first_attributes: item id -> its category (ComiRec: one category per item; here the
            item's first attribute).
        num_embeddings: ids run ``0..num_embeddings - 1``.

    Returns:
        int64 ``[num_embeddings]``: items of one category share a code; every item without
        a category has a code of its own (it differs from every other item).
    """
    names = {name: code for code, name in enumerate(dict.fromkeys(first_attributes.values()))}
    codes = np.arange(num_embeddings, dtype=np.int64) + len(names)
    for item, name in first_attributes.items():
        codes[item] = names[name]
    return codes
