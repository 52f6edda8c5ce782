"""Multi-interest search: K interest vectors per user, one batched index search, max-score merge."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from index import FaissIndex


@dataclass(frozen=True)
class SearchResult:
    """Merged top-k per user, best first; empty slots hold id -1, score -inf, interest -1.

    Attributes:
        ids: int64 ``[B, k]``.
        scores: float32 ``[B, k]``, the best inner product of the item over the user's interests.
        interests: int32 ``[B, k]``, the interest (0..K-1) that gave that score.
    """

    ids: np.ndarray
    scores: np.ndarray
    interests: np.ndarray


def search_interests(
    index: FaissIndex,
    interests: np.ndarray,
    k: int,
    exclude: Sequence[Collection[int]] | None = None,
) -> SearchResult:
    """Top-``k`` items per user, scored by the max over the user's interests.

    All ``B * K`` interest vectors go through one batched search. Each interest over-fetches
    ``k + len(exclude_b)`` items (the largest over the batch, capped at the index size), which
    is enough for an exact index: an item in the merged top-k that interest ``i`` scores best
    can only be outranked under ``i`` by items that also outrank it in the merge (fewer than
    ``k``) or by excluded items.

    Args:
        index: items to search.
        interests: float32 ``[B, K, d]``.
        k: items wanted per user, ``>= 1``.
        exclude: per user, ids that must not be returned (e.g. the user's history).

    Returns:
        The merged result, ``[B, k]`` each; fewer than ``k`` items exist when the index holds
        too few non-excluded ids, the rest is padding.

    Example:
        >>> result = search_interests(index, model.encode([history]), 10, exclude=[set(history)])
    """
    if interests.ndim != 3:
        raise ValueError(f"interests must have shape [B, K, d], got {list(interests.shape)}")
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k <= 0:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    batch, num_interests, dim = interests.shape
    if exclude is not None and len(exclude) != batch:
        raise ValueError(f"exclude has {len(exclude)} entries for a batch of {batch}")
    excluded = [np.fromiter(e, np.int64, len(e)) for e in exclude] if exclude is not None else []

    result = SearchResult(
        ids=np.full((batch, k), -1, np.int64),
        scores=np.full((batch, k), -np.inf, np.float32),
        interests=np.full((batch, k), -1, np.int32),
    )
    fetch = min(k + max((len(e) for e in excluded), default=0), index.ntotal)
    if fetch == 0 or batch == 0:
        return result

    scores, ids = index.search(interests.reshape(batch * num_interests, dim), fetch)
    # Row b holds interest 0's results, then interest 1's, ...: [B, K * fetch].
    scores = scores.reshape(batch, num_interests * fetch)
    ids = ids.reshape(batch, num_interests * fetch)
    interest_of_column = np.repeat(np.arange(num_interests, dtype=np.int32), fetch)

    keep = ids >= 0
    for row, banned in enumerate(excluded):
        if len(banned):
            keep[row] &= ~np.isin(ids[row], banned)
    rows, cols = np.nonzero(keep)
    cand_ids, cand_scores, cand_interests = ids[rows, cols], scores[rows, cols], interest_of_column[cols]

    # Group candidates by (user, id) with the best score first (ties: lowest interest) and
    # keep the first of each group: the max-score merge.
    order = np.lexsort((cand_interests, -cand_scores, cand_ids, rows))
    rows, cand_ids, cand_scores, cand_interests = _select(order, rows, cand_ids, cand_scores, cand_interests)
    first = np.ones(len(rows), bool)
    first[1:] = (rows[1:] != rows[:-1]) | (cand_ids[1:] != cand_ids[:-1])
    rows, cand_ids, cand_scores, cand_interests = _select(first, rows, cand_ids, cand_scores, cand_interests)

    # Rank each user's unique candidates by score (ties: smaller id) and keep the first k.
    order = np.lexsort((cand_ids, -cand_scores, rows))
    rows, cand_ids, cand_scores, cand_interests = _select(order, rows, cand_ids, cand_scores, cand_interests)
    rank = np.arange(len(rows)) - np.searchsorted(rows, rows, side="left")
    top = rank < k
    slot = (rows[top], rank[top])
    result.ids[slot] = cand_ids[top]
    result.scores[slot] = cand_scores[top]
    result.interests[slot] = cand_interests[top]
    return result


def _select(where: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """The same rows (an index or a boolean mask) of parallel arrays."""
    return tuple(a[where] for a in arrays)
