"""The training loop: budgets in steps or epochs, seeding, checkpoints and resume, early stopping,
schedules."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import retrieval.training.inputs
import retrieval.training.protocols
import retrieval.training.run
from retrieval.config import apply_overrides
from retrieval.training.batches import bucketed_order, epoch_batches
from retrieval.training.callbacks import (
    EarlyStopping,
    load_checkpoint,
    run_folder,
    save_checkpoint,
)
from retrieval.training.config import Config, ModelConfig, TrainConfig
from retrieval.training.losses.negatives import AllItems
from retrieval.training.losses.samplers import CandidateSampler
from retrieval.training.losses.task import SampledSoftmaxTask
from retrieval.training.model import build_model
from retrieval.training.optimizer import make_optimizer, make_schedule
from retrieval.training.schedules import Cooldown, WarmupDecay
from tests.helpers import crash_after_round, run_tool, tiered

TINY = ["model.tower=youtubednn", "model.dim=8", "model.max_len=6", "train.num_negatives=5"]
TINY += ["train.batch_size=32", "train.epochs=2"]
STEPS_PER_EPOCH = 16  # synthetic_csv under TINY: its "last" examples in batches of 32


def tiny_config(data: Path, *extra: str) -> Config:
    return apply_overrides(Config(), [f"data.path={data}", *TINY, *extra])


@pytest.fixture
def exported(monkeypatch) -> list[list[np.ndarray]]:
    """Replaces the artifact export (not under test here) by a record of the final weights."""
    weights: list[list[np.ndarray]] = []

    def record(model, *args: Any, **kwargs: Any) -> None:
        weights.append([np.array(w) for w in model.get_weights()])

    monkeypatch.setattr(retrieval.training.run, "save_model", record)
    return weights


@pytest.fixture(scope="module")
def full_run(synthetic_csv, tmp_path_factory) -> tuple[dict[str, Any], list[np.ndarray]]:
    """An uninterrupted 2-epoch run: its metrics and final weights."""
    weights: list[np.ndarray] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(retrieval.training.run, "save_model", lambda m, *a, **k: weights.extend(m.get_weights()))
        metrics = retrieval.training.run.train(
            tiny_config(synthetic_csv), tmp_path_factory.mktemp("full") / "m", verbose=0
        )
    return metrics, [np.array(w) for w in weights]


def test_same_seed_gives_the_same_loss_trajectory(synthetic_csv, tmp_path, exported, full_run) -> None:
    metrics, weights = full_run
    again = retrieval.training.run.train(tiny_config(synthetic_csv), tmp_path / "m", verbose=0)
    assert len(again.train_loss_per_epoch) == 2
    np.testing.assert_allclose(again.train_loss_per_epoch, metrics.train_loss_per_epoch, rtol=1e-6)
    for a, b in zip(exported[0], weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_resume_finishes_an_interrupted_run_like_an_uninterrupted_one(
    synthetic_csv, tmp_path, exported, full_run
) -> None:
    config, out = tiny_config(synthetic_csv), tmp_path / "m"
    with crash_after_round(0):
        retrieval.training.run.train(config, out, verbose=0)
    # A half-trained run is only a run folder, never an artifact.
    assert not out.exists()
    run = run_folder(out)
    assert json.loads((run / "checkpoint" / "manifest.json").read_text())["epoch"] == 1
    with pytest.raises(FileExistsError, match="--resume"):
        retrieval.training.run.train(config, out, verbose=0)
    with pytest.raises(ValueError, match=r"model.dim: 8 -> 16"):
        retrieval.training.run.train(apply_overrides(config, ["model.dim=16"]), out, verbose=0, resume=True)

    resumed = retrieval.training.run.train(config, out, verbose=0, resume=True)
    assert resumed.epochs_trained == 2
    assert [h["epoch"] for h in resumed.validation_per_epoch] == [1, 2]
    # Each epoch's training time survives the interruption; validation is not part of it.
    epoch_seconds = resumed.train_seconds_per_epoch
    assert len(epoch_seconds) == 2 and min(epoch_seconds) > 0
    assert sum(epoch_seconds) <= resumed.train_seconds
    metrics, weights = full_run
    np.testing.assert_allclose(resumed.train_loss_per_epoch, metrics.train_loss_per_epoch, rtol=1e-6)
    for a, b in zip(exported[-1], weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert not run.exists()  # done: the checkpoints are removed


def test_negatives_covering_the_catalogue_train_the_full_softmax() -> None:
    """Shared sampled negatives at least as many as the items are the full softmax (what they
    estimate, exactly); fewer, per-target ones or another loss are trained as configured."""
    counts = np.ones(11)  # 10 items and the padding row
    cases = [
        (10, 0, "sampled_softmax", "full_softmax"),
        (4096, 0, "sampled_softmax", "full_softmax"),
        (9, 0, "sampled_softmax", "sampled_softmax"),
        (10, 10, "sampled_softmax", "sampled_softmax"),
        (10, 0, "bce", "bce"),
    ]
    for negatives, per_target, loss, expected in cases:
        config = TrainConfig(loss=loss, num_negatives=negatives, negatives_per_positive=per_target)
        assert retrieval.training.run.trained_loss(config, len(counts)) == expected
        task = retrieval.training.run.build_training_task(config, counts, counts)
        assert isinstance(task.negatives[0], AllItems) == (expected == "full_softmax"), (negatives, loss)


def test_resume_without_a_run_is_an_error(synthetic_csv, tmp_path) -> None:
    with pytest.raises(ValueError, match="nothing to resume"):
        retrieval.training.run.train(tiny_config(synthetic_csv), tmp_path / "m", resume=True)


def test_early_stopping_exports_the_best_epoch_through_the_cli(synthetic_csv, tmp_path, monkeypatch) -> None:
    """Validation NDCG@10 is scripted 0.3, 0.5, 0.2, 0.1: with patience 2 the run stops after
    epoch 4 and exports epoch 2's weights, as a complete artifact (TensorBoard logs beside)."""
    scripted = iter([0.3, 0.5, 0.2, 0.1])
    tables: list[np.ndarray] = []

    def evaluate(artifact, *args: Any, **kwargs: Any) -> dict[str, float]:
        tables.append(np.array(artifact.item_embeddings))
        value = next(scripted, 0.0)  # the last call is the test evaluation
        return {"ndcg@10": value, "hr@10": value, "recall@50": value}

    monkeypatch.setattr(retrieval.training.protocols, "evaluate_ranking", evaluate)
    out, logs = tmp_path / "model", tmp_path / "tb"
    code = run_tool(
        "train", "--data", str(synthetic_csv), "--out", str(out), "--model", "youtubednn", "--dim", "8",
        "--max-len", "6", "--epochs", "8", "--batch-size", "32", "--negatives", "5", "--loss", "in_batch",
        "--set", "train.patience=2", "--tensorboard", str(logs), "--quiet",
    )  # fmt: skip
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["epochs_trained"], metrics["best_epoch"], metrics["stopped_early"]) == (4, 2, True)
    assert (metrics["best_step"], metrics["steps_trained"]) == (2 * STEPS_PER_EPOCH, 4 * STEPS_PER_EPOCH)
    assert metrics["validation"]["ndcg@10"] == 0.5 and metrics["loss"] == "in_batch"
    assert len(tables) == 5
    np.testing.assert_allclose(tables[-1], tables[1])  # tested with epoch 2's weights
    exported = np.load(out / "item_embeddings.npy")
    np.testing.assert_allclose(exported[1:], tables[1][1:], rtol=1e-6)
    assert json.loads((out / "config.json").read_text())["train"]["loss"] == "in_batch"
    assert not run_folder(out).exists()
    (events,) = logs.glob("events.out.tfevents*")
    scalars = {
        (v.tag, e.step): v.simple_value
        for e in tf.compat.v1.train.summary_iterator(str(events))
        for v in e.summary.value
    }
    assert scalars[("val_ndcg@10", 2)] == pytest.approx(0.5)
    assert {("loss", 4), ("learning_rate", 1)} <= set(scalars)


