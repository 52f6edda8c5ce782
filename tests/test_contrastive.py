"""DuoRec's contrastive regulariser: NT-Xent against numpy, its wiring into the loss, its config."""

from __future__ import annotations

from types import SimpleNamespace

import keras
import numpy as np
import pytest
import tensorflow as tf

from retrieval.config import apply_overrides
from retrieval.training.config import Config, ModelConfig, TrainConfig
from retrieval.training.losses.contrastive import nt_xent, sequence_views
from retrieval.training.losses.samplers import CandidateSampler
from retrieval.training.losses.task import build_task
from retrieval.training.model import TwoTowerModel, build_model
from retrieval.training.run import build_training_task, train

NUM_ITEMS, DIM, LEN = 30, 16, 5


def numpy_nt_xent(
    first: np.ndarray, second: np.ndarray, targets: np.ndarray, temperature: float
) -> np.ndarray:
    """Per view, one at a time: -log softmax of its twin among the twin and the kept negatives."""
    views, t = np.concatenate([first, second]), np.concatenate([targets, targets])
    n = len(views)
    out = []
    for i in range(n):
        twin = (i + n // 2) % n
        logits = views @ views[i] / temperature
        kept = [j for j in range(n) if j != i and (j == twin or t[i] == 0 or t[j] != t[i])]
        top = logits[kept].max()
        out.append(top + np.log(np.exp(logits[kept] - top).sum()) - logits[twin])
    return np.array(out)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_nt_xent_matches_numpy_with_same_target_views_left_out(temperature: float) -> None:
    rng = np.random.default_rng(0)
    first, second = rng.normal(size=(2, 6, DIM)).astype(np.float32) / 2
    targets = np.array([3, 5, 3, 0, 0, 7])  # rows 0 and 2 share a target; 0 (none) masks nothing
    got = nt_xent(tf.constant(first), tf.constant(second), tf.constant(targets), temperature).numpy()
    np.testing.assert_allclose(got, numpy_nt_xent(first, second, targets, temperature), rtol=1e-5)
    distinct = nt_xent(tf.constant(first), tf.constant(second), tf.constant([1, 2, 3, 4, 5, 6]), temperature)
    assert not np.allclose(got, distinct.numpy())  # the masking matters
    # One sequence: its twin is its only candidate, so the loss is -log 1 = 0.
    np.testing.assert_allclose(
        nt_xent(first[:1], second[:1], tf.constant([3])).numpy(), [0.0, 0.0], atol=1e-6
    )


def test_sequence_views_take_the_newest_position_or_the_mean_interest() -> None:
    rng = np.random.default_rng(1)
    positions = rng.normal(size=(2, LEN, 4)).astype(np.float32)
    views, targets = sequence_views(tf.constant(positions), tf.constant([[0, 1, 2, 3, 4], [0, 0, 0, 5, 6]]))
    np.testing.assert_array_equal(views.numpy(), positions[:, -1])
    np.testing.assert_array_equal(targets.numpy(), [4, 6])
    interests = rng.normal(size=(2, 3, 4)).astype(np.float32)
    views, targets = sequence_views(tf.constant(interests), tf.constant([7, 8]))
    np.testing.assert_allclose(views.numpy(), interests.mean(axis=1), rtol=1e-6)
    np.testing.assert_array_equal(targets.numpy(), [7, 8])


def tiny_batch(seed: int, rows: int = 16) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Left-padded inputs ``[rows, LEN]``, their every-position targets ``[rows, LEN]`` and
    last-position targets ``[rows]``."""
    rng = np.random.default_rng(seed)
    events = rng.integers(1, NUM_ITEMS + 1, size=(rows, LEN + 1)).astype(np.int32)
    padding = np.arange(LEN)[None, :] < rng.integers(0, LEN - 1, rows)[:, None]  # a few leading columns
    x, y = np.where(padding, 0, events[:, :-1]), np.where(padding, 0, events[:, 1:])
    return {"items": x}, y, y[:, -1].copy()


def tiny_model(tower: str, weight: float, temperature: float = 1.0, dropout: float = 0.0) -> TwoTowerModel:
    """A tower over ``NUM_ITEMS`` items trained by the full softmax (no random negatives)."""
    keras.utils.set_random_seed(0)
    model = build_model(ModelConfig(tower=tower, dim=DIM, max_len=LEN, dropout=dropout), NUM_ITEMS + 1)
    counts = np.ones(NUM_ITEMS + 1)
    model.task = build_task(
        "full_softmax",
        sampler=CandidateSampler.from_counts(counts, "uniform"),
        num_negatives=5,
        target_probabilities=counts / counts.sum(),
        contrastive_weight=weight,
        contrastive_temperature=temperature,
    )
    return model


@pytest.mark.parametrize(
    "tower, objective", [("sasrec", "all_positions"), ("sasrec", "last"), ("sa", "last")]
)
def test_the_loss_adds_the_weighted_term_between_two_passes(tower: str, objective: str) -> None:
    """Without dropout both passes give the same views: the term is the numpy NT-Xent of ``(v, v)``."""
    x, y_all, y_last = tiny_batch(2)
    y = tf.constant(y_all if objective == "all_positions" else y_last)
    model = tiny_model(tower, weight=0.5, temperature=0.5)
    model.set_objective(objective)
    embedding = model.item_tower.embedding.embeddings
    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)  # [B, L, d] or [B, K, d]
        main = model.task(y_pred, y, lambda ids: model.item_tower.candidates(ids, training=True))
        total = model.compute_loss(x, y, y_pred, training=True)
        term = total - main
    views = y_pred.numpy()[:, -1] if objective == "all_positions" else y_pred.numpy().mean(axis=1)
    expected = 0.5 * numpy_nt_xent(views, views, y_last, 0.5).mean()
    assert float(term) == pytest.approx(expected, rel=1e-4)
    gradient = tf.convert_to_tensor(tape.gradient(term, embedding)).numpy()
    assert np.isfinite(gradient).all() and np.abs(gradient[np.unique(x["items"][x["items"] > 0])]).sum() > 0
    assert float(model.compute_loss(x, y, y_pred, training=False)) == float(main)  # training only


def test_weight_zero_gives_exactly_the_main_loss() -> None:
    x, y, _ = tiny_batch(3)
    model = tiny_model("sasrec", weight=0.0, dropout=0.2)
    y_pred = model(x, training=True)
    main = model.task(y_pred, tf.constant(y), lambda ids: model.item_tower.candidates(ids, training=True))
    assert float(model.compute_loss(x, tf.constant(y), y_pred, training=True)) == float(main)


def test_dropout_makes_the_second_view_another_one() -> None:
    """With dropout the second pass differs from the first: the term is not that of ``(v, v)``."""
    x, y, y_last = tiny_batch(4)
    model = tiny_model("sasrec", weight=1.0, dropout=0.3)
    y_pred = model(x, training=True)
    main = model.task(y_pred, tf.constant(y), lambda ids: model.item_tower.candidates(ids, training=True))
    term = float(model.compute_loss(x, tf.constant(y), y_pred, training=True) - main)
    views = y_pred.numpy()[:, -1]
    assert np.isfinite(term) and term != pytest.approx(
        numpy_nt_xent(views, views, y_last, 1.0).mean(), rel=1e-3
    )


def test_fit_trains_with_the_regulariser() -> None:
    """Keras' compiled train step runs the second pass and updates the item table."""
    x, y, _ = tiny_batch(5, rows=32)
    model = tiny_model("sasrec", weight=0.5, dropout=0.3)
    model.compile(optimizer=keras.optimizers.Adam(0.01), jit_compile=False)
    before = model.item_tower.embedding.embeddings.numpy().copy()
    history = model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0).history["loss"]
    assert np.isfinite(history).all()
    assert not np.allclose(model.item_tower.embedding.embeddings.numpy(), before)


