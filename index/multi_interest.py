"""Multi-interest search: K interest vectors per user, one batched index search, max-score merge.

An allow-list or a category is handed to the index, which applies it inside the search (FAISS
``IDSelector``, Milvus expressions) so that ``k`` results come back whenever ``k`` items pass.
Users' histories are dropped from one batched search over-fetching by the longest history
(testing every scanned candidate against an in-index filter costs more); users that come back
short are searched again alone with their history filtered inside the index.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from index.base import SearchFilter, VectorIndex, as_id_array, members
from index.merge import MergeFn


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


@dataclass(frozen=True)
class ItemCategories:
    """Category name -> the ids of the items whose attributes contain it.

    Attributes:
        ids_by_category: category -> sorted unique int64 ids.

    Example:
        >>> categories = ItemCategories.from_attributes({1: ["Comedy"], 2: ["Comedy", "Drama"]})
        >>> categories.ids("Comedy")  # array([1, 2])
    """

    ids_by_category: Mapping[str, np.ndarray]

    @classmethod
    def from_attributes(cls, attributes: Mapping[int, Iterable[str]]) -> ItemCategories:
        """From item id -> attribute strings."""
        members: dict[str, list[int]] = {}
        for item, values in attributes.items():
            for value in set(values):
                members.setdefault(str(value), []).append(int(item))
        return cls({name: np.unique(np.asarray(ids, np.int64)) for name, ids in members.items()})

    def ids(self, category: str) -> np.ndarray:
        """Sorted int64 ids of ``category``.

        Raises:
            ValueError: no item has that category.
        """
        try:
            return self.ids_by_category[category]
        except KeyError:
            raise ValueError(f"unknown category {category!r}: no item has it") from None

    def __contains__(self, category: str) -> bool:
        return category in self.ids_by_category


def search_interests(
    index: VectorIndex,
    interests: np.ndarray,
    k: int,
    exclude: Sequence[Collection[int]] | None = None,
    *,
    allow: Collection[int] | np.ndarray | None = None,
    category: str | None = None,
    categories: ItemCategories | None = None,
    merge: MergeFn | None = None,
    per_interest_k: int | None = None,
    filter_inside: bool = False,
    item_vectors: np.ndarray | None = None,
) -> SearchResult:
    """Top-``k`` items per user, scored by the max over the user's interests.

    All non-zero interest vectors of the batch go through one batched search; all-zero
    interests (masked ones, e.g. MIND's dynamic number of interests) are skipped and never
    contribute. Each interest fetches ``k`` items passing the user's filter, which is enough
    for an exact index: an item in the merged top-k that interest ``i`` scores best can only
    be outranked under ``i`` by items that also outrank it in the merge (fewer than ``k``).

    Args:
        index: items to search.
        interests: float32 ``[B, K, d]``.
        k: items wanted per user, ``>= 1``.
        exclude: per user, ids that must not be returned (e.g. the user's history).
        allow: for every user, the only ids that may be returned.
        category: for every user, only items whose attributes contain it (needs ``categories``);
            combined with ``allow`` when both are given.
        categories: category -> ids, see :meth:`ItemCategories.from_attributes`.
        merge: how each user's per-interest lists become one (``index.merge``); ``None`` is
            the max-score merge. Scores and interests are then those the merge reports.
        per_interest_k: candidates each interest fetches, at least ``k`` (the default); more
            gives round-robin and diversity merges deeper lists to choose from.
        filter_inside: apply ``exclude`` inside the index search (exact, but an IVF index then
            tests every scanned candidate against it) instead of over-fetching and dropping;
            for a single user only.
        item_vectors: float32 ``[num_ids, d]``, the indexed vectors by id. With a ``merge``, each
            user's candidates are then scored under every one of the user's interests before
            merging, so that a merge ranking items by their best score (DIVERSITY) uses the
            exact best over all interests, not only over the lists an item was found in (an
            item deep in one interest's list may score higher under another that did not
            fetch it). Leave it out for merges that read each list's own order (ROUND_ROBIN).

    Returns:
        The merged result, ``[B, k]`` each; fewer than ``k`` items exist when too few ids
        pass the filters, the rest is padding.

    Raises:
        ValueError: bad shapes, ``k``, ``exclude`` length, or an unknown category.

    Example:
        >>> result = search_interests(index, model.encode([history]), 10, exclude=[set(history)])
    """
    _check_request(interests, k, exclude, filter_inside)
    allowed = _allowed(allow, category, categories)
    result = _empty_result(interests.shape[0], k)
    users, slots = np.nonzero(np.any(interests != 0, axis=2))  # active interests, user-major
    if not len(users) or index.ntotal == 0:
        return result
    queries = np.ascontiguousarray(interests[users, slots])
    rescore = None if item_vectors is None or merge is None else (item_vectors, queries)

    if exclude is None or filter_inside:
        # One filter for the whole batch: the index applies it inside the search.
        shared = SearchFilter.of(exclude[0] if exclude is not None else None, allowed)
        scores, ids = index.search(queries, max(k, per_interest_k or k), shared)
        _combine(merge, result, _Rows(users, slots, scores, ids, ids >= 0), k, per_interest_k, rescore)
        return result

    # Histories are dropped after one batched search over-fetching by the longest history:
    # cheaper than an in-index filter, which tests every scanned candidate against it.
    excluded = [as_id_array(e) for e in exclude]
    fetch = min(max(k, per_interest_k or k) + max(len(e) for e in excluded), index.ntotal)
    scores, ids = index.search(queries, fetch, SearchFilter.of(allow=allowed))
    keep = (ids >= 0) & ~_excluded(users, ids, excluded)
    _combine(merge, result, _Rows(users, slots, scores, ids, keep), k, per_interest_k, rescore)

    # An approximate index may come back short for some user; search those alone, filter inside
    # (which returns k whenever k items pass).
    for user in _short_users(index, result, users, excluded, allowed, k):
        alone = search_interests(
            index,
            interests[user : user + 1],
            k,
            [excluded[user]],
            allow=allowed,
            merge=merge,
            per_interest_k=per_interest_k,
            filter_inside=True,
            item_vectors=item_vectors,
        )
        result.ids[user], result.scores[user] = alone.ids[0], alone.scores[0]
        result.interests[user] = alone.interests[0]
    return result


def _check_request(
    interests: np.ndarray, k: int, exclude: Sequence[Collection[int]] | None, filter_inside: bool
) -> None:
    """Refuses interests not ``[B, K, d]``, a ``k`` not positive, or ``exclude`` not one per user."""
    if interests.ndim != 3:
        raise ValueError(f"interests must have shape [B, K, d], got {list(interests.shape)}")
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k <= 0:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    batch = interests.shape[0]
    if exclude is not None and len(exclude) != batch:
        raise ValueError(f"exclude has {len(exclude)} entries for a batch of {batch}")
    if filter_inside and batch != 1:
        raise ValueError(f"filter_inside is for a single user, got a batch of {batch}")


def _empty_result(batch: int, k: int) -> SearchResult:
    """``[batch, k]`` of padding: ids -1, scores -inf, interests -1."""
    return SearchResult(
        ids=np.full((batch, k), -1, np.int64),
        scores=np.full((batch, k), -np.inf, np.float32),
        interests=np.full((batch, k), -1, np.int32),
    )


def _short_users(
    index: VectorIndex,
    result: SearchResult,
    users: np.ndarray,
    excluded: Sequence[np.ndarray],
    allowed: np.ndarray | None,
    k: int,
) -> list[int]:
    """The searched users with fewer than ``k`` results although more items pass their filters."""
    found = (result.ids >= 0).sum(axis=1)
    short = [user for user in np.unique(users).tolist() if found[user] < k]
    if not short:
        return []
    candidates = index.ids() if allowed is None else np.intersect1d(index.ids(), allowed)
    return [
        user for user in short if found[user] < len(candidates) - np.isin(excluded[user], candidates).sum()
    ]


def _allowed(
    allow: Collection[int] | np.ndarray | None, category: str | None, categories: ItemCategories | None
) -> np.ndarray | None:
    """The allow-list the request implies (``None`` for no restriction)."""
    allowed = None if allow is None else as_id_array(allow)
    if category is not None:
        if categories is None:
            raise ValueError(f"category {category!r} given without item categories")
        members = categories.ids(category)
        allowed = members if allowed is None else np.intersect1d(allowed, members)
    return allowed


class _Rows(NamedTuple):
    """A batch's searched rows, one per active interest (user-major).

    Attributes:
        users, slots: int ``[M]``: the user and interest of each row.
        scores, ids: ``[M, f]`` search results; ``keep`` bool ``[M, f]`` the results to use.
    """

    users: np.ndarray
    slots: np.ndarray
    scores: np.ndarray
    ids: np.ndarray
    keep: np.ndarray


def _combine(
    merge: MergeFn | None,
    result: SearchResult,
    searched: _Rows,
    k: int,
    per_interest_k: int | None,
    rescore: tuple[np.ndarray, np.ndarray] | None = None,
) -> None:
    """Merges the searched rows into ``result``: max-score (vectorised) or ``merge`` per user.

    ``merge`` sees each user's ``[K, f]`` lists with dropped results and masked interests as -1,
    each list cut to its first ``max(k, per_interest_k)`` kept results: the same candidates
    whether the user was searched alone or over-fetched in a batch. With ``rescore`` (the item
    vectors and the searched rows' query vectors) every list holds all of the user's candidates
    with their exact scores under that interest instead.
    """
    if merge is None:
        _merge(result, searched, k)
        return
    users, slots, scores, ids, keep = searched
    keep = keep & (np.cumsum(keep, axis=1) <= max(k, per_interest_k or k))
    num_interests = int(slots.max()) + 1 if len(slots) else 0
    for user in np.unique(users):
        rows = np.flatnonzero(users == user)
        per_ids = np.full((num_interests, ids.shape[1]), -1, np.int64)
        per_scores = np.full((num_interests, ids.shape[1]), -np.inf, np.float32)
        per_ids[slots[rows]] = np.where(keep[rows], ids[rows], -1)
        per_scores[slots[rows]] = np.where(keep[rows], scores[rows], -np.inf)
        if rescore is not None:
            vectors, queries = rescore
            found = np.unique(per_ids[per_ids >= 0])
            per_ids = np.full((num_interests, len(found)), -1, np.int64)
            per_scores = np.full((num_interests, len(found)), -np.inf, np.float32)
            per_ids[slots[rows]] = found
            per_scores[slots[rows]] = queries[rows] @ vectors[found].T  # [active K, candidates]
        merged = merge(per_ids, per_scores, k)
        n = min(len(merged.ids), k)
        result.ids[user, :n] = merged.ids[:n]
        result.scores[user, :n] = merged.scores[:n]
        result.interests[user, :n] = merged.interests[:n]


def _excluded(users: np.ndarray, ids: np.ndarray, excluded: Sequence[np.ndarray]) -> np.ndarray:
    """bool ``[M, f]``: whether each searched id is in its user's ``excluded`` ids.

    One binary search over the batch's sorted (user, id) keys, not one membership test per row.
    """
    if not any(len(e) for e in excluded):
        return np.zeros(ids.shape, bool)
    span = int(max(ids.max(), *(e.max() for e in excluded if len(e)))) + 1
    keys = users[:, None].astype(np.int64) * span + ids
    banned = np.concatenate([user * span + e for user, e in enumerate(excluded) if len(e)])
    return members(keys, np.sort(banned))  # unique: each user's ids are (as_id_array)


_SCORE_BITS = 32
_SCORE_MASK = (1 << _SCORE_BITS) - 1
_EMPTY = np.iinfo(np.int64).max  # sorts after every packed candidate


def _merge(result: SearchResult, searched: _Rows, k: int) -> None:
    """Max-score merge of per-interest results into ``result``, all users at once.

    Each candidate is packed into one int64 so that two plain sorts of each user's row do the
    work: by (id, score descending, interest) to keep each id's best entry (ties: the lowest
    interest), then by (score descending, id, interest) for the top ``k`` (ties: smaller id).
    """
    users, slots, scores, ids, keep = searched
    batch, f = result.ids.shape[0], ids.shape[1]
    num_interests = int(slots.max()) + 1
    s_bits = max(1, (num_interests - 1).bit_length())
    codes, values = _id_codes(ids, keep, 63 - _SCORE_BITS - s_bits)
    c_bits = max(1, int(codes.max()).bit_length())
    down = _SCORE_MASK - _sortable(scores).astype(np.int64)  # ascending: the best score first

    # Each user's candidates side by side, [B, K·f], by (id, score descending, interest).
    by_id = np.full((batch, num_interests, f), _EMPTY, np.int64)
    packed = (codes << (_SCORE_BITS + s_bits)) | (down << s_bits) | slots[:, None]
    by_id[users, slots] = np.where(keep, packed, _EMPTY)
    by_id = np.sort(by_id.reshape(batch, -1), axis=-1)
    code, down = by_id >> (_SCORE_BITS + s_bits), (by_id >> s_bits) & _SCORE_MASK
    slot = by_id & ((1 << s_bits) - 1)
    first = by_id != _EMPTY  # the first entry of each id: its best
    first[:, 1:] &= code[:, 1:] != code[:, :-1]

    by_score = np.where(first, (down << (c_bits + s_bits)) | (code << s_bits) | slot, _EMPTY)
    best = np.sort(by_score, axis=-1)[:, :k]
    found, n = best != _EMPTY, best.shape[1]
    code = np.where(found, (best >> s_bits) & ((1 << c_bits) - 1), 0)
    score = _from_sortable(_SCORE_MASK - ((best >> (c_bits + s_bits)) & _SCORE_MASK))
    result.ids[:, :n] = np.where(found, code if values is None else values[code], -1)
    result.scores[:, :n] = np.where(found, score, -np.inf)
    result.interests[:, :n] = np.where(found, best & ((1 << s_bits) - 1), -1)


def _id_codes(ids: np.ndarray, keep: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Non-negative int64 codes ordered as the ids (0 where not kept), and the ids by code:
    the ids themselves (``None``) when they fit in ``bits``, their ranks otherwise."""
    used = np.where(keep, ids, 0)
    if used.min() >= 0 and used.max() < 1 << bits:
        return used, None
    values, codes = np.unique(used, return_inverse=True)
    return codes.reshape(ids.shape).astype(np.int64), values


def _sortable(scores: np.ndarray) -> np.ndarray:
    """float32 -> uint32 of the same order (the sign bit flipped, or every bit of a negative);
    -0.0 becomes 0.0, which it equals."""
    bits = (np.asarray(scores, np.float32) + np.float32(0.0)).view(np.uint32)
    return np.where(bits >> 31, ~bits, bits | np.uint32(0x80000000))


def _from_sortable(keys: np.ndarray) -> np.ndarray:
    """The inverse of :func:`_sortable` (``keys`` of any integer type, values below 2**32)."""
    keys = keys.astype(np.uint32)
    bits = np.where(keys >> 31, keys & np.uint32(0x7FFFFFFF), ~keys).astype(np.uint32)
    return bits.view(np.float32)