@pytest.mark.slow  # 7 s
def test_checkpoint_restores_weights_optimizer_and_random_state(tmp_path) -> None:
    """A sasrec model (dropout) and its task continue after a reload exactly as without it."""

    def fresh(seed: int) -> Any:
        keras.utils.set_random_seed(seed)
        model = build_model(ModelConfig(tower="sasrec", dim=8, max_len=5, dropout=0.5, num_blocks=1), 21)
        model.set_objective(None)
        model.task = SampledSoftmaxTask(CandidateSampler.from_counts(np.ones(21), "uniform", seed=seed), 5)
        model.compile(optimizer=make_optimizer(TrainConfig(), 1e-3), jit_compile=False)
        return model

    rng = np.random.default_rng(0)
    x = {"items": rng.integers(1, 21, (16, 5)).astype(np.int32)}
    y = rng.integers(1, 21, (16, 5)).astype(np.int32)
    a = fresh(0)
    a.optimizer.build(a.trainable_variables)  # as fit_under does: the step is traced once
    a.train_on_batch(x, y)
    save_checkpoint(tmp_path / "ckpt", a, a.task.variables, {"epoch": 1})
    b = fresh(1)  # other initial weights, seeds and sampler
    state, best = load_checkpoint(tmp_path / "ckpt", b, b.task.variables)
    assert state["epoch"] == 1 and best is None
    assert int(b.optimizer.iterations.numpy()) == 1
    np.testing.assert_array_equal(b.task.variables[0].numpy(), a.task.variables[0].numpy())
    b.task.negatives[0].sampler.seeds.seed = a.task.negatives[0].sampler.seeds.seed  # the config's seed
    assert float(a.train_on_batch(x, y)) == pytest.approx(float(b.train_on_batch(x, y)), rel=1e-6)
    for va, vb in zip(a.variables, b.variables, strict=True):
        np.testing.assert_allclose(np.asarray(va), np.asarray(vb), rtol=1e-6, atol=1e-8)
    # A model with other variables refuses the checkpoint.
    other = build_model(ModelConfig(tower="sasrec", dim=16, max_len=5, num_blocks=1), 21)
    other.compile(optimizer=keras.optimizers.Adam(), jit_compile=False)
    with pytest.raises(ValueError, match="different model"):
        load_checkpoint(tmp_path / "ckpt", other, a.task.variables)


