"""Brute-force retrieval and the popularity baseline against naive references."""

from __future__ import annotations

import numpy as np

from retrieval.evaluate import exact_top_k, popularity_top_k


def test_exact_top_k_matches_a_naive_loop() -> None:
    rng = np.random.default_rng(0)
    interests, items = rng.normal(size=(300, 3, 8)), rng.normal(size=(41, 8))  # > one user batch
    exclude = [rng.choice(np.arange(1, 41), size=rng.integers(0, 10), replace=False) for _ in range(300)]
    got = exact_top_k(interests, items, exclude, 7)
    for u in range(300):
        best = {
            v: max(interests[u, k] @ items[v] for k in range(3)) for v in range(1, 41) if v not in exclude[u]
        }
        expected = sorted(best, key=lambda v: -best[v])[:7]
        assert got[u].tolist() == expected


def test_small_catalogue_pads_with_minus_one() -> None:
    items = np.eye(4)  # rows 1..3 are items
    got = exact_top_k(np.array([[[0.0, 3.0, 2.0, 1.0]]]), items, [np.array([2])], 5)
    assert got.tolist() == [[1, 3, -1, -1, -1]]  # item 2 (score 2) is excluded


def test_popularity_excludes_each_users_history() -> None:
    counts = np.array([0, 5, 9, 1, 7])
    got = popularity_top_k(counts, [np.array([], int), np.array([2, 4])], 3)
    assert got.tolist() == [[2, 4, 1], [1, 3, -1]]
