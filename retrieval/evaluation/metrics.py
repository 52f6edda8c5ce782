"""Ranking metrics of the three evaluation protocols (``retrieval.data.splits``).

* :func:`ranking_metrics`: full ranking (leave-one-out): HR@K, NDCG@K, Recall@K.
* :func:`user_ranking_metrics` and :func:`user_comirec_metrics`: the same per user (what a
  paired comparison of two models on the same users needs, :func:`paired_difference`).
* :func:`sampled_metrics`: the target against a few sampled negatives (SASRec's protocol),
  reported under ``sampled_`` names so they are never mistaken for full-ranking numbers.
* :func:`comirec_metrics` and :func:`diversity_at_k`: ComiRec's Recall, HitRate, NDCG and
  diversity, defined exactly as in its evaluation code (``evaluate_full`` in THUDM/ComiRec
  ``src/train.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEFAULT_KS = (5, 10, 20, 50)
SAMPLED_KS = (10,)
COMIREC_KS = (20, 50)


def ranking_metrics(
    topk: np.ndarray, targets: Sequence[np.ndarray] | np.ndarray, ks: Sequence[int] = DEFAULT_KS
) -> dict[str, float]:
    """Mean HR@K, NDCG@K and Recall@K over users (:func:`user_ranking_metrics`, averaged)."""
    return user_means(user_ranking_metrics(topk, targets, ks))


def user_ranking_metrics(
    topk: np.ndarray, targets: Sequence[np.ndarray] | np.ndarray, ks: Sequence[int] = DEFAULT_KS
) -> dict[str, np.ndarray]:
    """HR@K, NDCG@K and Recall@K of every user.

    Args:
        topk: int ``[U, k_max]`` ranked item ids per user, best first (-1 = no item);
            ``k_max >= max(ks)``.
        targets: per user, the held-out item(s): int ``[U]`` (one each) or a sequence of
            arrays (several each).
        ks: cut-offs.

    Returns:
        ``{"hr@10": float [U], "ndcg@10": …, "recall@10": …, …}``. HR: at least one target in
        the top K. Recall: share of the user's targets in the top K. NDCG: DCG of the hits over
        the ideal DCG of ``min(|targets|, K)`` hits.
    """
    if len(topk) != len(targets):
        raise ValueError(f"{len(topk)} ranked lists for {len(targets)} users")
    if topk.shape[1] < max(ks):
        raise ValueError(f"top lists have {topk.shape[1]} items, fewer than K = {max(ks)}")
    target_lists = [np.atleast_1d(np.asarray(t)) for t in targets]
    discounts = 1.0 / np.log2(np.arange(topk.shape[1]) + 2.0)  # [k_max]
    hits = np.stack([np.isin(row, t) for row, t in zip(topk, target_lists, strict=True)])  # [U, k_max]
    n_targets = np.array([len(np.unique(t)) for t in target_lists], float)  # [U]
    out: dict[str, np.ndarray] = {}
    for k in ks:
        h = hits[:, :k]
        n_hits = h.sum(axis=1)
        ideal = np.cumsum(discounts[:k])[np.minimum(n_targets, k).astype(int) - 1]
        out[f"hr@{k}"] = (n_hits > 0).astype(np.float64)
        out[f"ndcg@{k}"] = (h * discounts[:k]).sum(axis=1) / ideal
        out[f"recall@{k}"] = n_hits / n_targets
    return out


def user_means(per_user: dict[str, np.ndarray]) -> dict[str, float]:
    """Each metric's mean over the users (0 when there are none)."""
    return {name: float(np.mean(v)) if len(v) else 0.0 for name, v in per_user.items()}


def paired_difference(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """How much ``a`` exceeds ``b`` on the same users, and the standard error of that.

    Args:
        a: float ``[U]``, one metric of a model per user.
        b: float ``[U]``, the same metric of another model on the same users in the same order.

    Returns:
        ``(mean(a - b), std(a - b) / sqrt(U))`` (sample std, ``ddof = 1``). Pairing removes the
        users' own difficulty, which dominates the spread of either model's values: the error
        of the difference is far below what the two models' separate errors suggest.
    """
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError(f"need two equal-length vectors of at least 2 users, got {a.shape} and {b.shape}")
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d)))


def sampled_metrics(scores: np.ndarray, ks: Sequence[int] = SAMPLED_KS) -> dict[str, float]:
    """HR@K and NDCG@K of one target ranked among sampled negatives (SASRec's protocol).

    The target's rank is the number of negatives scoring at least as high as it: ties count
    against the target, so a model scoring everything alike gets no credit. A target scored
    ``-inf`` (an item the model does not know) is a miss.

    Args:
        scores: float ``[U, 1 + n]``; column 0 is the target, columns 1.. the negatives.
        ks: cut-offs, each ``<= 1 + n``.

    Returns:
        ``{"sampled_hr@10": …, "sampled_ndcg@10": …}``: HR is ``rank < K``, NDCG
        ``1 / log2(rank + 2)`` when ``rank < K`` (one relevant item, so the ideal DCG is 1).
    """
    scores = np.asarray(scores, np.float64)
    if scores.ndim != 2 or scores.shape[1] < 2:
        raise ValueError(f"scores must be [U, 1 + n] with n >= 1, got {list(scores.shape)}")
    if max(ks) > scores.shape[1]:
        raise ValueError(f"K = {max(ks)} exceeds the {scores.shape[1]} ranked candidates")
    target = scores[:, :1]
    rank = (scores[:, 1:] >= target).sum(axis=1)  # [U]
    rank[~np.isfinite(target[:, 0])] = scores.shape[1]  # unknown target: below every negative
    out: dict[str, float] = {}
    for k in ks:
        hit = rank < k
        out[f"sampled_hr@{k}"] = float(np.mean(hit)) if len(rank) else 0.0
        out[f"sampled_ndcg@{k}"] = (
            float(np.mean(np.where(hit, 1.0 / np.log2(rank + 2.0), 0.0))) if len(rank) else 0.0
        )
    return out