def test_early_stopping_state_and_skipped_epochs() -> None:
    model = keras.Sequential([keras.layers.Dense(1)])
    model.build((None, 2))
    stop = EarlyStopping("val_ndcg@10", patience=2)
    stop.set_model(model)
    for epoch, value in enumerate([0.2, None, 0.4, 0.3, None, 0.1]):
        model.set_weights([np.full((2, 1), epoch, np.float32), np.zeros(1, np.float32)])
        stop.on_epoch_end(epoch, {} if value is None else {"val_ndcg@10": value})
    assert stop.get_state() == {"best": 0.4, "best_epoch": 3, "wait": 2, "stopped": True}
    assert model.stop_training
    stop.on_train_end()
    assert model.get_weights()[0][0, 0] == 2.0  # epoch index 2 = epoch 3's weights
    again = EarlyStopping(patience=2)
    again.set_state(stop.get_state())
    assert again.get_state() == stop.get_state()
    with pytest.raises(ValueError, match="patience"):
        EarlyStopping(patience=0)


@pytest.mark.parametrize(
    "kind, step, expected",
    [
        ("cosine", 0, 0.1),  # warm-up: (step + 1) / 10
        ("cosine", 4, 0.5),
        ("cosine", 10, 1.0),  # decay starts at the peak
        ("cosine", 60, 0.5),  # half-way through the decay: (1 + cos(pi / 2)) / 2
        ("cosine", 110, 0.0),
        ("linear", 35, 0.75),
        ("linear", 200, 0.0),
        ("constant", 80, 1.0),
    ],
)
def test_warmup_decay_schedule(kind: str, step: int, expected: float) -> None:
    schedule = WarmupDecay(1.0, total_steps=110, warmup_steps=10, kind=kind)
    assert float(schedule(step)) == pytest.approx(expected, abs=1e-6)


def test_warmup_decay_config_round_trip_and_errors() -> None:
    schedule = WarmupDecay(2e-3, 500, 20, "linear")
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert isinstance(again, WarmupDecay) and again.get_config() == schedule.get_config()
    assert float(again(300)) == pytest.approx(float(schedule(300)))
    with pytest.raises(ValueError, match="unknown learning-rate schedule"):
        WarmupDecay(1e-3, 100, 0, "step")


def test_optimizer_options() -> None:
    plain = make_optimizer(TrainConfig(), make_schedule(TrainConfig(learning_rate=0.01), 100))
    assert type(plain) is keras.optimizers.Adam and float(plain.learning_rate) == pytest.approx(0.01)
    config = TrainConfig(weight_decay=0.1, lr_schedule="cosine", warmup_steps=5)
    decayed = make_optimizer(config, make_schedule(config, 100))
    assert isinstance(decayed, keras.optimizers.AdamW) and decayed.weight_decay == pytest.approx(0.1)
    assert isinstance(decayed._learning_rate, WarmupDecay)
    # A warm-up takes at most a tenth of the run: 3 epochs of a tiny dataset still reach the peak.
    warm = TrainConfig(learning_rate=0.01, warmup_steps=200)
    assert make_schedule(warm, 20_000).warmup_steps == 200
    short = make_schedule(warm, 30)
    assert short.warmup_steps == 3 and float(short(3)) == pytest.approx(0.01)
    assert make_schedule(warm, 9) == pytest.approx(0.01)  # no warm-up left


def test_epoch_batches_are_seeded_per_epoch() -> None:
    x, y = {"items": np.arange(10, dtype=np.int32)[:, None]}, np.arange(10, dtype=np.int32)

    def epochs(first: int, last: int, seed: int = 3) -> list[list[int]]:
        flat = [i for _, b in epoch_batches(x, y, 4, seed, first, last) for i in b.numpy().tolist()]
        return [flat[i : i + 10] for i in range(0, len(flat), 10)]  # 10 examples per epoch

    full = epochs(0, 3)
    assert all(sorted(e) == list(range(10)) for e in full)  # every example once per epoch
    assert full[0] != full[1]  # reshuffled every epoch
    assert epochs(1, 3) == full[1:]  # a resumed run sees the same epochs
    assert epochs(0, 1, seed=4) != full[:1]
    assert tf.is_tensor(next(iter(epoch_batches(x, y, 4, 3, 0, 1)))[1])


