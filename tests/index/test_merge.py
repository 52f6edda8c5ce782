"""Merge strategies against hand-worked cases and plain-Python oracles."""

from __future__ import annotations

import numpy as np
import pytest

from index.merge import Merged, diversity, max_score, round_robin, strategy
from retrieval.api.types import MergeStrategy

NEG = -np.inf
# Two interests; item 2 is found by both, interest 1 has a short list.
IDS = np.array([[1, 2, 3], [4, 5, -1]])
SCORES = np.array([[0.9, 0.8, 0.7], [0.6, 0.5, NEG]], np.float32)
# Category codes indexed by id: 1, 2, 4 -> A (0); 3 -> B (1); 5 -> C (2).
CATEGORIES = np.array([99, 0, 0, 1, 0, 2])


def as_tuples(merged: Merged) -> list[tuple[int, float, int]]:
    return [
        (int(i), round(float(s), 5), int(n))
        for i, s, n in zip(merged.ids, merged.scores, merged.interests, strict=True)
    ]


def random_lists(seed: int, num_interests: int = 4, n: int = 6, num_ids: int = 12):
    """Lists with duplicates across interests, holes and one masked (all -1) interest."""
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.choice(np.arange(1, num_ids), n, replace=False) for _ in range(num_interests)])
    scores = np.sort(rng.normal(size=(num_interests, n)).astype(np.float32), axis=1)[:, ::-1].copy()
    ids[rng.random(ids.shape) < 0.2] = -1
    ids[num_interests - 1] = -1  # masked interest
    scores[ids < 0] = NEG
    return ids, scores


def oracle_max_score(ids: np.ndarray, scores: np.ndarray, k: int) -> list[tuple[int, float, int]]:
    best: dict[int, tuple[float, int]] = {}
    for interest in range(ids.shape[0]):
        for item, score in zip(ids[interest], scores[interest], strict=True):
            if item >= 0 and (item not in best or score > best[item][0]):
                best[int(item)] = (float(score), interest)
    ranked = sorted(best.items(), key=lambda t: (-t[1][0], t[0]))[:k]
    return [(item, round(s, 5), n) for item, (s, n) in ranked]


def oracle_diversity(ids, scores, k, categories, lam) -> list[int]:
    """The greedy objective written out: recount category differences against every pick."""
    best: dict[int, float] = {}
    for item, score in zip(ids.ravel().tolist(), scores.ravel().tolist(), strict=True):
        if item >= 0:
            best[item] = max(score, best.get(item, -np.inf))
    picked: list[int] = []
    while len(picked) < k and len(picked) < len(best):
        gains = {
            item: f + lam * sum(categories[item] != categories[j] for j in picked)
            for item, f in best.items()
            if item not in picked
        }
        picked.append(max(gains, key=lambda item: (gains[item], best[item], -item)))
    return picked


def test_max_score_hand_worked() -> None:
    ids = np.array([[7, 3], [3, 9]])
    scores = np.array([[0.9, 0.5], [0.8, 0.4]], np.float32)
    # 3 appears twice: it keeps 0.8 from interest 1.
    assert as_tuples(max_score(ids, scores, 3)) == [(7, 0.9, 0), (3, 0.8, 1), (9, 0.4, 1)]
    assert as_tuples(max_score(ids, scores, 2)) == [(7, 0.9, 0), (3, 0.8, 1)]


@pytest.mark.parametrize("seed", range(20))
def test_max_score_equals_oracle(seed: int) -> None:
    ids, scores = random_lists(seed)
    for k in (1, 3, 50):  # 50: fewer than k distinct items exist
        assert as_tuples(max_score(ids, scores, k)) == oracle_max_score(ids, scores, k)


def test_round_robin_interleaves_and_skips_duplicates() -> None:
    ids = np.array([[1, 2, 3], [2, 4, -1], [-1, -1, -1]])  # interest 2 is masked
    scores = np.array([[0.9, 0.8, 0.7], [0.95, 0.6, NEG], [NEG] * 3], np.float32)
    # rank 0: 1 (interest 0), 2 (interest 1); rank 1: 2 taken, 4; rank 2: 3.
    assert as_tuples(round_robin(ids, scores, 10)) == [(1, 0.9, 0), (2, 0.95, 1), (4, 0.6, 1), (3, 0.7, 0)]
    assert as_tuples(round_robin(ids, scores, 3)) == [(1, 0.9, 0), (2, 0.95, 1), (4, 0.6, 1)]


