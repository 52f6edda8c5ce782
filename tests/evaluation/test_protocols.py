"""The protocols' splits and negative sampling on hand-made data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from retrieval.data.interactions import SequenceData, build_sequences
from retrieval.data.splits import comirec_split, comirec_users, history_length, sample_negatives
from retrieval.data.tables import interactions_from_frame
from retrieval.training.config import DataConfig
from retrieval.training.protocols import make_protocol


def _sequences(lengths: list[int], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 60, size=n) for n in lengths]


@pytest.mark.parametrize(
    ("n", "history"),
    # int(0.8 n): 2 -> 1.6 -> 1, 3 -> 2.4 -> 2, 4 -> 3.2 -> 3, 5 -> 4.0 -> 4, 6 -> 4.8 -> 4,
    # 7 -> 5.6 -> 5, 9 -> 7.2 -> 7, 10 -> 8.0 -> 8, 11 -> 8.8 -> 8, 20 -> 16, 35 -> 28.
    [(2, 1), (3, 2), (4, 3), (5, 4), (6, 4), (7, 5), (9, 7), (10, 8), (11, 8), (20, 16), (35, 28)],
)
def test_history_is_the_first_80_percent(n: int, history: int) -> None:
    assert history_length(n) == history


def test_too_short_sequences_cannot_be_split() -> None:
    with pytest.raises(ValueError, match="cannot be split"):
        history_length(1)
    with pytest.raises(ValueError, match="history_fraction"):
        history_length(5, 1.0)
    assert history_length(2, 0.1) == 1  # int(0.2) = 0, raised to one history item
    assert history_length(3, 0.99) == 2  # int(2.97) = 2; never all of the sequence


def test_comirec_split_sizes_disjoint_users_and_whole_training_sequences() -> None:
    lengths = [1 if u % 9 == 0 else 2 + u % 11 for u in range(50)]  # some users of one event
    sequences = _sequences(lengths)
    split = comirec_split(sequences, seed=3)
    # 50 users: int(50 * 0.8) = 40 train, int(50 * 0.9) - 40 = 5 validation, 5 test (before
    # dropping the held-out users of one event).
    assert len(split.train_users) == 40
    assert len(split.valid_users) + len(split.test_users) + len(split.dropped_users) == 10
    parts = [split.train_users, split.valid_users, split.test_users, split.dropped_users]
    everyone = np.concatenate(parts)
    assert sorted(everyone.tolist()) == list(range(50))  # disjoint and complete
    assert all(lengths[u] == 1 for u in split.dropped_users)
    assert all(lengths[u] >= 2 for u in np.concatenate([split.valid_users, split.test_users]))
    for u, seq in zip(split.train_users, split.train, strict=True):
        np.testing.assert_array_equal(seq, sequences[u])  # training users keep everything
    for users, histories, targets in (
        (split.valid_users, split.valid_histories, split.valid_targets),
        (split.test_users, split.test_histories, split.test_targets),
    ):
        for u, h, t in zip(users, histories, targets, strict=True):
            assert len(h) == history_length(lengths[u]) and len(t) == lengths[u] - len(h)
            np.testing.assert_array_equal(np.concatenate([h, t]), sequences[u])


def test_comirec_split_is_deterministic_by_seed() -> None:
    sequences = _sequences([5 + u % 7 for u in range(37)])
    a, b, c = comirec_split(sequences, seed=1), comirec_split(sequences, seed=1), comirec_split(sequences, 2)
    for name in ("train_users", "valid_users", "test_users"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.test_users, c.test_users)
    # 37 users: int(29.6) = 29 train, int(33.3) - 29 = 4 validation, 4 test.
    assert (len(a.train_users), len(a.valid_users), len(a.test_users)) == (29, 4, 4)


def test_comirec_split_rejects_bad_fractions() -> None:
    with pytest.raises(ValueError, match="summing to 1"):
        comirec_split(_sequences([5] * 10), user_fractions=(0.8, 0.1, 0.2))


@pytest.mark.parametrize("num_items", [130, 2000])  # the dense path and rejection sampling
def test_negatives_avoid_the_users_items_and_are_100_distinct(num_items: int) -> None:
    rng = np.random.default_rng(4)
    user_items = [rng.integers(1, 30, size=rng.integers(1, 20)) for _ in range(50)]
    user_items[0] = np.array([0, 5, 5, num_items + 7])  # padding, a repeat, an unknown id: ignored
    negatives = sample_negatives(user_items, num_items, 100, seed=9)
    assert negatives.shape == (50, 100) and negatives.dtype == np.int64
    for items, row in zip(user_items, negatives, strict=True):
        assert len(np.unique(row)) == 100
        assert row.min() >= 1 and row.max() <= num_items
        assert not np.isin(row, items).any()  # the items include the target
    np.testing.assert_array_equal(negatives, sample_negatives(user_items, num_items, 100, seed=9))
    assert not np.array_equal(negatives, sample_negatives(user_items, num_items, 100, seed=10))


@pytest.mark.parametrize("num_items", [250, 1000])
def test_negatives_are_uniform_over_the_items_left(num_items: int) -> None:
    avoid = np.arange(1, 51)
    users = 3 * (num_items - 50)  # 300 expected draws of each item left: +-30% is > 5 sigma
    negatives = sample_negatives([avoid] * users, num_items, 100, seed=0)
    counts = np.bincount(negatives.ravel(), minlength=num_items + 1)
    assert counts[:51].sum() == 0
    assert counts[51:].min() > 0.7 * 300 and counts[51:].max() < 1.3 * 300


def test_negatives_need_enough_items() -> None:
    with pytest.raises(ValueError, match="only 95 items left"):
        sample_negatives([np.arange(1, 6)], 100, 100)


def _single_split_reference(num_users: int, seed: int) -> tuple[list[int], list[int], list[int]]:
    """ComiRec's 8:1:1 cut written out as its ``preprocess/data.py`` does it (the oracle of folds = 1)."""
    order = np.random.default_rng(seed).permutation(num_users)
    a, b = int(num_users * 0.8), int(num_users * 0.9)
    return sorted(order[:a]), sorted(order[a:b]), sorted(order[b:])


