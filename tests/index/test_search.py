"""search_interests against an independent numpy brute-force oracle."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import pytest

from index import FaissIndex, SearchFilter
from index.merge import strategy
from index.multi_interest import ItemCategories, SearchResult, search_interests
from retrieval.api.types import MergeStrategy

DIM, NUM_ITEMS, K = 16, 40, 3
Rows = list[list[tuple[int, float, int]]]


def oracle(
    ids: np.ndarray, vectors: np.ndarray, interests: np.ndarray, k: int, exclude: Sequence[Collection[int]]
) -> Rows:
    """Per user: (id, max score over interests, argmax interest), best first, excluded ids dropped."""
    out = []
    for user, banned in zip(interests, exclude, strict=True):
        scores = user @ vectors.T  # [K, n]
        ranked = sorted(
            (
                (int(item), float(scores[:, j].max()), int(scores[:, j].argmax()))
                for j, item in enumerate(ids)
                if item not in banned
            ),
            key=lambda t: -t[1],
        )
        out.append(ranked[:k])
    return out


def assert_matches(result: SearchResult, expected: Rows) -> None:
    """Same ids and interests in the same order, and the same scores, padding left out."""
    got = [
        [(int(i), float(s), int(n)) for i, s, n in zip(*row, strict=True) if i >= 0]
        for row in zip(result.ids, result.scores, result.interests, strict=True)
    ]
    assert [[(i, n) for i, _, n in row] for row in got] == [[(i, n) for i, _, n in row] for row in expected]
    scores = [s for row in got for _, s, _ in row]
    np.testing.assert_allclose(scores, [s for row in expected for _, s, _ in row], rtol=1e-5)


@pytest.fixture(scope="module")
def catalogue() -> tuple[np.ndarray, np.ndarray, FaissIndex]:
    rng = np.random.default_rng(0)
    ids = np.arange(1, NUM_ITEMS + 1, dtype=np.int64) * 10  # not row numbers
    vectors = rng.normal(size=(NUM_ITEMS, DIM)).astype(np.float32)
    return ids, vectors, FaissIndex.build(ids, vectors, "Flat")


@pytest.fixture(scope="module")
def interests() -> np.ndarray:
    return np.random.default_rng(1).normal(size=(4, K, DIM)).astype(np.float32)


def test_matches_oracle_without_exclusions(catalogue: tuple, interests: np.ndarray) -> None:
    ids, vectors, index = catalogue
    result = search_interests(index, interests, 7)
    assert result.ids.shape == result.scores.shape == result.interests.shape == (4, 7)
    assert (result.ids.dtype, result.scores.dtype, result.interests.dtype) == (np.int64, np.float32, np.int32)
    assert_matches(result, oracle(ids, vectors, interests, 7, [()] * 4))


def test_exclusions_never_leak(catalogue: tuple, interests: np.ndarray) -> None:
    ids, vectors, index = catalogue
    # Exclude each user's 12 best items (more than k), so only the over-fetch can fill the top-k.
    best = oracle(ids, vectors, interests, 12, [()] * 4)
    exclude = [{i for i, _, _ in row} | {999} for row in best]  # 999 is not in the index
    result = search_interests(index, interests, 5, exclude)
    for row, banned in zip(result.ids, exclude, strict=True):
        assert not set(row.tolist()) & banned
    assert_matches(result, oracle(ids, vectors, interests, 5, exclude))


def test_duplicates_keep_best_score_and_its_interest(catalogue: tuple) -> None:
    _, vectors, index = catalogue
    # The three interests are scaled copies of one vector, so all three find the same top items
    # (with positive scores) and interest 1 (x2) scores them highest: each id must appear
    # once, credited to interest 1 with the doubled score.
    base = np.random.default_rng(2).normal(size=DIM).astype(np.float32)
    user = np.stack([base, 2 * base, 0.5 * base])[None]  # [1, 3, d]
    result = search_interests(index, user, 5)
    assert len(set(result.ids[0].tolist())) == 5
    np.testing.assert_array_equal(result.interests[0], 1)
    expected = np.sort(2 * vectors @ base)[::-1][:5]
    np.testing.assert_allclose(result.scores[0], expected, rtol=1e-5)


@pytest.mark.parametrize("offset", [0, 2**40], ids=["small ids", "ids past 32 bits"])
def test_ties_go_to_the_smaller_id_and_the_lower_interest(offset: int) -> None:
    # Pairs of items with equal vectors tie on every score, and a user's first two interests
    # are equal: each tie must go to the smaller id, each item to interest 0 over interest 1.
    rng = np.random.default_rng(3)
    vectors = np.repeat(rng.normal(size=(NUM_ITEMS // 2, DIM)).astype(np.float32), 2, axis=0)
    ids = offset + np.arange(NUM_ITEMS, dtype=np.int64)[::-1] * 7  # descending: ties are not in id order
    index = FaissIndex.build(ids, vectors, "Flat")
    users = rng.normal(size=(3, K, DIM)).astype(np.float32)
    users[:, 1] = users[:, 0]
    banned = [set(ids[:6].tolist()), set(), {int(ids[-1])}]
    expected = oracle(np.sort(ids), vectors[np.argsort(ids)], users, 9, banned)
    assert_matches(search_interests(index, users, 9, banned), expected)


def test_fewer_than_k_pads(catalogue: tuple, interests: np.ndarray) -> None:
    ids, vectors, _ = catalogue
    small = FaissIndex.build(ids[:5], vectors[:5], "Flat")
    exclude = [{int(ids[0]), int(ids[1])}, set(), set(ids[:5].tolist()), {int(ids[4])}]
    result = search_interests(small, interests, 8, exclude)
    assert [int((row >= 0).sum()) for row in result.ids] == [3, 5, 0, 4]
    padding = result.ids < 0
    assert np.all(np.isneginf(result.scores[padding])) and np.all(result.interests[padding] == -1)
    assert np.all(np.isfinite(result.scores[~padding]))
    assert_matches(result, oracle(ids[:5], vectors[:5], interests, 8, exclude))


@pytest.mark.parametrize(
    ("shape", "k", "exclude", "message"),
    [
        ((4, DIM), 3, None, r"shape \[B, K, d\]"),
        ((2, K, DIM), 0, None, "k must be a positive integer"),
        ((2, K, DIM), 3, [()], "exclude has 1 entries for a batch of 2"),
    ],
)
def test_rejects_bad_input(
    catalogue: tuple, shape: tuple, k: int, exclude: list | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        search_interests(catalogue[2], np.zeros(shape, np.float32), k, exclude)


class SpyIndex(FaissIndex):
    """A Flat index that records every query batch it is asked for."""

    def __init__(self, ids: np.ndarray, vectors: np.ndarray, factory: str = "Flat", params: str = "") -> None:
        built = FaissIndex.build(ids, vectors, factory, params)
        super().__init__(built.faiss_index, factory, params)
        self._keep_alive = built
        self.seen: list[np.ndarray] = []

    def search(
        self, queries: np.ndarray, k: int, filter: SearchFilter | None = None
    ) -> tuple[np.ndarray, ...]:
        self.seen.append(queries.copy())
        return super().search(queries, k, filter)


def test_zero_interests_are_skipped(catalogue: tuple, interests: np.ndarray) -> None:
    ids, vectors, _ = catalogue
    index = SpyIndex(ids, vectors)
    masked = interests.copy()
    masked[0, 1:] = 0  # user 0: only interest 0 is real (MIND's K'_u = 1)
    masked[2] = 0  # user 2: no interest at all
    result = search_interests(index, masked, 6)
    # Zero vectors never reach the index: 4 users x 3 interests - 2 - 3 masked ones.
    assert (
        len(index.seen) == 1 and len(index.seen[0]) == 12 - 5 and np.all(np.any(index.seen[0] != 0, axis=1))
    )
    assert np.all(result.interests[0] == 0)
    assert np.all(result.ids[2] == -1) and np.all(np.isneginf(result.scores[2]))
    # A masked interest would have contributed items scoring 0 (or tied with negatives).
    expected = oracle(ids, vectors, masked[:1, :1], 6, [()])
    assert_matches(SearchResult(result.ids[:1], result.scores[:1], result.interests[:1]), expected)
    assert_matches(
        SearchResult(result.ids[[1, 3]], result.scores[[1, 3]], result.interests[[1, 3]]),
        oracle(ids, vectors, interests[[1, 3]], 6, [()] * 2),
    )


@pytest.mark.parametrize("batch", [1, 4])
def test_allow_list_and_category(catalogue: tuple, interests: np.ndarray, batch: int) -> None:
    ids, vectors, index = catalogue
    users = interests[:batch]
    allow = set(ids[::2].tolist())  # every other item
    categories = ItemCategories.from_attributes(
        {
            int(i): (["even"] if n % 2 == 0 else ["odd"]) + (["low"] if n < 10 else [])
            for n, i in enumerate(ids)
        }
    )
    history = [{int(ids[0]), int(ids[2]), int(ids[3])}] * batch
    for kwargs, allowed in [
        ({"allow": allow}, allow),
        ({"category": "even", "categories": categories}, allow),
        ({"allow": allow, "category": "low", "categories": categories}, set(ids[:10:2].tolist())),
    ]:
        result = search_interests(index, users, 7, history, **kwargs)
        expected = oracle(ids, vectors, users, 7, [h | (set(ids.tolist()) - allowed) for h in history])
        assert_matches(result, expected)
        for row in result.ids:
            assert set(row[row >= 0].tolist()) <= allowed - history[0]
    with pytest.raises(ValueError, match="unknown category 'blue'"):
        search_interests(index, users, 3, category="blue", categories=categories)
    with pytest.raises(ValueError, match="without item categories"):
        search_interests(index, users, 3, category="even")


def test_categories_from_model_dir(tmp_path) -> None:
    from retrieval.artifacts.categories import Categories
    from retrieval.artifacts.model import read_item_attributes
    from retrieval.data.vocab import ItemVocab

    (tmp_path / "item_attributes.json").write_text(
        '{"a": ["Comedy"], "b": ["Comedy", "Drama"], "zz": ["Drama"]}'
    )
    attributes = read_item_attributes(tmp_path)
    assert attributes is not None
    categories = Categories.of(ItemVocab.from_ids(["a", "b", "c"]), attributes).members
    np.testing.assert_array_equal(categories.ids("Comedy"), [1, 2])
    np.testing.assert_array_equal(categories.ids("Drama"), [2])  # "zz" is not in the vocabulary
    assert read_item_attributes(tmp_path / "none") is None


def test_batch_with_approximate_index_still_fills_k() -> None:
    # IVF with one probe over clustered items: the batched over-fetch alone comes back short for
    # users whose history fills their probed list; they are searched again with the filter inside.
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(4, DIM))
    vectors = (centres[np.arange(400) % 4] + 0.05 * rng.normal(size=(400, DIM))).astype(np.float32)
    ids = np.arange(1, 401, dtype=np.int64)
    index = FaissIndex.build(ids, vectors, "IVF4,Flat", "nprobe=1")
    users = centres[:3, None, :].astype(np.float32)  # [3, 1, d]
    history = [set(ids[np.arange(400) % 4 == u].tolist()[:95]) for u in range(3)]  # 95 of 100 in the cluster
    result = search_interests(index, users, 10, history)
    for row, banned in zip(result.ids, history, strict=True):
        assert (row >= 0).all() and not set(row.tolist()) & banned


def test_search_interests_takes_any_vector_index(catalogue: tuple, interests: np.ndarray) -> None:
    ids, vectors, _ = catalogue
    assert_matches(
        search_interests(SpyIndex(ids, vectors, "L2MIPS,Flat"), interests, 5, [()] * 4),
        oracle(ids, vectors, interests, 5, [()] * 4),
    )


def test_the_diversity_merge_scores_each_candidate_under_every_interest() -> None:
    # Interest 0 looks along x, interest 1 along y. Item 4 is 4th in interest 0's list (x = 5)
    # and scores 6 under interest 1, whose own top 4 (y = 10..7) leave it out.
    table = np.array(
        [[0, 0], [10, 0], [9, 0], [8, 0], [5, 6], [0, 10], [0, 9], [0, 8], [0, 7], [1, 0]], np.float32
    )
    index = FaissIndex.build(np.arange(1, 10), table[1:], "Flat")
    interests = np.array([[[1, 0], [0, 1]]], np.float32)
    categories = np.array([0, 1, 1, 1, 2, 1, 1, 1, 1, 1])  # item 4 is the only one of its kind
    merge = strategy(MergeStrategy.DIVERSITY, categories, 10.0)  # a large λ picks item 4 second
    lists_only = search_interests(index, interests, 4, merge=merge)
    exact = search_interests(index, interests, 4, merge=merge, item_vectors=table)
    assert lists_only.ids[0, 1] == exact.ids[0, 1] == 4  # after the best item, 10 under interest 0
    assert (lists_only.interests[0, 1], lists_only.scores[0, 1]) == (0, 5.0)  # only what its list saw
    assert (exact.interests[0, 1], exact.scores[0, 1]) == (1, 6.0)  # its best interest, as DIVERSITY says
    # Every item is reported with its best score over all interests.
    best = (interests[0] @ table.T).max(axis=0)
    np.testing.assert_allclose(exact.scores[0], best[exact.ids[0]])
