"""Ranking metrics against hand-worked examples."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval.metrics import ranking_metrics


def test_single_target_hand_worked() -> None:
    topk = np.array([[5, 3, 9, 1], [2, 4, 6, 8], [7, 7, 7, 7]])
    targets = np.array([3, 8, 1])
    # user 0: hit at rank 2 -> ndcg 1/log2(3); user 1: hit at rank 4 -> 1/log2(5); user 2: miss.
    m = ranking_metrics(topk, targets, ks=(2, 4))
    assert m["hr@2"] == pytest.approx(1 / 3)
    assert m["ndcg@2"] == pytest.approx((1 / np.log2(3)) / 3)
    assert m["hr@4"] == pytest.approx(2 / 3)
    assert m["ndcg@4"] == pytest.approx((1 / np.log2(3) + 1 / np.log2(5)) / 3)
    assert m["recall@4"] == pytest.approx(2 / 3)


def test_several_targets_hand_worked() -> None:
    topk = np.array([[1, 2, 3, 4]])
    targets = [np.array([2, 4, 9])]
    m = ranking_metrics(topk, targets, ks=(2, 4))
    assert m["hr@2"] == 1.0
    assert m["recall@2"] == pytest.approx(1 / 3)
    # DCG@2 = 1/log2(3); IDCG@2 = 1 + 1/log2(3)
    assert m["ndcg@2"] == pytest.approx((1 / np.log2(3)) / (1 + 1 / np.log2(3)))
    # DCG@4 = 1/log2(3) + 1/log2(5); IDCG@4 (3 targets) = 1 + 1/log2(3) + 1/log2(4)
    assert m["ndcg@4"] == pytest.approx((1 / np.log2(3) + 1 / np.log2(5)) / (1 + 1 / np.log2(3) + 0.5))
    assert m["recall@4"] == pytest.approx(2 / 3)


def test_rejects_short_lists_and_mismatched_users() -> None:
    with pytest.raises(ValueError, match="fewer than K"):
        ranking_metrics(np.zeros((1, 5), int), np.array([1]), ks=(10,))
    with pytest.raises(ValueError, match="2 ranked lists for 1 users"):
        ranking_metrics(np.zeros((2, 10), int), np.array([1]), ks=(10,))
