"""Metrics of a ranker: AUC, GAUC and the reranked lists' NDCG and HR against retrieval alone."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from retrieval.data.vocab import PAD
from retrieval.evaluation.metrics import ranking_metrics
from retrieval.ranking.config import KS
from retrieval.ranking.data import CandidateLists

log = logging.getLogger(__name__)


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve: ``P(score of a positive > score of a negative)``, ties counting ½.

    Computed from average ranks (Mann-Whitney U), ``O(n log n)``.

    Args:
        scores: float ``[n]`` (any shape, flattened).
        labels: bool or 0/1 ``[n]``.

    Returns:
        The AUC, or NaN without positives or without negatives.
    """
    s = np.asarray(scores, np.float64).ravel()
    y = np.asarray(labels).ravel().astype(bool)
    positives = int(y.sum())
    negatives = len(y) - positives
    if not positives or not negatives:
        return float("nan")
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = (ends - (counts - 1) / 2.0)[inverse]  # 1-based average rank of each score
    return float((ranks[y].sum() - positives * (positives + 1) / 2.0) / (positives * negatives))


def per_user_auc(
    scores: np.ndarray, labels: np.ndarray, valid: np.ndarray | None = None, cells: int = 2_000_000
) -> np.ndarray:
    """Each row's AUC over its valid entries, float64 ``[U]`` (NaN without a positive or a negative).

    Args:
        scores: float ``[U, N]``; labels: bool ``[U, N]``; valid: bool ``[U, N]`` (default all).
        cells: pairwise comparisons made at once (memory bound).
    """
    s = np.asarray(scores, np.float64)
    y = np.asarray(labels).astype(bool)
    ok = np.ones(s.shape, bool) if valid is None else np.asarray(valid, bool)
    s = np.where(ok, s, 0.0)  # -inf in invalid slots would make NaN in comparisons
    pos, neg = y & ok, ~y & ok
    out = np.full(len(s), np.nan)
    n_pos, n_neg = pos.sum(axis=1), neg.sum(axis=1)
    # One positive (a click list): count the negatives below it, O(N) per row.
    single = np.flatnonzero((n_pos == 1) & (n_neg > 0))
    if len(single):
        target = s[single, np.argmax(pos[single], axis=1)][:, None]
        below = ((s[single] < target) & neg[single]).sum(axis=1)
        ties = ((s[single] == target) & neg[single]).sum(axis=1)
        out[single] = (below + 0.5 * ties) / n_neg[single]
    # Several positives: every (positive, negative) pair, a few rows at a time.
    several = np.flatnonzero((n_pos > 1) & (n_neg > 0))
    step = max(1, cells // max(s.shape[1] ** 2, 1))
    for start in range(0, len(several), step):
        rows = several[start : start + step]
        a, b = s[rows, :, None], s[rows, None, :]  # positive i against negative j
        pairs = pos[rows, :, None] & neg[rows, None, :]
        wins = ((a > b) + 0.5 * (a == b)) * pairs
        out[rows] = wins.sum(axis=(1, 2)) / pairs.sum(axis=(1, 2))
    return out


def gauc(scores: np.ndarray, labels: np.ndarray, valid: np.ndarray | None = None) -> tuple[float, int]:
    """Group AUC: the per-user AUC averaged with the user's number of valid candidates
    (impressions) as weight, over the users with at least one positive and one negative.

    Returns:
        (GAUC, users counted); NaN and 0 when no user counts.
    """
    per_user = per_user_auc(scores, labels, valid)
    weights = (np.ones(np.shape(scores), bool) if valid is None else np.asarray(valid, bool)).sum(axis=1)
    counted = ~np.isnan(per_user)
    if not counted.any():
        return float("nan"), 0
    return float(np.average(per_user[counted], weights=weights[counted])), int(counted.sum())


ScoreFn = Callable[[Sequence[np.ndarray], np.ndarray, Sequence[np.ndarray] | None, np.ndarray], np.ndarray]
"""``(histories, candidates [U, N] (0 = none, retrieval order), unclicked, retrieval scores
[U, N]) -> float [U, N]``, e.g. :meth:`~retrieval.artifacts.ranker_scorer.RankerScorer.score`."""


def list_metrics(
    candidates: np.ndarray, scores: np.ndarray, targets: np.ndarray, ks: Sequence[int] = KS
) -> dict[str, float]:
    """NDCG@k, HR@k (:func:`~retrieval.evaluation.metrics.ranking_metrics`) of the lists ordered by ``scores``
    (a stable sort: ties keep the given order), AUC and GAUC of the scores.

    Args:
        candidates: int ``[U, N]``, ``<= 0`` = empty slot (never ranked, not an impression).
        scores: float ``[U, N]``.
        targets: int ``[U]``; a user whose target is not in its list scores 0 in NDCG and HR.
    """
    present = candidates > 0
    masked = np.where(present, np.asarray(scores, np.float64), -np.inf)
    order = np.argsort(-masked, axis=1, kind="stable")
    ranked = np.where(
        np.take_along_axis(present, order, axis=1), np.take_along_axis(candidates, order, axis=1), -1
    )
    labels = present & (candidates == np.asarray(targets)[:, None])
    found = ranking_metrics(ranked, targets, ks)
    out = {name: found[name] for k in ks for name in (f"ndcg@{k}", f"hr@{k}")}
    group, users = gauc(masked, labels, present)
    out.update(auc=auc(masked[present], labels[present]), gauc=group, gauc_users=users)
    return out


def evaluate_reranking(
    lists: CandidateLists, scorers: Mapping[str, ScoreFn], ks: Sequence[int] = KS
) -> dict[str, Any]:
    """Retrieval-only metrics of the lists and, per scorer, the metrics after reranking them.

    Returns:
        ``{"users", "candidates", "candidate_recall" (share of users whose target was retrieved),
        "retrieval": {ndcg@k, hr@k, auc, gauc, gauc_users}, "rerankers": {name: {..., "score_seconds"}}}``.
    """
    present = lists.candidates > 0
    hit = (present & (lists.candidates == lists.targets[:, None])).any(axis=1)
    out: dict[str, Any] = {
        "users": len(lists.targets),
        "candidates": int(lists.candidates.shape[1]),
        "candidate_recall": float(hit.mean()) if len(hit) else 0.0,
        "retrieval": list_metrics(lists.candidates, lists.scores, lists.targets, ks),
        "rerankers": {},
    }
    for name, score in scorers.items():
        started = time.perf_counter()
        values = score(
            lists.histories, np.where(present, lists.candidates, PAD), lists.unclicked, lists.scores
        )
        seconds = time.perf_counter() - started
        out["rerankers"][name] = {
            **list_metrics(lists.candidates, values, lists.targets, ks),
            "score_seconds": round(seconds, 3),
        }
    return out