def _left_padded(lengths: Sequence[int], width: int) -> np.ndarray:
    """Row i: ``lengths[i]`` item ids (1000 i + 1, ...) right-aligned in ``width`` columns."""
    out = np.zeros((len(lengths), width), np.int32)
    for i, n in enumerate(lengths):
        out[i, width - n :] = 1000 * i + 1 + np.arange(n)
    return out


@pytest.mark.parametrize("buckets", [False, True])
def test_batches_trim_padding_and_lose_nothing(buckets: bool) -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 41, size=300)
    x = {"items": _left_padded(lengths, 40), "action": _left_padded(lengths, 40) % 7}
    y = np.roll(x["items"], -1, axis=1)  # [N, L] targets, as all_positions has
    seen: dict[int, int] = {}
    for inputs, targets, *_ in epoch_batches(x, y, 16, 5, 0, 1, length_buckets=buckets):
        items, width = inputs["items"].numpy(), inputs["items"].shape[1]
        assert width % 8 == 0 or width == 40
        assert inputs["action"].shape[1] == width and targets.shape[1] == width
        for row, t, a in zip(items, targets.numpy(), inputs["action"].numpy(), strict=True):
            i = int(row[-1]) // 1000
            full = np.concatenate([np.zeros(40 - width, np.int32), row])  # padding back
            np.testing.assert_array_equal(full, x["items"][i])
            np.testing.assert_array_equal(np.concatenate([np.zeros(40 - width, np.int32), t]), y[i])
            np.testing.assert_array_equal(a, x["action"][i, 40 - width :])
            seen[i] = seen.get(i, 0) + 1
    assert seen == {i: 1 for i in range(300)}  # every example once


def test_length_buckets_group_similar_lengths_and_stay_seeded() -> None:
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 50, size=2000)
    x, y = {"items": _left_padded(lengths, 50)}, np.ones(2000, np.int32)  # "last": [N] targets

    def widths(seed: int, epoch: int, buckets: bool) -> list[int]:
        batches = epoch_batches(x, y, 32, seed, epoch, epoch + 1, length_buckets=buckets)
        return [int(b["items"].shape[1]) for b, _ in batches]

    bucketed, mixed = widths(3, 0, True), widths(3, 0, False)
    assert len(bucketed) == len(mixed) == 63
    assert sum(bucketed) < 0.75 * sum(mixed)  # far less padding computed
    assert widths(3, 0, True) == bucketed and widths(3, 1, True) != bucketed  # seeded per epoch
    assert sorted(bucketed) != bucketed  # batch order shuffled, not short to long


