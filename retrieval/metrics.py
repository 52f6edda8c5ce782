"""Full-ranking metrics from top-k lists: HR@K, NDCG@K, Recall@K."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEFAULT_KS = (10, 20, 50)


def ranking_metrics(
    topk: np.ndarray, targets: Sequence[np.ndarray] | np.ndarray, ks: Sequence[int] = DEFAULT_KS
) -> dict[str, float]:
    """Mean HR@K, NDCG@K and Recall@K over users.

    Args:
        topk: int ``[U, k_max]`` ranked item ids per user, best first (-1 = no item);
            ``k_max >= max(ks)``.
        targets: per user, the held-out item(s): int ``[U]`` (one each) or a sequence of
            arrays (several each).
        ks: cut-offs.

    Returns:
        ``{"hr@10": …, "ndcg@10": …, "recall@10": …, …}``. HR: at least one target in the
        top K. Recall: share of the user's targets in the top K. NDCG: DCG of the hits over
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
    out: dict[str, float] = {}
    for k in ks:
        h = hits[:, :k]
        n_hits = h.sum(axis=1)
        ideal = np.cumsum(discounts[:k])[np.minimum(n_targets, k).astype(int) - 1]
        out[f"hr@{k}"] = float(np.mean(n_hits > 0))
        out[f"ndcg@{k}"] = float(np.mean((h * discounts[:k]).sum(axis=1) / ideal))
        out[f"recall@{k}"] = float(np.mean(n_hits / n_targets))
    return out
