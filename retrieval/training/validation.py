"""Validation during training: the model in memory scored on full rankings after every round of
training (an epoch, or ``train.eval_every_steps`` steps), through a user tower traced once per run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import keras
import numpy as np
import tensorflow as tf

from retrieval.artifacts.model import ModelArtifact, UserVectorsFn
from retrieval.data.features import SideVocab
from retrieval.data.vocab import ItemVocab
from retrieval.training.model import TwoTowerModel, scoring_table

if TYPE_CHECKING:
    from retrieval.training.inputs import TrainingData


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
    table = scoring_table(model)
    manifest = {"version": "training", "max_len": max_len, "num_interests": model.user_tower.num_interests}
    return ModelArtifact(None, manifest, vocab, table, tower or live_tower(model, side), side)


class FullRankingValidation(keras.callbacks.Callback):
    """Computes full-ranking validation metrics after every ``every`` Keras epochs (rounds of
    ``round_steps`` optimizer steps, :class:`~retrieval.training.config.Budget`).

    The data's shown metrics (e.g. ``val_ndcg@10``) go into the epoch logs (and so the
    progress bar and any later callback); the full set of each validation is kept in
    ``history``, with its round (``epoch``) and the optimizer steps trained (``step``).
    """

    def __init__(self, data: TrainingData, max_len: int, every: int = 1, round_steps: int = 1) -> None:
        super().__init__()
        self.data, self.max_len, self.every, self.round_steps = data, max_len, every, round_steps
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
        self.history.append({"epoch": epoch + 1, "step": (epoch + 1) * self.round_steps, **metrics})
        if logs is not None:  # shown on the progress bar; every metric goes to metrics.json
            logs.update({f"val_{k}": metrics[k] for k in self.data.shown})
