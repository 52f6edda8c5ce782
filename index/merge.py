"""How one user's K per-interest candidate lists become one top-k list.

Every strategy is a pure function of the same inputs, the result of one search per interest:

* ``ids`` int64 ``[K, n]``: row ``i`` is interest ``i``'s candidates, best first; ``-1`` marks an
  empty slot (a filtered item, a short list, or a whole row for a masked interest such as one
  of MIND's dropped interests), which never contributes.
* ``scores`` float32 ``[K, n]``: the inner products, aligned with ``ids``.

and returns a :class:`Merged` of at most ``k`` distinct items.

Example:
    >>> ids = np.array([[7, 3], [3, 9]])
    >>> scores = np.array([[0.9, 0.5], [0.8, 0.4]], np.float32)
    >>> max_score(ids, scores, 3).ids  # array([7, 3, 9]): 3 keeps its best score, 0.8
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Merged:
    """One user's merged list, in the order the strategy picked the items.

    Attributes:
        ids: int64 ``[m]`` distinct ids, ``m <= k``.
        scores: float32 ``[m]``, the score the item is reported with (see each strategy).
        interests: int32 ``[m]``, the interest (row) that gave that score.
    """

    ids: np.ndarray
    scores: np.ndarray
    interests: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


MergeFn = Callable[[np.ndarray, np.ndarray, int], Merged]
"""``(ids [K, n], scores [K, n], k) -> Merged``; :func:`strategy` builds one from a request."""


def best_per_item(ids: np.ndarray, scores: np.ndarray) -> Merged:
    """Every distinct id once, with its best score over the interests and that interest.

    Ordered by score, best first (ties: smaller id; the interest of a tied score: the lowest).
    """
    ids, scores = _check(ids, scores)
    rows, cols = np.nonzero(ids >= 0)
    cand_ids, cand_scores, cand_interests = ids[rows, cols], scores[rows, cols], rows.astype(np.int32)
    # Group by id with the best score (then the lowest interest) first, keep each group's first.
    order = np.lexsort((cand_interests, -cand_scores, cand_ids))
    cand_ids, cand_scores, cand_interests = cand_ids[order], cand_scores[order], cand_interests[order]
    first = np.ones(len(cand_ids), bool)
    first[1:] = cand_ids[1:] != cand_ids[:-1]
    cand_ids, cand_scores, cand_interests = cand_ids[first], cand_scores[first], cand_interests[first]
    order = np.lexsort((cand_ids, -cand_scores))
    return Merged(cand_ids[order], cand_scores[order], cand_interests[order])


def max_score(ids: np.ndarray, scores: np.ndarray, k: int) -> Merged:
    """The ``k`` distinct ids with the best score over the interests (ties: smaller id).

    Each item is reported with its best score and the interest that gave it.
    """
    _check_k(k)
    best = best_per_item(ids, scores)
    return Merged(best.ids[:k], best.scores[:k], best.interests[:k])


def round_robin(ids: np.ndarray, scores: np.ndarray, k: int) -> Merged:
    """Interleaves the interests' lists: the best of interest 0, 1, ..., K-1, then the second of
    each, and so on, skipping ids already taken and empty slots, until ``k`` ids.

    Each item is reported with the score and interest of the list it was taken from. Empty
    slots do not use up a turn: each list's candidates are read in order, holes left out.
    """
    _check_k(k)
    ids, scores = _check(ids, scores)
    lists = [(row[row >= 0], s[row >= 0]) for row, s in zip(ids, scores, strict=True)]
    picked: dict[int, tuple[float, int]] = {}
    longest = max((len(row) for row, _ in lists), default=0)
    for rank in range(longest):
        for interest, (row, row_scores) in enumerate(lists):
            if len(picked) == k:
                break
            if rank < len(row) and int(row[rank]) not in picked:
                picked[int(row[rank])] = (float(row_scores[rank]), interest)
    return Merged(
        np.fromiter(picked, np.int64, len(picked)),
        np.array([s for s, _ in picked.values()], np.float32),
        np.array([i for _, i in picked.values()], np.int32),
    )


def diversity(ids: np.ndarray, scores: np.ndarray, k: int, categories: np.ndarray, lam: float) -> Merged:
    """ComiRec's diversity-controllable aggregation (Cen et al., KDD 2020, section 3.4), greedily.

    Picks items one at a time, each time the candidate maximising
    ``f(item) + lam * #{picked j : category(j) != category(item)}``, where ``f`` is the item's
    best score over the interests. ``lam = 0`` is exactly :func:`max_score`; a large ``lam``
    prefers categories not picked yet. Ties: the better ``f``, then the smaller id.

    Args:
        ids: ``[K, n]`` per-interest candidates (see the module docstring).
        scores: ``[K, n]`` their scores.
        k: items wanted.
        categories: int ``[num_ids]``, the category code of each id (``categories[id]``);
            give items without a category a code of their own.
        lam: the diversity weight ``λ >= 0``.

    Returns:
        Items in pick order, each with its best score ``f`` and that interest.

    Raises:
        ValueError: ``lam`` negative or not finite, an id outside ``categories``.
    """
    _check_k(k)
    if not np.isfinite(lam) or lam < 0:
        raise ValueError(f"lam must be a finite number >= 0, got {lam}")
    best = best_per_item(ids, scores)  # sorted by (-f, id): argmax below breaks ties alike
    if len(best.ids) and best.ids.max() >= len(categories):
        raise ValueError(f"id {int(best.ids.max())} has no category ({len(categories)} known)")
    # Category codes renumbered 0..c-1 over the candidates: counts per category stay small.
    _, cats = np.unique(categories[best.ids], return_inverse=True)
    picked_per_category = np.zeros(cats.max() + 1 if len(cats) else 0, np.int64)
    f = best.scores.astype(np.float64)
    available = np.ones(len(f), bool)
    order: list[int] = []
    for step in range(min(k, len(f))):
        # Each picked item of another category adds lam: step - (picked ones in the same category).
        gain = f + lam * (step - picked_per_category[cats])
        gain[~available] = -np.inf
        choice = int(np.argmax(gain))
        order.append(choice)
        available[choice] = False
        picked_per_category[cats[choice]] += 1
    chosen = np.asarray(order, np.int64)
    return Merged(best.ids[chosen], best.scores[chosen], best.interests[chosen])


MERGES = ("max_score", "round_robin", "diversity")
"""The strategies by name (the values of the API's ``MergeStrategy``)."""


def strategy(merge: str, categories: np.ndarray | None = None, lam: float = 0.0) -> MergeFn:
    """The merge function named ``merge``, one of :data:`MERGES` (for ``"diversity"``, with
    ``categories`` and ``lam`` bound).

    Raises:
        ValueError: an unknown name, or ``"diversity"`` without categories.
    """
    if merge == "max_score":
        return max_score
    if merge == "round_robin":
        return round_robin
    if merge != "diversity":
        raise ValueError(f"unknown merge strategy {merge!r}; choose from {MERGES}")
    if categories is None:
        raise ValueError("the diversity merge needs item categories")
    cats = categories

    def merge_diverse(ids: np.ndarray, scores: np.ndarray, k: int) -> Merged:
        return diversity(ids, scores, k, cats, lam)

    return merge_diverse


def _check(ids: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ids, scores = np.asarray(ids, np.int64), np.asarray(scores, np.float32)
    if ids.ndim != 2 or ids.shape != scores.shape:
        raise ValueError(
            f"ids and scores must both be [K, n], got {list(ids.shape)} and {list(scores.shape)}"
        )
    return ids, scores


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k <= 0:
        raise ValueError(f"k must be a positive integer, got {k!r}")