@pytest.fixture(scope="module")
def planted_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A planted order: 60 items on one cycle (a seeded permutation), 300 users each walking 5 to
    10 consecutive steps of it from a random start. The next item is the last one's successor,
    never in the history (the cycle is longer than any walk), and every item is about as
    popular as any other: a model that learns the order ranks the target first, popularity
    ranks it about at random (about 10 of the 50-odd items outside the history)."""
    rng = np.random.default_rng(0)
    cycle = rng.permutation(60)
    rows = ["user,item,timestamp"]
    for user in range(300):
        start = int(rng.integers(60))
        for step in range(int(rng.integers(5, 11))):
            rows.append(f"u{user},i{cycle[(start + step) % 60]},{1_000_000 + 1000 * user + step}")
    path = tmp_path_factory.mktemp("planted") / "log.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize(
    "tower", tiered(["sasrec", "bert4rec", "youtubednn"], slow={"bert4rec", "sasrec"})
)  # 2-6 s each
def test_every_objective_learns_a_planted_order_with_length_buckets(
    planted_csv, tmp_path, exported, tower: str
) -> None:
    """Eight epochs with length buckets beat popularity on the held-out (leave-one-out test)
    targets by a wide margin (here: HR@10 0.81 to 1.0 against 0.24, NDCG@10 0.49 to 0.90
    against 0.11); a tower, objective or bucketing that learned nothing would not."""
    config = tiny_config(
        planted_csv, f"model.tower={tower}", "model.num_blocks=1", "model.dropout=0",
        "train.learning_rate=0.01", "train.length_buckets=true", "train.epochs=8",
    )  # fmt: skip
    metrics = retrieval.training.run.train(config, tmp_path / "m", verbose=0)
    test, popularity = metrics.test, metrics.baseline_popularity_test
    assert popularity["hr@10"] < 0.35, popularity  # the planted data gives popularity no hold
    assert test["hr@10"] > popularity["hr@10"] + 0.4, (test, popularity)
    assert test["ndcg@10"] > 3 * popularity["ndcg@10"], (test, popularity)


def test_length_buckets_balance_targets_per_batch() -> None:
    """With [N, L] targets a bucketed batch holds about the epoch's mean targets per batch
    (its rows vary with the lengths), every batch is non-empty and there are ceil(N / B) of them."""
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 30, size=500)
    x = {"items": _left_padded(lengths, 30)}
    y = x["items"].copy()
    batches = list(epoch_batches(x, y, 50, 0, 0, 1, length_buckets=True))
    assert len(batches) == 10 and all(len(b) == 2 for b in batches)  # (x, y): no sample weight
    counts = np.array([np.count_nonzero(t.numpy()) for _, t in batches])
    rows = np.array([t.shape[0] for _, t in batches])
    assert counts.sum() == lengths.sum()
    mean = lengths.sum() / 10
    assert np.all(np.abs(counts - mean) <= 29)  # within one history of the mean
    assert rows.min() >= 1 and rows.max() > 2 * rows.min()  # short histories come many to a batch
    # One target per example: batch_size rows each (the last one the rest).
    last = [t.shape[0] for _, t in epoch_batches(x, y[:, -1], 50, 0, 0, 1, length_buckets=True)]
    assert last == [50] * 10


def test_bucketed_order_never_leaves_a_batch_empty() -> None:
    """Histories far longer than a batch's share of targets still give ceil(N / B) non-empty batches."""
    lengths = np.array([1] * 20 + [500] * 3)
    order = np.random.default_rng(0).permutation(len(lengths))
    rows, splits = bucketed_order(order, lengths, lengths, 4, 0, 0)
    assert sorted(rows.tolist()) == list(range(len(lengths)))
    assert len(splits) == 7 and np.all(np.diff(splits) >= 1)


@pytest.mark.parametrize(("tower", "objective"), [("sasrec", "all_positions"), ("youtubednn", "last")])
def test_a_trimmed_batch_has_the_loss_of_the_padded_one(tower: str, objective: str) -> None:
    from retrieval.training.losses.task import build_task

    keras.utils.set_random_seed(0)
    model = build_model(ModelConfig(tower=tower, dim=8, max_len=24), 60)
    model.set_objective(objective)
    model.task = build_task(
        "full_softmax",
        sampler=CandidateSampler.from_counts(np.ones(60)),
        num_negatives=5,
        target_probabilities=np.full(60, 1 / 60),
    )
    lengths = [3, 5, 2, 7]
    items = _left_padded(lengths, 24) % 59 + (_left_padded(lengths, 24) > 0)  # ids 1..59, 0 = padding
    x = {"items": items}
    y = np.roll(items, -1, axis=1) if objective == "all_positions" else items[:, -1].copy()
    (trimmed, trimmed_y), *_ = list(epoch_batches(x, y, 4, 0, 0, 1))
    assert trimmed["items"].shape[1] == 8  # 7 events, rounded up to 8 columns

    def loss(inputs: dict[str, Any], targets: Any) -> float:
        outputs = (
            model.user_tower.sequence_output(inputs, training=False)
            if objective == "all_positions"
            else model.user_tower(inputs, training=False)
        )
        return float(model.compute_loss(inputs, targets, outputs))

    # The loss is a mean over the batch's targets: the (shuffled) row order does not matter.
    assert loss(trimmed, trimmed_y) == pytest.approx(loss(x, y), rel=1e-5)