def test_the_config_reaches_the_task_and_is_checked() -> None:
    config = apply_overrides(Config(), ["train.contrastive_weight=0.1", "train.contrastive_temperature=0.5"])
    counts = np.ones(NUM_ITEMS + 1)
    task = build_training_task(config.train, counts, counts)
    assert (task.contrastive_weight, task.contrastive_temperature) == (0.1, 0.5)
    assert build_training_task(TrainConfig(), counts, counts).contrastive_weight == 0.0  # off by default
    for bad, message in (
        ("train.contrastive_weight=-0.1", r"train.contrastive_weight=-0.1: must be >= 0"),
        ("train.contrastive_temperature=0", r"train.contrastive_temperature=0.0: must be > 0"),
        ("train.contrastive_temperature=-1", r"train.contrastive_temperature=-1.0: must be > 0"),
    ):
        with pytest.raises(ValueError, match=message):
            apply_overrides(Config(), [bad])
    with pytest.raises(ValueError, match="contrastive_temperature > 0"):
        build_task(
            "in_batch",
            sampler=CandidateSampler.from_counts(counts, "uniform"),
            num_negatives=5,
            target_probabilities=counts / counts.sum(),
            contrastive_temperature=0.0,
        )


def test_several_replicas_are_refused(tmp_path) -> None:
    config = apply_overrides(Config(), ["data.path=log.csv", "train.contrastive_weight=0.1"])
    two = SimpleNamespace(num_replicas_in_sync=2)  # refused before the strategy is used
    with pytest.raises(ValueError, match="contrastive_weight is not supported with several replicas"):
        train(config, tmp_path / "model", strategy=two)