def comirec_metrics(
    topk: np.ndarray, targets: Sequence[np.ndarray], ks: Sequence[int] = COMIREC_KS
) -> dict[str, float]:
    """ComiRec's Recall@N, HitRate@N and NDCG@N, averaged over users (:func:`user_comirec_metrics`)."""
    return user_means(user_comirec_metrics(topk, targets, ks))


def user_comirec_metrics(
    topk: np.ndarray, targets: Sequence[np.ndarray], ks: Sequence[int] = COMIREC_KS
) -> dict[str, np.ndarray]:
    """ComiRec's Recall@N, HitRate@N and NDCG@N of every user.

    As in ComiRec's ``evaluate_full``, for the targets ``t_0 .. t_{m-1}`` (in sequence order,
    repeats counted each time) and the set ``S`` of the first N retrieved items:

    * recall = ``#{j : t_j in S} / m``;
    * hitrate = 1 if any ``t_j`` is in ``S``;
    * ndcg = ``sum_{j : t_j in S} 1/log2(j + 2)`` over ``sum_{j < r} 1/log2(j + 2)``, where
      ``r`` is the number of hits (0 when ``r = 0``). The discount is the target's position in
      the held-out sequence, not its rank in the retrieved list: ComiRec's code defines it so,
      which makes it insensitive to the order of ``S``. :func:`ranking_metrics` has the usual one.

    Args:
        topk: int ``[U, k_max]`` retrieved ids per user, best first (-1 = no item).
        targets: per user, int ``[m_u]`` held-out items, ``m_u >= 1``.
        ks: the N values, each ``<= k_max``.

    Returns:
        ``{"recall@20": float [U], "hitrate@20": …, "ndcg@20": …, …}``.
    """
    if len(topk) != len(targets):
        raise ValueError(f"{len(topk)} ranked lists for {len(targets)} users")
    if topk.shape[1] < max(ks):
        raise ValueError(f"top lists have {topk.shape[1]} items, fewer than N = {max(ks)}")
    out = {f"{name}@{k}": np.zeros(len(targets)) for k in ks for name in ("recall", "hitrate", "ndcg")}
    for u, (row, t) in enumerate(zip(topk, targets, strict=True)):
        t = np.atleast_1d(np.asarray(t))
        if not len(t):
            raise ValueError("every user needs at least one target")
        discounts = 1.0 / np.log2(np.arange(len(t)) + 2.0)  # [m], by position in the targets
        for k in ks:
            hit = np.isin(t, row[:k][row[:k] >= 0])  # [m]
            r = int(hit.sum())
            out[f"recall@{k}"][u] = r / len(t)
            if r:
                out[f"hitrate@{k}"][u] = 1.0
                out[f"ndcg@{k}"][u] = float(discounts[hit].sum() / discounts[:r].sum())
    return out


def diversity_at_k(
    topk: np.ndarray, categories: np.ndarray, ks: Sequence[int] = COMIREC_KS, batch: int = 1024
) -> dict[str, float]:
    """ComiRec's diversity@N: the share of pairs of retrieved items whose categories differ.

    Per user, over the first N retrieved items (empty ``-1`` slots left out),
    ``sum_{i < j} [cat(i) != cat(j)] / (n (n - 1) / 2)``, then averaged over users; a list of
    fewer than two items counts 0.

    Args:
        topk: int ``[U, k_max]`` retrieved ids per user, best first (-1 = no item).
        categories: int ``[num_ids]``, the category code of every id (``categories[id]``);
            give items without a category codes of their own.
        ks: the N values, each ``<= k_max``.
        batch: users compared at once (the pairwise table is ``[batch, N, N]``).

    Returns:
        ``{"diversity@20": …, …}``.
    """
    if topk.shape[1] < max(ks):
        raise ValueError(f"top lists have {topk.shape[1]} items, fewer than N = {max(ks)}")
    categories = np.asarray(categories)
    out: dict[str, float] = {}
    for k in ks:
        total = 0.0
        for start in range(0, len(topk), batch):
            ids = topk[start : start + batch, :k]  # [b, N]
            valid = ids >= 0
            cats = categories[np.where(valid, ids, 0)]  # [b, N]
            both = valid[:, :, None] & valid[:, None, :]  # [b, N, N]
            differ = (cats[:, :, None] != cats[:, None, :]) & both
            n = valid.sum(axis=1)  # [b]
            pairs = n * (n - 1)  # ordered pairs: each unordered pair is counted twice in `differ`
            total += float(np.sum(np.where(pairs > 0, differ.sum(axis=(1, 2)) / np.maximum(pairs, 1), 0.0)))
        out[f"diversity@{k}"] = total / max(len(topk), 1)
    return out
