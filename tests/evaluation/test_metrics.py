"""Ranking metrics against hand-worked examples and brute-force references."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from retrieval.evaluation.metrics import (
    DEFAULT_KS,
    comirec_metrics,
    diversity_at_k,
    paired_difference,
    ranking_metrics,
    sampled_metrics,
    user_comirec_metrics,
    user_ranking_metrics,
)


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


def test_per_user_values_are_the_hand_worked_ones_and_average_to_the_means() -> None:
    topk = np.array([[5, 3, 9, 1], [2, 4, 6, 8], [7, 7, 7, 7]])
    targets = np.array([3, 8, 1])
    per_user = user_ranking_metrics(topk, targets, ks=(2, 4))
    np.testing.assert_allclose(per_user["ndcg@4"], [1 / np.log2(3), 1 / np.log2(5), 0.0])
    np.testing.assert_array_equal(per_user["hr@2"], [1.0, 0.0, 0.0])
    assert {k: float(v.mean()) for k, v in per_user.items()} == ranking_metrics(topk, targets, ks=(2, 4))
    topk = np.array([[4, 7, 1, 9, -1], [3, 5, 6, 8, 10]])
    several = [np.array([7, 2, 9, 7]), np.array([2])]
    comirec = user_comirec_metrics(topk, several, ks=(2, 4))
    np.testing.assert_allclose(comirec["recall@4"], [0.75, 0.0])
    assert {k: float(v.mean()) for k, v in comirec.items()} == comirec_metrics(topk, several, ks=(2, 4))


def test_paired_difference_is_the_mean_difference_and_its_standard_error() -> None:
    a, b = np.array([1.0, 0.0, 0.5, 1.0]), np.array([0.0, 0.0, 0.5, 0.5])
    d = np.array([1.0, 0.0, 0.0, 0.5])  # per user: a - b
    mean, se = paired_difference(a, b)
    assert mean == pytest.approx(0.375)
    assert se == pytest.approx(np.sqrt(np.sum((d - 0.375) ** 2) / 3) / 2)
    # Pairing: a constant shift over users of any difficulty has no error at all.
    hard_and_easy = np.array([0.0, 1.0, 0.2, 0.9])
    assert paired_difference(hard_and_easy + 0.1, hard_and_easy) == pytest.approx((0.1, 0.0))
    with pytest.raises(ValueError, match="equal-length"):
        paired_difference(a, b[:3])
    with pytest.raises(ValueError, match="at least 2 users"):
        paired_difference(a[:1], b[:1])


def test_default_cut_offs_include_5() -> None:
    assert DEFAULT_KS == (5, 10, 20, 50)


def test_sampled_metrics_hand_worked() -> None:
    scores = np.array(
        [
            [0.5, 0.9, 0.1, 0.5, 0.2],  # negatives >= 0.5: 0.9 and the tie 0.5 -> rank 2
            [0.8, 0.1, 0.2, 0.3, 0.4],  # rank 0
            [-np.inf, 0.0, 0.0, 0.0, 0.0],  # target unknown to the model: a miss
        ]
    )
    m = sampled_metrics(scores, ks=(1, 3))
    # @1: only user 1 (rank 0) hits, NDCG 1/log2(2) = 1.
    assert m["sampled_hr@1"] == pytest.approx(1 / 3)
    assert m["sampled_ndcg@1"] == pytest.approx(1 / 3)
    # @3: users 0 (rank 2) and 1 (rank 0): NDCG (1/log2(4) + 1) / 3 = 1.5 / 3.
    assert m["sampled_hr@3"] == pytest.approx(2 / 3)
    assert m["sampled_ndcg@3"] == pytest.approx(0.5)
    assert set(m) == {"sampled_hr@1", "sampled_ndcg@1", "sampled_hr@3", "sampled_ndcg@3"}


def test_sampled_metrics_give_no_credit_for_all_equal_scores() -> None:
    assert sampled_metrics(np.zeros((4, 101)))["sampled_hr@10"] == 0.0
    with pytest.raises(ValueError, match="exceeds"):
        sampled_metrics(np.zeros((1, 5)), ks=(10,))


def test_comirec_metrics_hand_worked() -> None:
    topk = np.array([[4, 7, 1, 9, -1], [3, 5, 6, 8, 10]])
    targets = [np.array([7, 2, 9, 7]), np.array([2])]  # user 0 bought 7 twice: both count
    m = comirec_metrics(topk, targets, ks=(2, 4))
    d = 1 / np.log2(np.arange(4) + 2)  # discounts by target position: 1, 1/log2(3), 1/2, 1/log2(5)
    # N=2, S={4,7}: targets 0 and 3 (the two 7s) hit, r=2. recall 2/4; DCG d0+d3, IDCG d0+d1.
    assert m["recall@2"] == pytest.approx(0.5 / 2)
    assert m["hitrate@2"] == pytest.approx(1 / 2)
    assert m["ndcg@2"] == pytest.approx((d[0] + d[3]) / (d[0] + d[1]) / 2)
    # N=4, S={4,7,1,9}: targets 0, 2, 3 hit, r=3. recall 3/4; DCG d0+d2+d3, IDCG d0+d1+d2.
    assert m["recall@4"] == pytest.approx(0.75 / 2)
    assert m["hitrate@4"] == pytest.approx(1 / 2)
    assert m["ndcg@4"] == pytest.approx((d[0] + d[2] + d[3]) / (d[0] + d[1] + d[2]) / 2)
    # ComiRec's NDCG ignores the order of the retrieved list (see the docstring).
    swapped = topk[:, [1, 0, 2, 3, 4]]
    assert comirec_metrics(swapped, targets, ks=(2,)) == comirec_metrics(topk, targets, ks=(2,))


def test_comirec_metrics_match_a_transcription_of_comirecs_loop() -> None:
    rng = np.random.default_rng(1)
    topk = np.stack([rng.permutation(30)[:10] + 1 for _ in range(40)])
    targets = [rng.integers(1, 31, size=rng.integers(1, 6)) for _ in range(40)]
    total_recall = total_ndcg = total_hit = 0.0
    for row, iid_list in zip(topk, targets, strict=True):  # evaluate_full, THUDM/ComiRec src/train.py
        item_list, recall, dcg = set(row[:10].tolist()), 0, 0.0
        for no, iid in enumerate(iid_list):
            if iid in item_list:
                recall += 1
                dcg += 1.0 / np.log2(no + 2)
        idcg = sum(1.0 / np.log2(no + 2) for no in range(recall))
        total_recall += recall / len(iid_list)
        if recall > 0:
            total_ndcg += dcg / idcg
            total_hit += 1
    m = comirec_metrics(topk, targets, ks=(10,))
    assert m["recall@10"] == pytest.approx(total_recall / 40)
    assert m["ndcg@10"] == pytest.approx(total_ndcg / 40)
    assert m["hitrate@10"] == pytest.approx(total_hit / 40)


def test_diversity_hand_worked() -> None:
    categories = np.array([9, 0, 0, 1, 2])  # items 1, 2: category 0; 3: 1; 4: 2
    topk = np.array([[1, 2, 3, 4], [1, 2, -1, -1], [3, -1, -1, -1]])
    m = diversity_at_k(topk, categories, ks=(3, 4))
    # N=3: user 0 {1,2,3}: pairs (1,2) same, (1,3), (2,3) differ -> 2/3; user 1 {1,2}: 0/1;
    # user 2: a single item -> 0. Mean 2/9.
    assert m["diversity@3"] == pytest.approx(2 / 9)
    # N=4: user 0 adds 4: 6 pairs, only (1,2) alike -> 5/6. Mean 5/18.
    assert m["diversity@4"] == pytest.approx(5 / 18)


def test_diversity_matches_brute_force() -> None:
    rng = np.random.default_rng(2)
    categories = rng.integers(0, 4, size=51)
    topk = np.stack([rng.permutation(50)[:12] + 1 for _ in range(70)])
    topk[rng.random(topk.shape) < 0.1] = -1  # holes
    got = diversity_at_k(topk, categories, ks=(5, 12), batch=16)  # several batches
    for n in (5, 12):
        per_user = []
        for row in topk:
            items = [i for i in row[:n] if i >= 0]
            pairs = list(itertools.combinations(items, 2))
            per_user.append(np.mean([categories[a] != categories[b] for a, b in pairs]) if pairs else 0.0)
        assert got[f"diversity@{n}"] == pytest.approx(np.mean(per_user))