def test_round_robin_holes_do_not_use_a_turn() -> None:
    ids = np.array([[1, -1, 3], [5, 6, 7]])
    scores = np.array([[0.9, NEG, 0.7], [0.5, 0.4, 0.3]], np.float32)
    assert round_robin(ids, scores, 4).ids.tolist() == [1, 5, 3, 6]


def test_diversity_with_lambda_zero_is_max_score() -> None:
    assert as_tuples(diversity(IDS, SCORES, 3, CATEGORIES, 0.0)) == as_tuples(max_score(IDS, SCORES, 3))
    for seed in range(20):
        ids, scores = random_lists(seed)
        categories = np.random.default_rng(seed).integers(0, 3, 12)
        for k in (1, 4, 50):
            assert as_tuples(diversity(ids, scores, k, categories, 0.0)) == as_tuples(
                max_score(ids, scores, k)
            )


def test_diversity_hand_worked() -> None:
    # lam = 1: pick 1 (0.9). Then 2: 0.8 + 0, 3: 0.7 + 1, 4: 0.6 + 0, 5: 0.5 + 1 -> 3.
    # Then 2: 0.8 + 1, 4: 0.6 + 1, 5: 0.5 + 2 -> 5. A large lam prefers new categories.
    assert as_tuples(diversity(IDS, SCORES, 3, CATEGORIES, 1.0)) == [(1, 0.9, 0), (3, 0.7, 0), (5, 0.5, 1)]
    # lam = 0.15: then 3 (0.85) beats 2 (0.8); then 2: 0.95, 4: 0.75, 5: 0.8 -> 2.
    assert diversity(IDS, SCORES, 3, CATEGORIES, 0.15).ids.tolist() == [1, 3, 2]
    # Fewer candidates than k: all of them, still greedy.
    assert diversity(IDS, SCORES, 10, CATEGORIES, 1.0).ids.tolist() == [1, 3, 5, 2, 4]


@pytest.mark.parametrize("seed", range(20))
def test_diversity_equals_oracle(seed: int) -> None:
    ids, scores = random_lists(seed)
    categories = np.random.default_rng(100 + seed).integers(0, 3, 12)
    for lam in (0.1, 0.5, 3.0):
        for k in (1, 5, 50):
            got = diversity(ids, scores, k, categories, lam).ids.tolist()
            assert got == oracle_diversity(ids, scores, k, categories, lam)


def test_every_strategy_handles_empty_and_masked_input() -> None:
    ids, scores = np.full((3, 4), -1), np.full((3, 4), NEG, np.float32)
    for merged in (
        max_score(ids, scores, 5),
        round_robin(ids, scores, 5),
        diversity(ids, scores, 5, CATEGORIES, 1.0),
    ):
        assert len(merged) == 0 and merged.ids.dtype == np.int64


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="lam must be"):
        diversity(IDS, SCORES, 3, CATEGORIES, float("nan"))
    with pytest.raises(ValueError, match="lam must be"):
        diversity(IDS, SCORES, 3, CATEGORIES, -1.0)
    with pytest.raises(ValueError, match="k must be"):
        max_score(IDS, SCORES, 0)
    with pytest.raises(ValueError, match=r"\[K, n\]"):
        round_robin(IDS, SCORES[:, :2], 3)
    with pytest.raises(ValueError, match="has no category"):
        diversity(IDS, SCORES, 3, CATEGORIES[:3], 1.0)


def test_strategy_binds_the_diversity_options() -> None:
    assert strategy(MergeStrategy.MAX_SCORE) is max_score
    assert strategy(MergeStrategy.ROUND_ROBIN) is round_robin
    merge = strategy(MergeStrategy.DIVERSITY, CATEGORIES, 1.0)
    assert merge(IDS, SCORES, 3).ids.tolist() == [1, 3, 5]
    with pytest.raises(ValueError, match="needs item categories"):
        strategy(MergeStrategy.DIVERSITY)