@pytest.fixture(scope="module")
def comirec_run(synthetic_csv, tmp_path_factory) -> tuple[Config, retrieval.training.run.TrainResult, Path]:
    """A 1-epoch run under the ComiRec protocol: its config, metrics and artifact folder."""
    config = tiny_config(synthetic_csv, "data.protocol=comirec", "train.epochs=1")
    out = tmp_path_factory.mktemp("comirec") / "m"
    return config, retrieval.training.run.train(config, out, verbose=0), out


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_comirec_protocol_trains_on_training_users_only(synthetic_csv, tmp_path, comirec_run) -> None:
    from retrieval.data.interactions import build_sequences
    from retrieval.data.loaders import load_interactions
    from retrieval.data.splits import comirec_split

    _, metrics, _ = comirec_run
    parts = comirec_split(build_sequences(load_interactions(synthetic_csv)).sequences, seed=42)
    # Objective "last": one example per event after a user's first, training users only.
    assert metrics.train_examples == sum(len(s) - 1 for s in parts.train)
    assert metrics.protocol == "comirec"
    assert {"recall@50", "hitrate@50", "ndcg@20"} <= set(metrics.test)
    assert {"recall@50", "hitrate@50"} <= set(metrics.baseline_popularity_test)
    assert metrics.validation["epoch"] == 1 and "recall@50" in metrics.validation
    with pytest.raises(ValueError, match="unknown protocol"):
        retrieval.training.run.train(
            tiny_config(synthetic_csv, "data.protocol=nope"), tmp_path / "x", verbose=0
        )


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_per_user_test_metrics_average_to_the_runs_own(comirec_run) -> None:
    from retrieval.artifacts.model import load_model
    from retrieval.training.inputs import InMemoryData

    config, metrics, out = comirec_run
    data = InMemoryData(config)
    per_user = data.user_metrics(load_model(out), "test")
    assert {len(v) for v in per_user.values()} == {len(data.rules.split.test_targets)}
    assert set(per_user) == set(metrics.test) - {"diversity@20", "diversity@50"}
    for name, values in per_user.items():
        assert values.mean() == pytest.approx(metrics.test[name], abs=1e-9), name


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_loo_refit_trains_on_validation_events_and_tests_like_loo(
    synthetic_csv, tmp_path, exported, full_run
) -> None:
    from retrieval.data.interactions import build_sequences
    from retrieval.data.loaders import load_interactions

    sequences = build_sequences(load_interactions(synthetic_csv)).sequences
    loo, _ = full_run  # the same data and model under leave-one-out
    config = tiny_config(synthetic_csv, "data.protocol=loo-refit", "train.epochs=1")
    refit = retrieval.training.run.train(config, tmp_path / "b", verbose=0)
    # Objective "last": one example per training event after a user's first; refit has one more
    # per evaluated user (its validation event), no validation, and the same test users.
    evaluated = sum(len(s) >= 3 for s in sequences)
    assert refit.train_examples == loo.train_examples + evaluated
    assert refit.validation_per_epoch == [] and refit.validation == {}
    assert refit.baseline_popularity_test.keys() == loo.baseline_popularity_test.keys()
    assert set(refit.test) == set(loo.test)
    # Nothing to validate: patience has nothing to stop on, the budget is fixed (here a loo run's best).
    steps = loo.best_step
    assert steps is not None and steps > 0
    config = apply_overrides(config, ["train.epochs=none", f"train.max_steps={steps}", "train.patience=3"])
    fixed = retrieval.training.run.train(config, tmp_path / "c", verbose=0)
    assert (fixed.steps_trained, fixed.best_step, fixed.stopped_early) == (steps, None, False)


