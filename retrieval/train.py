"""Training: data -> leave-one-out split -> sampled-softmax training -> model artifact."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from retrieval.artifacts import write_artifact
from retrieval.config import Config
from retrieval.data import LeaveOneOut, build_sequences, leave_one_out, load_interactions
from retrieval.evaluate import evaluate_ranking, popularity_top_k
from retrieval.examples import make_examples, mask_items
from retrieval.features import (
    SideVocab,
    attribute_table,
    build_side_vocab,
    parse_side_features,
    user_event_features,
)
from retrieval.losses import CandidateSampler, SampledSoftmaxTask
from retrieval.metrics import ranking_metrics
from retrieval.model import TwoTowerModel, build_model, export_user_tower
from retrieval.model_artifact import KIND, SIDE_FILE, Features, ModelArtifact
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


def history_features(
    features: dict[str, tuple[np.ndarray, ...]],
    users: Sequence[int] | np.ndarray,
    histories: Sequence[np.ndarray],
) -> dict[str, list[np.ndarray]]:
    """Each history's side inputs: user ``u``'s features cut to the history's length (histories
    are prefixes of the users' sequences)."""
    return {
        name: [per_user[u][: len(h)] for u, h in zip(users, histories, strict=True)]
        for name, per_user in features.items()
    }


class FullRankingValidation(keras.callbacks.Callback):
    """Computes full-ranking validation metrics after every ``every`` epochs.

    ``val_ndcg@10``, ``val_hr@10`` and ``val_recall@50`` go into the epoch logs (and so the
    progress bar and any later callback); the full set per epoch is kept in ``history``.
    """

    SHOWN = ("ndcg@10", "hr@10", "recall@50")

    def __init__(
        self,
        split: LeaveOneOut,
        vocab: ItemVocab,
        max_len: int,
        side: SideVocab,
        features: Features | None,
        every: int = 1,
    ) -> None:
        super().__init__()
        self.split, self.vocab, self.max_len, self.every = split, vocab, max_len, every
        self.side, self.features = side, features
        self.history: list[dict[str, float]] = []

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if (epoch + 1) % self.every or not len(self.split.valid_targets):
            return
        assert isinstance(self.model, TwoTowerModel)
        artifact = live_artifact(self.model, self.vocab, self.max_len, self.side)
        split = self.split
        metrics = evaluate_ranking(
            artifact, split.valid_histories, split.valid_targets, features=self.features
        )
        self.history.append({"epoch": epoch + 1, **metrics})
        if logs is not None:  # shown on the progress bar; every metric goes to metrics.json
            logs.update({f"val_{k}": metrics[k] for k in self.SHOWN})


def item_counts(sequences: Sequence[np.ndarray], num_embeddings: int) -> np.ndarray:
    """Occurrences of each dense id in ``sequences``, int64 ``[num_embeddings]``."""
    flat = np.concatenate(sequences) if len(sequences) else np.zeros(0, np.int64)
    return np.bincount(flat, minlength=num_embeddings)


def train(config: Config, out: Path, overwrite: bool = False, verbose: int | str = "auto") -> dict[str, Any]:
    """Trains the configured towers and writes the model artifact to ``out``.

    Returns:
        the metrics written to ``out/metrics.json``: ``validation`` (per epoch and final),
        ``test``, ``baseline_popularity_test`` and the training time.
    """
    if not config.data.path:
        raise ValueError("config.data.path is empty: give the interactions to train on")
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass --overwrite to replace it)")
    keras.utils.set_random_seed(config.train.seed)
    data = build_sequences(load_interactions(config.data.path, config.data.format))
    split = leave_one_out(data)
    vocab, max_len = data.vocab, config.model.max_len
    t = config.train
    side = build_side_vocab(data, parse_side_features(config.model.side_features))
    features = user_event_features(data, side)  # {name: per-user arrays}, aligned with the sequences
    attributes = attribute_table(side, data.item_attributes or {}, vocab.num_embeddings)
    model = build_model(config.model, vocab.num_embeddings, side, attributes)
    model.set_objective(t.objective)
    everyone = range(len(data.users))
    train_events = {"items": split.train, **history_features(features, everyone, split.train)}
    x, y = make_examples(model.objective, train_events, max_len)
    if not len(y):
        raise ValueError(f"{config.data.path}: no training examples (every user needs >= 2 training events)")
    log.info(
        "%d users, %d items, %d training examples (objective %s)",
        len(data.users), len(vocab), len(y), model.objective,
    )  # fmt: skip

    counts = item_counts(split.train, vocab.num_embeddings)
    sampler = CandidateSampler.from_counts(counts, t.sampler, t.sampler_alpha)
    model.task = SampledSoftmaxTask(
        sampler,
        t.num_negatives,
        t.temperature,
        t.remove_accidental_hits,
        interest_selection=t.interest_selection,
        label_aware_power=t.label_aware_power,
    )
    # XLA has no kernel for the sampler and was slower on CPU (MEASURED.md): keep it off.
    model.compile(optimizer=keras.optimizers.Adam(t.learning_rate), jit_compile=False)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(
        len(y), seed=t.seed, reshuffle_each_iteration=True
    )
    dataset = dataset.batch(t.batch_size)
    if model.objective == "cloze":  # fresh masks every epoch
        mask_id = model.user_tower.mask_id
        dataset = dataset.map(lambda x, y: mask_items(x, y, mask_id, t.mask_ratio), tf.data.AUTOTUNE)
    dataset = dataset.prefetch(tf.data.AUTOTUNE)
    valid_features = history_features(features, split.valid_users, split.valid_histories)
    validation = FullRankingValidation(split, vocab, max_len, side, valid_features, t.eval_every)
    started = time.perf_counter()
    # The dataset shuffles itself (seeded); Keras' own shuffle flag does not apply to tf.data.
    history = model.fit(dataset, epochs=t.epochs, callbacks=[validation], verbose=verbose, shuffle=False)
    seconds = time.perf_counter() - started

    artifact = live_artifact(model, vocab, max_len, side)
    test_features = history_features(features, split.test_users, split.test_histories)
    k_max = 50
    metrics = {
        "validation": validation.history[-1] if validation.history else {},
        "validation_per_epoch": validation.history,
        "test": evaluate_ranking(artifact, split.test_histories, split.test_targets, features=test_features),
        "baseline_popularity_test": ranking_metrics(
            popularity_top_k(counts, split.test_histories, k_max), split.test_targets
        ),
        "train_loss_per_epoch": [float(v) for v in history.history.get("loss", [])],
        "train_seconds": round(seconds, 1),
        "train_examples": len(y),
        "objective": model.objective,
    }
    item_attributes = None
    if data.item_attributes:
        item_attributes = {vocab.ids[i - 1]: list(a) for i, a in sorted(data.item_attributes.items())}
    save_model(model, config, vocab, side, metrics, out, overwrite, item_attributes)
    return metrics


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
