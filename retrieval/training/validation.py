"""How a run scores itself during training: the split and metrics of its protocol, and the
validation callback that computes them on the model in memory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
import tensorflow as tf

from retrieval.artifacts.model import Features, ModelArtifact, UserVectorsFn
from retrieval.data.features import SideVocab
from retrieval.data.interactions import SequenceData
from retrieval.data.splits import ComirecSplit, LeaveOneOut, comirec_split, leave_one_out
from retrieval.data.vocab import ItemVocab
from retrieval.evaluation.evaluate import category_codes, evaluate_comirec, evaluate_ranking
from retrieval.evaluation.metrics import (
    COMIREC_KS,
    DEFAULT_KS,
    comirec_metrics,
    ranking_metrics,
    user_comirec_metrics,
    user_ranking_metrics,
)
from retrieval.training.config import TRAINING_PROTOCOLS, DataConfig
from retrieval.training.model import TwoTowerModel

if TYPE_CHECKING:
    from retrieval.training.inputs import TrainingData

BASELINE_K = 50


@dataclass(frozen=True)
class Protocol:
    """How an in-memory run splits its data and scores itself (``DataConfig.protocol``).

    Attributes:
        name: the evaluation protocol, ``"loo"`` or ``"comirec"`` (as in ``tools/evaluate.py
            --protocol``; ``loo-refit`` is evaluated as ``loo``).
        split: the split (training sequences, validation and test histories and targets).
        train_users: the users whose ``split.train`` sequences train the model.
        evaluate: ``(model, histories, targets, features) -> metrics``.
        baseline: ``(top-k of the most popular items, targets) -> metrics``.
        per_user: ``(top-k, targets) -> metric -> value of every user`` (the ranking metrics of
            ``evaluate`` without diversity, before averaging).
        depth: the top-k ``per_user`` reads.
        shown: validation metrics shown per epoch; the first is the early-stopping monitor.
    """

    name: str
    split: LeaveOneOut | ComirecSplit
    train_users: Sequence[int] | np.ndarray
    evaluate: Callable[[ModelArtifact, Sequence[np.ndarray], Any, Features | None], dict[str, float]]
    baseline: Callable[[np.ndarray, Any], dict[str, float]]
    per_user: Callable[[np.ndarray, Any], dict[str, np.ndarray]]
    depth: int
    shown: tuple[str, ...]


LOO_SHOWN = ("ndcg@10", "hr@10", "recall@50")


def make_protocol(config: DataConfig, data: SequenceData) -> Protocol:
    """The split and scoring of ``config.protocol``.

    Raises:
        ValueError: an unknown protocol.
    """
    if config.protocol in ("loo", "loo-refit"):
        return Protocol(
            "loo",
            leave_one_out(data, refit=config.protocol == "loo-refit"),
            range(len(data.users)),
            lambda model, histories, targets, features: evaluate_ranking(
                model, histories, targets, features=features
            ),
            ranking_metrics,
            user_ranking_metrics,
            max(DEFAULT_KS),
            LOO_SHOWN,
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
            user_comirec_metrics,
            max(COMIREC_KS),
            ("recall@50", "hitrate@50", "recall@20"),
        )
    raise ValueError(f"unknown protocol {config.protocol!r}; choose one of {TRAINING_PROTOCOLS}")


def live_tower(model: TwoTowerModel, side: SideVocab) -> UserVectorsFn:
    """The user tower of a model in memory on numpy inputs, ``{name: int32 [B, L]} -> [B, K, d]``
    (the inputs ``items`` and ``side``'s per-event features, as the exported tower's).

    Traced once, on its first call: every input is ``[None, None]`` in the signature, so no batch
    size or history width traces it again (evaluation encodes histories at several widths). The
    graph reads the model's variables, so it follows the weights as training changes them.
    """
    names = ("items", *side.event_features)
    signature = [{name: tf.TensorSpec([None, None], tf.int32, name=name) for name in names}]
    predict = tf.function(lambda inputs: model(inputs, training=False), input_signature=signature)

    def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:
        return predict({k: tf.constant(v, tf.int32) for k, v in inputs.items()}).numpy()

    return user_vectors


def live_artifact(
    model: TwoTowerModel,
    vocab: ItemVocab,
    max_len: int,
    side: SideVocab,
    tower: UserVectorsFn | None = None,
) -> ModelArtifact:
    """A :class:`ModelArtifact` view of a model in memory, for evaluation during training.

    ``tower``: the model's :func:`live_tower`, when the caller keeps one across evaluations
    (each new one is traced again); by default a new one.
    """
    table = np.array(model.item_tower.all_items())
    manifest = {"version": "training", "max_len": max_len, "num_interests": model.user_tower.num_interests}
    return ModelArtifact(None, manifest, vocab, table, tower or live_tower(model, side), side)


class FullRankingValidation(keras.callbacks.Callback):
    """Computes full-ranking validation metrics after every ``every`` epochs.

    The data's shown metrics (e.g. ``val_ndcg@10``) go into the epoch logs (and so the
    progress bar and any later callback); the full set per epoch is kept in ``history``.
    """

    def __init__(self, data: TrainingData, max_len: int, every: int = 1) -> None:
        super().__init__()
        self.data, self.max_len, self.every = data, max_len, every
        self.history: list[dict[str, float]] = []
        self.tower: UserVectorsFn | None = None
        """The model's :func:`live_tower`, made at the first validation: one trace per run."""

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        self.tower = None  # a tower belongs to one model

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if (epoch + 1) % self.every:
            return
        assert isinstance(self.model, TwoTowerModel)
        if self.tower is None:
            self.tower = live_tower(self.model, self.data.side)
        artifact = live_artifact(self.model, self.data.vocab, self.max_len, self.data.side, self.tower)
        metrics = self.data.evaluate(artifact, "valid")
        if not metrics:  # no validation users
            return
        self.history.append({"epoch": epoch + 1, **metrics})
        if logs is not None:  # shown on the progress bar; every metric goes to metrics.json
            logs.update({f"val_{k}": metrics[k] for k in self.data.shown})