@pytest.mark.slow  # two bert4rec runs: 7 s
def test_bert4rec_masks_are_seeded(synthetic_csv, tmp_path, exported) -> None:
    config = tiny_config(synthetic_csv, "model.tower=bert4rec", "model.num_blocks=1", "train.epochs=1")
    runs = [retrieval.training.run.train(config, tmp_path / f"m{i}", verbose=0) for i in range(2)]
    np.testing.assert_allclose(runs[0].train_loss_per_epoch, runs[1].train_loss_per_epoch, rtol=1e-6)
    for a, b in zip(exported[0], exported[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_budget_in_steps_or_epochs() -> None:
    """Hand-worked: 88 steps per epoch (Beauty under beauty-sasrec)."""
    steps = TrainConfig(max_steps=3500, eval_every_steps=250).budget(88)
    assert (steps.round_steps, steps.rounds, steps.validate_every, steps.schedule_steps) == (250, 14, 1, 3500)
    assert steps.steps == 3500
    odd = TrainConfig(max_steps=1000, eval_every_steps=300).budget(4)  # rounded up to whole validations
    assert (odd.rounds, odd.steps, odd.schedule_steps) == (4, 1200, 1000)
    short = TrainConfig(max_steps=50).budget(4)  # a cap below the validation interval validates once
    assert (short.round_steps, short.rounds) == (50, 1)
    # An epoch longer than the interval is one round (ComiRec-SA on Beauty: 553 steps), up to 10x it.
    assert TrainConfig().budget(553).round_steps == 553
    assert TrainConfig().budget(7820).round_steps == 2000
    assert TrainConfig(max_steps=300).budget(553).round_steps == 300
    epochs = TrainConfig(epochs=39, eval_every=3, max_steps=10).budget(88)  # max_steps unused
    assert (epochs.round_steps, epochs.rounds, epochs.validate_every, epochs.schedule_steps) == (
        88,
        39,
        3,
        3432,
    )


@pytest.mark.parametrize(
    "override",
    ["max_steps=0", "eval_every_steps=0", "eval_every=0", "epochs=0", "patience=-1", "warmup_steps=-1"],
)
def test_budget_fields_are_checked(override: str) -> None:
    with pytest.raises(ValueError, match=f"train.{override}"):
        apply_overrides(Config(), [f"train.{override}"])


def test_a_config_from_before_the_step_budget_runs_in_epochs() -> None:
    """An old ``config.json`` holds ``epochs``, ``eval_every`` and ``patience`` and no step fields."""
    old = Config.from_dict({"train": {"epochs": 20, "eval_every": 1, "patience": 0, "lr_schedule": "cosine"}})
    assert old.train.budget(7) == TrainConfig(epochs=20).budget(7)
    assert (old.train.budget(7).steps, old.train.budget(7).schedule_steps) == (140, 140)


def test_a_small_dataset_trains_until_validation_stops_improving(
    synthetic_csv, tmp_path, exported, monkeypatch
) -> None:
    """The step budget: on 60 users a fixed 2-epoch run (32 steps) stops while validation still
    rises; the default budget kind (steps, patience) trains on, stops by patience well before its
    cap, and exports the best validation's weights."""
    tables: list[np.ndarray] = []
    evaluate = retrieval.training.protocols.evaluate_ranking

    def record(artifact, *args: Any, **kwargs: Any) -> dict[str, float]:
        tables.append(np.array(artifact.item_embeddings))
        return evaluate(artifact, *args, **kwargs)

    monkeypatch.setattr(retrieval.training.protocols, "evaluate_ranking", record)
    budget = ["train.epochs=none", "train.max_steps=2000", "train.eval_every_steps=20", "train.patience=3"]
    config = tiny_config(synthetic_csv, "train.learning_rate=0.01", *budget)
    metrics = retrieval.training.run.train(config, tmp_path / "m", verbose=0)
    history = [h["ndcg@10"] for h in metrics.validation_per_epoch]
    best = int(np.argmax(history))  # the first best: a tie does not reset patience
    assert metrics.steps_per_epoch == STEPS_PER_EPOCH
    assert metrics.stopped_early and metrics.steps_trained < 2000
    assert metrics.steps_trained > 2 * STEPS_PER_EPOCH  # past the fixed run
    assert max(history[:3]) < history[best]  # which had not reached the best validation
    assert metrics.best_step == 20 * (best + 1) and metrics.best_epoch == best + 1
    assert metrics.steps_trained == metrics.best_step + 3 * 20  # patience: 3 validations
    assert [h["step"] for h in metrics.validation_per_epoch] == list(range(20, metrics.steps_trained + 1, 20))
    assert metrics.validation["ndcg@10"] == history[best]
    assert metrics.epochs_trained == metrics.steps_trained // STEPS_PER_EPOCH
    # Exported (and tested) with the best validation's weights, not the last.
    np.testing.assert_allclose(tables[-1], tables[best])
    assert not np.allclose(tables[-2], tables[best])


def test_the_plateau_schedule_decays_only_once_told() -> None:
    schedule = WarmupDecay(1.0, total_steps=1000, warmup_steps=10, kind="plateau")
    assert [float(schedule(s)) for s in (0, 9, 10, 999, 5000)] == pytest.approx([0.1, 1.0, 1.0, 1.0, 1.0])
    schedule.decay_from(400, 100)
    assert [float(schedule(s)) for s in (399, 400, 425, 500, 600)] == pytest.approx(
        [1.0, 1.0, 0.75, 0.0, 0.0]
    )
    cooldown = Cooldown(schedule, 0.25, total_steps=1000, round_steps=30)
    assert cooldown.begin(400) and (cooldown.start, cooldown.steps) == (400, 120)  # 100 steps: 4 rounds
    assert not cooldown.begin(500) and cooldown.start == 400
    late = Cooldown(WarmupDecay(1.0, 1000, kind="plateau"), 0.25, total_steps=1000, round_steps=30)
    assert late.begin(960) and late.steps == 40  # the decay ends with the budget
    with pytest.raises(ValueError, match="in \\(0, 1\\)"):
        apply_overrides(Config(), ["train.cooldown_fraction=1"])


def test_the_plateau_schedule_decays_from_the_best_weights_when_validation_stalls(
    synthetic_csv, tmp_path, exported, monkeypatch
) -> None:
    """Constant until patience runs out, then from the best validation's weights a linear decay
    over half the steps so far; the run ends when the rate reaches 0 and exports the best."""
    began: list[tuple[int, bool]] = []
    original = EarlyStopping.on_epoch_end

    def check(self: EarlyStopping, epoch: int, logs: dict[str, Any] | None = None) -> None:
        original(self, epoch, logs)
        if self.cooldown.start is not None and not began:
            same = all(
                np.array_equal(a, b) for a, b in zip(self.model.get_weights(), self.best_weights, strict=True)
            )
            began.append((int(self.model.optimizer.iterations), same))

    monkeypatch.setattr(EarlyStopping, "on_epoch_end", check)
    budget = ["train.epochs=none", "train.max_steps=4000", "train.eval_every_steps=20", "train.patience=3"]
    plateau = ["train.lr_schedule=plateau", "train.cooldown_fraction=0.5", "train.learning_rate=0.01"]
    metrics = retrieval.training.run.train(
        tiny_config(synthetic_csv, *budget, *plateau), tmp_path / "m", verbose=0
    )
    history = [h["ndcg@10"] for h in metrics.validation_per_epoch]
    first_best = int(np.argmax(history[: began[0][0] // 20]))
    assert began == [(20 * (first_best + 1 + 3), True)]  # patience ran out: restored, decaying
    start = began[0][0]
    assert metrics.steps_trained == start + 20 * -(-start // 40) < 4000  # half the steps, whole rounds
    assert not metrics.stopped_early  # the decay ran to its end
    assert metrics.best_step == 20 * (int(np.argmax(history)) + 1)


PLATEAU_WITHOUT_VALIDATION = [
    *["train.epochs=none", "train.max_steps=100", "train.eval_every_steps=20", "train.patience=0"],
    *["train.lr_schedule=plateau", "train.cooldown_fraction=0.2", "train.learning_rate=0.01"],
]


@pytest.fixture(scope="module")
def plateau_run(
    synthetic_csv, tmp_path_factory
) -> tuple[retrieval.training.run.TrainResult, list[np.ndarray], list[dict[str, Any]]]:
    """An uninterrupted :data:`PLATEAU_WITHOUT_VALIDATION` run: its metrics, final weights and the
    cooldown's state after each of its 5 rounds."""
    states: list[dict[str, Any]] = []
    weights: list[np.ndarray] = []
    with pytest.MonkeyPatch.context() as mp:
        original = Cooldown.on_epoch_end
        mp.setattr(
            Cooldown,
            "on_epoch_end",
            lambda self, e, logs=None: (original(self, e, logs), states.append(self.get_state())),
        )
        mp.setattr(retrieval.training.run, "save_model", lambda m, *a, **k: weights.extend(m.get_weights()))
        metrics = retrieval.training.run.train(
            tiny_config(synthetic_csv, *PLATEAU_WITHOUT_VALIDATION),
            tmp_path_factory.mktemp("plateau") / "m",
            verbose=0,
        )
    return metrics, [np.array(w) for w in weights], states


def test_without_validation_the_plateau_schedule_decays_over_the_budget_s_end(plateau_run) -> None:
    metrics, _, states = plateau_run
    assert metrics.steps_trained == 100
    assert states == [{"start": None, "steps": 0}] * 3 + [{"start": 80, "steps": 20}] * 2


def test_a_run_resumed_in_its_decay_continues_the_same_decay(
    synthetic_csv, tmp_path, exported, plateau_run
) -> None:
    """The plateau decay began at step 80 of 100; a crash right after that round's checkpoint
    resumes into the decay (at the peak rate the last round's weights would differ)."""
    config = tiny_config(synthetic_csv, *PLATEAU_WITHOUT_VALIDATION)
    full, weights, _ = plateau_run
    with crash_after_round(3):
        retrieval.training.run.train(config, tmp_path / "m", verbose=0)
    state = json.loads((run_folder(tmp_path / "m") / "checkpoint" / "state.json").read_text())
    assert state["cooldown"] == {"start": 80, "steps": 20}
    resumed = retrieval.training.run.train(config, tmp_path / "m", verbose=0, resume=True)
    assert resumed.steps_trained == full.steps_trained == 100
    np.testing.assert_allclose(resumed.train_loss_per_epoch, full.train_loss_per_epoch, rtol=1e-6)
    for a, b in zip(exported[-1], weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_a_round_that_ends_mid_epoch_resumes_like_an_uninterrupted_run(
    synthetic_csv, tmp_path, exported
) -> None:
    """Rounds of 24 steps end inside epochs of 16: the resumed run reads the data (and
    bert4rec-style per-step seeds) from the step it stopped at."""
    budget = ["train.epochs=none", "train.max_steps=72", "train.eval_every_steps=24", "train.patience=0"]
    config = tiny_config(synthetic_csv, "train.lr_schedule=linear", *budget)
    full = retrieval.training.run.train(config, tmp_path / "full", verbose=0)
    assert (full.steps_trained, len(full.train_loss_per_epoch)) == (72, 3)
    with crash_after_round(1):
        retrieval.training.run.train(config, tmp_path / "m", verbose=0)
    resumed = retrieval.training.run.train(config, tmp_path / "m", verbose=0, resume=True)
    assert [h["step"] for h in resumed.validation_per_epoch] == [24, 48, 72]
    np.testing.assert_allclose(resumed.train_loss_per_epoch, full.train_loss_per_epoch, rtol=1e-6)
    for a, b in zip(exported[-1], exported[0], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
