"""Training: data -> leave-one-out split -> training with a named loss -> model artifact."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from retrieval.artifacts import write_artifact
from retrieval.callbacks import (
    EarlyStopping,
    EpochCheckpoint,
    TensorBoardLogger,
    WarmupDecay,
    load_checkpoint,
    run_folder,
)
from retrieval.config import Config, DataConfig, TrainConfig
from retrieval.data import LeaveOneOut, SequenceData, build_sequences, leave_one_out, load_interactions
from retrieval.evaluate import category_codes, evaluate_comirec, evaluate_ranking, popularity_top_k
from retrieval.examples import make_examples, mask_items
from retrieval.features import (
    SideVocab,
    attribute_table,
    build_side_vocab,
    history_features,
    parse_side_features,
    user_event_features,
)
from retrieval.losses import CandidateSampler, RetrievalTask, build_task
from retrieval.metrics import comirec_metrics, ranking_metrics
from retrieval.model import TwoTowerModel, build_model, export_user_tower
from retrieval.model_artifact import KIND, SIDE_FILE, Features, ModelArtifact
from retrieval.protocols import ComirecSplit, comirec_split
from retrieval.vocab import ItemVocab

log = logging.getLogger(__name__)


def live_artifact(model: TwoTowerModel, vocab: ItemVocab, max_len: int, side: SideVocab) -> ModelArtifact:
    """A :class:`ModelArtifact` view of a model in memory, for evaluation during training."""
    predict = tf.function(lambda inputs: model(inputs, training=False), reduce_retracing=True)
    table = np.array(model.item_tower.all_items())
    manifest = {"version": "training", "max_len": max_len, "num_interests": model.user_tower.num_interests}

    def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:
        return predict({k: tf.constant(v, tf.int32) for k, v in inputs.items()}).numpy()

    return ModelArtifact(None, manifest, vocab, table, user_vectors, side)


@dataclass(frozen=True)
class Protocol:
    """How a run splits its data and scores itself (``DataConfig.protocol``).

    Attributes:
        name: ``"loo-full"`` or ``"comirec"`` (as in ``tools/evaluate.py --protocol``).
        split: the split (training sequences, validation and test histories and targets).
        train_users: the users whose ``split.train`` sequences train the model.
        evaluate: ``(model, histories, targets, features) -> metrics``.
        baseline: ``(top-k of the most popular items, targets) -> metrics``.
        shown: validation metrics shown per epoch; the first is the early-stopping monitor.
    """

    name: str
    split: LeaveOneOut | ComirecSplit
    train_users: Sequence[int] | np.ndarray
    evaluate: Callable[[ModelArtifact, Sequence[np.ndarray], Any, Features | None], dict[str, float]]
    baseline: Callable[[np.ndarray, Any], dict[str, float]]
    shown: tuple[str, ...]


def make_protocol(config: DataConfig, data: SequenceData) -> Protocol:
    """The split and scoring of ``config.protocol``.

    Raises:
        ValueError: an unknown protocol.
    """
    if config.protocol == "loo":
        return Protocol(
            "loo-full",
            leave_one_out(data),
            range(len(data.users)),
            lambda model, histories, targets, features: evaluate_ranking(
                model, histories, targets, features=features
            ),
            ranking_metrics,
            ("ndcg@10", "hr@10", "recall@50"),
        )
    if config.protocol == "comirec":
        parts = comirec_split(data.sequences, seed=config.split_seed)
        first = {i: str(a[0]) for i, a in (data.item_attributes or {}).items() if len(a)}
        categories = category_codes(first, data.vocab.num_embeddings) if first else None
        return Protocol(
            "comirec",
            parts,
            parts.train_users,
            lambda model, histories, targets, features: evaluate_comirec(
                model, histories, targets, features, categories=categories
            ),
            comirec_metrics,
            ("recall@50", "hitrate@50", "recall@20"),
        )
    raise ValueError(f"unknown protocol {config.protocol!r}; choose loo or comirec")


class FullRankingValidation(keras.callbacks.Callback):
    """Computes full-ranking validation metrics after every ``every`` epochs.

    The protocol's shown metrics (e.g. ``val_ndcg@10``) go into the epoch logs (and so the
    progress bar and any later callback); the full set per epoch is kept in ``history``.
    """

    def __init__(
        self,
        protocol: Protocol,
        vocab: ItemVocab,
        max_len: int,
        side: SideVocab,
        features: Features | None,
        every: int = 1,
    ) -> None:
        super().__init__()
        self.protocol, self.vocab, self.max_len, self.every = protocol, vocab, max_len, every
        self.side, self.features = side, features
        self.history: list[dict[str, float]] = []

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        split = self.protocol.split
        if (epoch + 1) % self.every or not len(split.valid_targets):
            return
        assert isinstance(self.model, TwoTowerModel)
        artifact = live_artifact(self.model, self.vocab, self.max_len, self.side)
        metrics = self.protocol.evaluate(artifact, split.valid_histories, split.valid_targets, self.features)
        self.history.append({"epoch": epoch + 1, **metrics})
        if logs is not None:  # shown on the progress bar; every metric goes to metrics.json
            logs.update({f"val_{k}": metrics[k] for k in self.protocol.shown})


def item_counts(sequences: Sequence[np.ndarray], num_embeddings: int) -> np.ndarray:
    """Occurrences of each dense id in ``sequences``, int64 ``[num_embeddings]``."""
    flat = np.concatenate(sequences) if len(sequences) else np.zeros(0, np.int64)
    return np.bincount(flat, minlength=num_embeddings)


def target_probabilities(targets: np.ndarray, num_embeddings: int) -> np.ndarray:
    """How often each dense id is a training target (0 = no target is not counted), ``[num_embeddings]``."""
    flat = np.asarray(targets).ravel()
    counts = np.bincount(flat[flat > 0], minlength=num_embeddings).astype(np.float64)
    return counts / max(counts.sum(), 1.0)


def build_training_task(config: TrainConfig, counts: np.ndarray, targets: np.ndarray) -> RetrievalTask:
    """The task ``config.loss`` names, its sampler over ``counts`` (training events per item) and
    its in-batch correction from ``targets`` (the training examples' target ids)."""
    sampler = CandidateSampler.from_counts(counts, config.sampler, config.sampler_alpha, seed=config.seed)
    return build_task(
        config.loss,
        sampler=sampler,
        num_negatives=config.num_negatives,
        target_probabilities=target_probabilities(targets, len(counts)),
        negatives_per_positive=config.negatives_per_positive,
        # [B, L] targets would make an [M, M] in-batch softmax: at most batch_size candidates.
        in_batch_candidates=config.batch_size,
        gbce_t=config.gbce_t,
        temperature=config.temperature,
        remove_accidental_hits=config.remove_accidental_hits,
        logq_correction=config.logq_correction,
        interest_selection=config.interest_selection,
        label_aware_power=config.label_aware_power,
    )


def make_optimizer(config: TrainConfig, total_steps: int) -> keras.optimizers.Optimizer:
    """Adam (AdamW when ``weight_decay`` > 0, biases and normalisation scales not decayed) with
    the configured warm-up and decay over ``total_steps``."""
    if config.lr_schedule == "constant" and config.warmup_steps == 0:
        rate: float | WarmupDecay = config.learning_rate
    else:
        rate = WarmupDecay(config.learning_rate, total_steps, config.warmup_steps, config.lr_schedule)
    if config.weight_decay <= 0:
        return keras.optimizers.Adam(rate)
    optimizer = keras.optimizers.AdamW(rate, weight_decay=config.weight_decay)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return optimizer


def epoch_batches(
    x: dict[str, np.ndarray], y: np.ndarray, batch_size: int, seed: int, first_epoch: int, epochs: int
) -> tf.data.Dataset:
    """Batches for epochs ``first_epoch .. epochs - 1`` back to back, each epoch in its own order.

    Epoch ``e``'s order depends only on ``(seed, e)``, so a resumed run sees the batches the
    uninterrupted run would have.
    """
    n = len(y)
    x_all = {k: tf.constant(v) for k, v in x.items()}
    y_all = tf.constant(y)

    def epoch_order(e: Any) -> tf.data.Dataset:
        key = tf.stack([tf.constant(seed, tf.int64), e])
        order = tf.argsort(tf.random.stateless_uniform([n], key))
        return tf.data.Dataset.from_tensor_slices(order).batch(batch_size)

    def gather(rows: Any) -> tuple[dict[str, Any], Any]:
        return {k: tf.gather(v, rows) for k, v in x_all.items()}, tf.gather(y_all, rows)

    epochs_ds = tf.data.Dataset.range(first_epoch, epochs)
    return epochs_ds.flat_map(epoch_order).map(
        gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )


def _resume_state(config: Config, run: Path, resume: bool, overwrite: bool) -> bool:
    """Checks the run folder against the request; True if a checkpoint is to be loaded."""
    checkpoint = run / "checkpoint"
    if not resume:
        if run.exists():
            if not overwrite:
                raise FileExistsError(
                    f"{run} holds an interrupted run: "
                    "pass --resume to continue it or --overwrite to start over"
                )
            shutil.rmtree(run)
        return False
    if not (run / "config.json").is_file():
        raise ValueError(f"nothing to resume: {run} does not exist (train without --resume)")
    saved = Config.from_dict(json.loads((run / "config.json").read_text()))
    # Only the number of epochs may change on resume (to train a run for longer).
    saved_flat = {f"{s}.{k}": v for s, fields in saved.to_dict().items() for k, v in fields.items()}
    given_flat = {f"{s}.{k}": v for s, fields in config.to_dict().items() for k, v in fields.items()}
    differ = sorted(k for k in given_flat if k != "train.epochs" and given_flat[k] != saved_flat.get(k))
    if differ:
        changes = ", ".join(f"{k}: {saved_flat.get(k)!r} -> {given_flat[k]!r}" for k in differ)
        raise ValueError(f"cannot resume {run} with another configuration ({changes})")
    if not checkpoint.is_dir():
        log.info("%s has no checkpoint yet: training from the first epoch", run)
        return False
    return True


def train(
    config: Config,
    out: Path,
    overwrite: bool = False,
    verbose: int | str = "auto",
    resume: bool = False,
    tensorboard: Path | None = None,
) -> dict[str, Any]:
    """Trains the configured towers and writes the model artifact to ``out``.

    The run keeps a checkpoint of every epoch in ``out.partial/`` (removed once ``out`` is
    written); ``resume`` continues an interrupted run from its last checkpoint (same
    configuration, ``train.epochs`` may be raised).

    Args:
        config: the resolved configuration.
        out: the model artifact folder to write.
        overwrite: replace an existing ``out`` (and discard an interrupted run in ``out.partial``).
        verbose: Keras' progress output (0 = none).
        resume: continue the run in ``out.partial``.
        tensorboard: write TensorBoard logs (loss, learning rate, validation metrics) there.

    Returns:
        the metrics written to ``out/metrics.json``: ``validation`` (per epoch and final),
        ``test``, ``baseline_popularity_test``, the training time and the epochs trained.
    """
    if not config.data.path:
        raise ValueError("config.data.path is empty: give the interactions to train on")
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass --overwrite to replace it)")
    run = run_folder(out)
    load = _resume_state(config, run, resume, overwrite)
    keras.utils.set_random_seed(config.train.seed)
    data = build_sequences(load_interactions(config.data.path, config.data.format))
    protocol = make_protocol(config.data, data)
    split = protocol.split
    vocab, max_len = data.vocab, config.model.max_len
    t = config.train
    side = build_side_vocab(data, parse_side_features(config.model.side_features))
    features = user_event_features(data, side)  # {name: per-user arrays}, aligned with the sequences
    attributes = attribute_table(side, data.item_attributes or {}, vocab.num_embeddings)
    model = build_model(config.model, vocab.num_embeddings, side, attributes)
    model.set_objective(t.objective)
    lengths = [len(s) for s in split.train]
    train_features = history_features(features, protocol.train_users, lengths, request_time=False)
    train_events = {"items": split.train, **train_features}
    x, y = make_examples(model.objective, train_events, max_len)
    if not len(y):
        raise ValueError(f"{config.data.path}: no training examples (every user needs >= 2 training events)")
    log.info(
        "%d users, %d items, %d training examples (objective %s, loss %s)",
        len(data.users), len(vocab), len(y), model.objective, t.loss,
    )  # fmt: skip

    counts = item_counts(split.train, vocab.num_embeddings)
    model.task = build_training_task(t, counts, y)
    steps = -(-len(y) // t.batch_size)
    # XLA has no kernel for the sampler and was slower on CPU (MEASURED.md): keep it off.
    model.compile(optimizer=make_optimizer(t, t.epochs * steps), jit_compile=False)

    valid_features = history_features(features, split.valid_users, [len(h) for h in split.valid_histories])
    validation = FullRankingValidation(protocol, vocab, max_len, side, valid_features, t.eval_every)
    early = EarlyStopping(f"val_{protocol.shown[0]}", t.patience) if t.patience > 0 else None
    state: dict[str, Any] = {}
    if load:
        state, best_weights = load_checkpoint(run / "checkpoint", model, model.task.variables)
        validation.history = list(state["validation"])
        if early is not None and state.get("early_stopping"):
            early.set_state(state["early_stopping"])
            early.best_weights = best_weights
        log.info("resuming %s after epoch %d", run, state["epoch"])
    else:
        run.mkdir(parents=True, exist_ok=True)
        config.save(run / "config.json")
    first_epoch = int(state.get("epoch", 0))
    checkpoint = EpochCheckpoint(run / "checkpoint", model.task.variables, validation, early, state)
    callbacks: list[keras.callbacks.Callback] = [validation, *([early] if early else []), checkpoint]
    if tensorboard is not None:
        callbacks.append(TensorBoardLogger(tensorboard))

    if first_epoch < t.epochs and not (early is not None and early.stopped):
        dataset = epoch_batches(x, y, t.batch_size, t.seed, first_epoch, t.epochs)
        if model.objective == "cloze":  # fresh masks every step, seeded by (run seed, step)
            mask_id = model.user_tower.mask_id

            def mask(step: Any, batch: tuple[dict[str, Any], Any]) -> tuple[dict[str, Any], Any]:
                seed = tf.stack([tf.constant(t.seed, tf.int64), step])
                return mask_items(*batch, mask_id, t.mask_ratio, seed=seed)

            dataset = dataset.enumerate(start=first_epoch * steps).map(mask, tf.data.AUTOTUNE)
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
        model.fit(
            dataset,
            epochs=t.epochs,
            initial_epoch=first_epoch,
            steps_per_epoch=steps,
            callbacks=callbacks,
            verbose=verbose,
            shuffle=False,  # epoch_batches orders every epoch itself (seeded)
        )
    elif early is not None:  # the run had already finished training: export its best weights
        early.restore_best(model)

    artifact = live_artifact(model, vocab, max_len, side)
    test_features = history_features(features, split.test_users, [len(h) for h in split.test_histories])
    k_max = 50
    metrics = {
        "validation": _exported_validation(validation.history, early),
        "validation_per_epoch": validation.history,
        "protocol": protocol.name,
        "test": protocol.evaluate(artifact, split.test_histories, split.test_targets, test_features),
        "baseline_popularity_test": protocol.baseline(
            popularity_top_k(counts, split.test_histories, k_max), split.test_targets
        ),
        "train_loss_per_epoch": checkpoint.losses,
        "train_seconds": round(checkpoint.seconds, 1),
        "train_examples": len(y),
        "objective": model.objective,
        "loss": t.loss,
        "epochs_trained": len(checkpoint.losses),
        "best_epoch": early.best_epoch if early is not None else None,
        "stopped_early": bool(early is not None and early.stopped),
    }
    item_attributes = None
    if data.item_attributes:
        item_attributes = {vocab.ids[i - 1]: list(a) for i, a in sorted(data.item_attributes.items())}
    save_model(model, config, vocab, side, metrics, out, overwrite, item_attributes)
    shutil.rmtree(run, ignore_errors=True)  # the artifact is complete: the checkpoints are done with
    return metrics


def _exported_validation(history: list[dict[str, float]], early: EarlyStopping | None) -> dict[str, float]:
    """The validation metrics of the exported weights: the best epoch's with early stopping."""
    if early is not None and early.best_epoch:
        return next((h for h in history if h["epoch"] == early.best_epoch), {})
    return history[-1] if history else {}


def save_model(
    model: TwoTowerModel,
    config: Config,
    vocab: ItemVocab,
    side: SideVocab,
    metrics: dict[str, Any],
    out: Path,
    overwrite: bool,
    attributes: dict[str, list[str]] | None = None,
) -> None:
    """Writes the model artifact (layout in :mod:`retrieval.model_artifact`) atomically.

    ``attributes`` (external item id -> attribute values, e.g. genres) is saved when given.
    """
    table = np.array(model.item_tower.all_items(), np.float32)
    table[0] = 0.0  # padding is never an answer
    meta = {
        "tower": config.model.tower,
        "dim": int(table.shape[1]),
        "num_interests": int(model.user_tower.num_interests),
        "max_len": config.model.max_len,
        "num_items": len(vocab),
        "data": config.data.path,
        "inputs": ["items", *side.event_features],
        "side_features": list(side.features),
        "fusion": config.model.fusion,
    }
    with write_artifact(out, KIND, meta, overwrite=overwrite) as tmp:
        config.save(tmp / "config.json")
        vocab.save(tmp / "vocab.json")
        if attributes:
            (tmp / "item_attributes.json").write_text(json.dumps(attributes, ensure_ascii=False))
        if side.features:
            side.save(tmp / SIDE_FILE)
        np.save(tmp / "item_embeddings.npy", table)
        export_user_tower(model, tmp / "user_tower", ("items", *side.event_features))
        model.save(tmp / "model.keras")
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2))
