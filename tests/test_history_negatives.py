"""``train.exclude_history``: each target's history left out of its negatives, against NumPy;
never a later item (no leakage), repeats kept as positives, every negative source, the config."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from retrieval.config import apply_overrides
from retrieval.training.config import Config
from retrieval.training.losses.history import history_hits, target_histories
from retrieval.training.losses.negatives import AllItems, SampledNegatives
from retrieval.training.losses.samplers import CandidateSampler
from retrieval.training.losses.task import RetrievalTask
from retrieval.training.run import build_training_task

NUM_ITEMS, DIM = 12, 4
ITEMS = np.array([[0, 3, 5, 7], [2, 2, 9, 4]], np.int32)  # left-padded inputs
TARGETS = np.array([[0, 5, 7, 8], [2, 9, 4, 6]], np.int32)  # the next item at each position


def numpy_histories(items: np.ndarray, targets: np.ndarray) -> list[set[int]]:
    """Per real target, in row-major order, the set of items at or before its position."""
    return [{int(i) for i in items[b, : t + 1] if i > 0} for b, t in zip(*np.nonzero(targets), strict=True)]


def test_histories_are_the_items_at_or_before_each_target() -> None:
    got = target_histories(tf.constant(ITEMS), tf.constant(TARGETS)).numpy()
    assert [set(row[row > 0].tolist()) for row in got] == numpy_histories(ITEMS, TARGETS)
    # Nothing after a target's position, even where a later item is repeated earlier.
    assert got[0].tolist() == [0, 3, 0, 0]
    # One target per row: the whole row.
    np.testing.assert_array_equal(target_histories(tf.constant(ITEMS), tf.constant([8, 6])).numpy(), ITEMS)


@pytest.mark.parametrize("shared", [True, False])
def test_history_hits_match_a_brute_force(shared: bool) -> None:
    rng = np.random.default_rng(0)
    histories = rng.integers(0, 8, size=(6, 5)).astype(np.int32)  # 0 = none
    ids = rng.integers(0, 10, size=(9,) if shared else (6, 9)).astype(np.int32)  # duplicates, and 0
    got = history_hits(tf.constant(histories), tf.constant(ids)).numpy()
    rows = np.broadcast_to(ids, (6, 9))
    expected = np.array([[c > 0 and c in set(h) for c in r] for h, r in zip(histories, rows, strict=True)])
    np.testing.assert_array_equal(got, expected)
    assert got.any() and not got.all()


def numpy_loss(
    query: np.ndarray, table: np.ndarray, target: int, negatives: np.ndarray, excluded: set[int]
) -> float:
    """-log softmax of the target among itself and the negatives not equal to it nor excluded."""
    kept = [n for n in negatives if n != target and n not in excluded]
    logits = table[[target, *kept]] @ query
    top = logits.max()
    return float(top + np.log(np.exp(logits - top).sum()) - logits[0])


@pytest.mark.parametrize("catalogue", [True, False])
def test_the_loss_leaves_each_targets_history_out_and_keeps_repeats(catalogue: bool) -> None:
    rng = np.random.default_rng(1)
    table = rng.normal(size=(NUM_ITEMS + 1, DIM)).astype(np.float32)
    outputs = rng.normal(size=(*ITEMS.shape, DIM)).astype(np.float32)
    items = np.array([[0, 3, 5, 7], [2, 2, 9, 2]], np.int32)  # row 1 buys item 2 again next
    targets = np.array([[0, 5, 7, 8], [2, 9, 2, 6]], np.int32)

    def source() -> AllItems | SampledNegatives:  # a fresh one draws the same negatives
        if catalogue:
            return AllItems(NUM_ITEMS + 1)
        return SampledNegatives(CandidateSampler.from_counts(np.ones(NUM_ITEMS + 1), "uniform", seed=3), 40)

    negatives = source().draw(tf.constant([1])).numpy()  # duplicates among the sampled ones
    task = RetrievalTask([source()], logq_correction=False, exclude_history=True)
    assert task._catalogue_softmax is catalogue  # the fused path and the generic one
    embed = lambda ids: tf.gather(tf.constant(table), ids)  # noqa: E731
    got, _ = task.per_example(tf.constant(outputs), tf.constant(targets), embed, tf.constant(items))
    at = list(zip(*np.nonzero(targets), strict=True))
    expected = [
        numpy_loss(outputs[b, t], table, int(targets[b, t]), negatives, h - {int(targets[b, t])})
        for (b, t), h in zip(at, numpy_histories(items, targets), strict=True)
    ]
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4)
    plain = RetrievalTask([source()], logq_correction=False).per_example(
        tf.constant(outputs), tf.constant(targets), embed
    )[0]
    assert np.all(plain.numpy() > got.numpy() - 1e-6) and not np.allclose(plain, got)  # fewer negatives


def test_without_items_the_task_refuses() -> None:
    task = RetrievalTask([AllItems(NUM_ITEMS + 1)], exclude_history=True)
    with pytest.raises(ValueError, match="exclude_history needs the input items"):
        task(tf.zeros((2, 1, DIM)), tf.constant([1, 2]), lambda ids: tf.zeros((tf.size(ids), DIM)))


def test_the_config_reaches_the_task() -> None:
    counts = np.ones(NUM_ITEMS + 1)
    config = apply_overrides(Config(), ["train.exclude_history=true"])
    assert build_training_task(config.train, counts, counts).exclude_history
    assert not build_training_task(Config().train, counts, counts).exclude_history  # off by default


@pytest.mark.parametrize("loss", ["sampled_softmax", "full_softmax"])
def test_a_run_trains_with_the_history_excluded(loss: str, synthetic_csv, tmp_path) -> None:
    from retrieval.training.run import train

    model = ["model.tower=sasrec", "model.dim=8", "model.max_len=6"]
    budget = ["train.num_negatives=5", "train.batch_size=32", "train.epochs=1", "train.length_buckets=true"]
    options = [f"train.loss={loss}", "train.exclude_history=true"]
    config = apply_overrides(Config(), [f"data.path={synthetic_csv}", *model, *budget, *options])
    metrics = train(config, tmp_path / "m", verbose=0)
    assert np.isfinite(metrics.train_loss_per_epoch).all()
    saved = Config.from_dict(json.loads((tmp_path / "m" / "config.json").read_text()))
    assert saved.train.exclude_history
