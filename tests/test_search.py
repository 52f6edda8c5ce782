"""search_interests against an independent numpy brute-force oracle."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import pytest

from index import FaissIndex
from retrieval.search import SearchResult, search_interests

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