@pytest.mark.parametrize(("num_users", "seed"), [(50, 3), (37, 1), (943, 42), (1, 0)])
def test_one_fold_is_the_single_8_1_1_split(num_users: int, seed: int) -> None:
    got = comirec_users(num_users, seed)
    assert [g.tolist() for g in got] == [list(map(int, r)) for r in _single_split_reference(num_users, seed)]
    assert all(g.dtype == np.int64 for g in got)


@pytest.mark.parametrize(("num_users", "folds"), [(50, 2), (37, 10), (943, 10), (12, 12)])
def test_folds_are_disjoint_cover_every_user_and_keep_validation_apart(num_users: int, folds: int) -> None:
    tested = []
    for fold in range(folds):
        train, valid, test = comirec_users(num_users, 7, folds=folds, fold=fold)
        # Within a fold: three disjoint sets of all the users, validation 10% of them.
        assert sorted(np.concatenate([train, valid, test]).tolist()) == list(range(num_users))
        assert len(valid) == int(num_users * 0.1) and len(train) == num_users - len(test) - len(valid)
        # Folds of U // N or U // N + 1 users.
        assert num_users // folds <= len(test) <= -(-num_users // folds)
        tested.append(test)
    everyone = np.concatenate(tested)
    assert sorted(everyone.tolist()) == list(range(num_users))  # each user tested exactly once


def test_folds_are_deterministic_by_seed_and_the_last_of_ten_is_the_single_split() -> None:
    a = comirec_users(200, 5, folds=4, fold=2)
    b = comirec_users(200, 5, folds=4, fold=2)
    c = comirec_users(200, 6, folds=4, fold=2)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[2], c[2])
    # 50 users: fold 9 of 10 is shuffled positions 45..49 and validation the 5 before it,
    # exactly ComiRec's cut at int(50 * 0.8) = 40 and int(50 * 0.9) = 45.
    single = comirec_users(50, 3)
    for x, y in zip(comirec_users(50, 3, folds=10, fold=9), single, strict=True):
        np.testing.assert_array_equal(x, y)


def test_folds_reject_bad_numbers() -> None:
    with pytest.raises(ValueError, match="0 <= fold < folds"):
        comirec_users(10, folds=3, fold=3)
    with pytest.raises(ValueError, match="folds >= 1"):
        comirec_users(10, folds=0)
    with pytest.raises(ValueError, match="a fold would be empty"):
        comirec_users(3, folds=4, fold=0)


def test_comirec_split_of_a_fold_cuts_its_users_and_drops_the_short_ones() -> None:
    lengths = [1 if u % 9 == 0 else 2 + u % 11 for u in range(60)]
    sequences = _sequences(lengths)
    tested, dropped = [], []
    for fold in range(3):
        split = comirec_split(sequences, seed=4, folds=3, fold=fold)
        train, _, test = comirec_users(60, 4, folds=3, fold=fold)
        np.testing.assert_array_equal(split.train_users, train)
        assert set(split.test_users) | {u for u in split.dropped_users if u in test} == set(test.tolist())
        for u, h, t in zip(split.test_users, split.test_histories, split.test_targets, strict=True):
            np.testing.assert_array_equal(np.concatenate([h, t]), sequences[u])
        tested += split.test_users.tolist()
        dropped += [u for u in split.dropped_users if u in test]
    assert sorted(tested + dropped) == list(range(60))
    assert sorted(dropped) == [u for u in range(60) if lengths[u] == 1]


def _sequence_data(num_users: int) -> SequenceData:
    rows = [(f"u{u}", f"i{(u + e) % 9}", e) for u in range(num_users) for e in range(3 + u % 4)]
    frame = pd.DataFrame(rows, columns=["user", "item", "timestamp"])
    return build_sequences(interactions_from_frame(frame))


def test_protocol_splits_the_configured_fold_and_names_its_users() -> None:
    data = _sequence_data(40)
    protocol = make_protocol(DataConfig(protocol="comirec", split_seed=9, folds=4, fold=1), data)
    train, valid, test = comirec_users(40, 9, folds=4, fold=1)
    np.testing.assert_array_equal(protocol.split.test_users, test)
    np.testing.assert_array_equal(protocol.train_users, train)
    assert protocol.held_out_ids("test") == [data.users[u] for u in test]
    assert protocol.held_out_ids("valid") == [data.users[u] for u in valid]
    single = make_protocol(DataConfig(protocol="comirec", split_seed=9), data)
    np.testing.assert_array_equal(single.split.test_users, comirec_users(40, 9)[2])
    loo = make_protocol(DataConfig(protocol="loo"), data)
    assert loo.held_out_ids("test") == list(data.users)  # every user has 3 events or more
    with pytest.raises(ValueError, match=r"needs data\.protocol=comirec"):
        make_protocol(DataConfig(protocol="loo", folds=2), data)
    with pytest.raises(ValueError, match="0 <= fold < folds"):
        make_protocol(DataConfig(protocol="comirec", folds=2, fold=2), data)
    with pytest.raises(ValueError, match=r"DataConfig\.folds=0: must be >= 1"):
        DataConfig(folds=0)
    with pytest.raises(ValueError, match="unknown split"):
        protocol.held_out_ids("train")
