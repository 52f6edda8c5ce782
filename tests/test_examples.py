"""Training examples for each objective against loop oracles and hand-worked cases."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from retrieval.training.examples import (
    cloze_windows,
    make_examples,
    mask_items,
    next_item_examples,
    shifted_windows,
)


def test_next_item_examples_hand_worked() -> None:
    train = [np.array([1, 2, 3, 4]), np.array([5, 6]), np.array([7])]
    inputs, targets = next_item_examples({"items": train}, max_len=4)
    histories = inputs["items"]
    assert histories.dtype == targets.dtype == np.int32
    np.testing.assert_array_equal(histories, [[0, 0, 0, 1], [0, 0, 1, 2], [0, 1, 2, 3], [0, 0, 0, 5]])
    np.testing.assert_array_equal(targets, [2, 3, 4, 6])
    # max_len 2 keeps the two most recent items, the latest in the last column.
    inputs, targets = next_item_examples({"items": train}, max_len=2)
    np.testing.assert_array_equal(inputs["items"], [[0, 1], [1, 2], [2, 3], [0, 5]])
    np.testing.assert_array_equal(targets, [2, 3, 4, 6])


def test_next_item_examples_match_a_loop_oracle() -> None:
    rng = np.random.default_rng(0)
    train = [rng.integers(1, 30, size=n) for n in rng.integers(0, 12, size=20)]
    inputs, targets = next_item_examples({"items": train}, max_len=5)
    histories = inputs["items"]
    expected_h, expected_t = [], []
    for s in train:
        for t in range(1, len(s)):
            window = list(s[max(0, t - 5) : t])
            expected_h.append([0] * (5 - len(window)) + window)
            expected_t.append(s[t])
    np.testing.assert_array_equal(histories, np.array(expected_h).reshape(-1, 5))
    np.testing.assert_array_equal(targets, expected_t)


def test_next_item_examples_empty() -> None:
    inputs, targets = next_item_examples({"items": [np.array([3])]}, max_len=3)
    histories = inputs["items"]
    assert histories.shape == (0, 3) and targets.shape == (0,)
    assert histories.dtype == targets.dtype == np.int32


def test_side_features_are_cut_like_the_items() -> None:
    items = [np.array([1, 2, 3, 4, 5]), np.array([7, 8])]
    events = {"items": items, "action": [s * 10 for s in items]}
    for make in (next_item_examples, shifted_windows, cloze_windows):
        inputs, _ = make(events, max_len=3)
        np.testing.assert_array_equal(inputs["action"], inputs["items"] * 10)


def test_shifted_windows_make_every_training_event_a_target_once() -> None:
    rng = np.random.default_rng(1)
    train = [rng.integers(1, 50, size=n) for n in rng.integers(0, 40, size=30)]
    inputs, targets = shifted_windows({"items": train}, max_len=7)
    assert inputs["items"].shape == targets.shape and targets.shape[1] == 7
    # Each window: the target at position j is the input at position j + 1 (the next event).
    x, y = inputs["items"], targets
    both = (y[:, :-1] > 0) & (x[:, 1:] > 0)
    np.testing.assert_array_equal(x[:, 1:][both], y[:, :-1][both])
    expected = sorted(int(v) for s in train for v in s[1:])
    assert sorted(y[y > 0].tolist()) == expected
    # Hand-worked: [1..5], L = 3 -> windows ending at 5 and at 2.
    inputs, targets = shifted_windows({"items": [np.arange(1, 6)]}, max_len=3)
    np.testing.assert_array_equal(inputs["items"], [[2, 3, 4], [0, 0, 1]])
    np.testing.assert_array_equal(targets, [[3, 4, 5], [0, 0, 2]])


def test_cloze_windows_and_masking() -> None:
    inputs, targets = cloze_windows({"items": [np.arange(1, 6), np.array([7])]}, max_len=3)
    np.testing.assert_array_equal(inputs["items"], [[3, 4, 5], [0, 1, 2], [0, 0, 7]])
    np.testing.assert_array_equal(targets, inputs["items"])
    tf.random.set_seed(0)
    x = {"items": tf.constant(np.tile(np.arange(0, 20), (200, 1)), tf.int32)}
    masked, y = mask_items(x, x["items"], mask_id=99, ratio=0.3)
    m, y = masked["items"].numpy(), y.numpy()
    chosen = m == 99
    assert not chosen[:, 0].any()  # padding is never masked
    np.testing.assert_array_equal(y[chosen], np.tile(np.arange(20), (200, 1))[chosen])
    assert (y[~chosen] == 0).all()
    assert abs(chosen[:, 1:].mean() - 0.3) < 0.02
    # A row with nothing chosen gets its newest item masked.
    masked, y = mask_items({"items": tf.constant([[0, 4, 5]])}, tf.constant([[0, 4, 5]]), 99, ratio=0.0)
    np.testing.assert_array_equal(masked["items"].numpy(), [[0, 4, 99]])
    np.testing.assert_array_equal(y.numpy(), [[0, 0, 5]])


def test_seeded_masking_is_repeatable() -> None:
    x = {"items": tf.constant(np.tile(np.arange(1, 21), (50, 1)), tf.int32)}

    def masked(seed: tuple[int, int]) -> np.ndarray:
        return mask_items(x, x["items"], 99, 0.3, seed=tf.constant(seed, tf.int64))[0]["items"].numpy()

    np.testing.assert_array_equal(masked((1, 7)), masked((1, 7)))
    assert (masked((1, 7)) != masked((1, 8))).any()
    assert abs((masked((2, 0)) == 99).mean() - 0.3) < 0.03


def test_unknown_objective() -> None:
    import pytest

    with pytest.raises(ValueError, match="unknown objective"):
        make_examples("nope", {"items": []}, 3)


def test_gap_now_is_measured_to_each_examples_target() -> None:
    import pytest

    from retrieval.data.features import gap_buckets

    t = np.array([100, 160, 1_000, 5_000])
    events = {"items": [np.array([1, 2, 3, 4])], "gap_now": [t]}
    inputs, targets = make_examples("last", events, max_len=3)
    np.testing.assert_array_equal(targets, [2, 3, 4])
    # Example 2 predicts item 4 at t=5000 from items 1..3 (at 100, 160, 1000).
    np.testing.assert_array_equal(inputs["gap_now"][2], gap_buckets(np.array([4_900, 4_840, 4_000])))
    np.testing.assert_array_equal(inputs["gap_now"][0], [0, 0, gap_buckets(np.array([60]))[0]])
    assert gap_buckets(np.array([0, 1, 3, -5, 10**12])).tolist() == [2, 3, 4, 2, 24]
    for objective in ("all_positions", "cloze"):
        with pytest.raises(ValueError, match="gap_now' needs objective 'last'"):
            make_examples(objective, events, max_len=3)
