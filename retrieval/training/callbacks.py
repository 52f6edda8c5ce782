"""Training-loop pieces: early stopping, checkpoints, timing and TensorBoard logs.

Keras' epochs here are the run's rounds (:class:`~retrieval.training.config.Budget`): an epoch of
the data with a budget in epochs, ``train.eval_every_steps`` optimizer steps with one in steps;
"epoch" in the callbacks' names and states means a round.

A run being trained into ``out`` keeps its state in the run folder ``out.partial/``
(:func:`run_folder`); the model artifact ``out`` itself is only written, atomically, once
training has finished, so a half-trained run never looks like a finished artifact.
"""

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

from retrieval.storage.folders import write_artifact
from retrieval.storage.manifest import read_manifest
from retrieval.training.schedules import Cooldown

log = logging.getLogger(__name__)

CHECKPOINT_KIND = "checkpoint"
_VARIABLES, _BEST, _STATE = "variables.npz", "best_weights.npz", "state.json"


def run_folder(out: Path) -> Path:
    """Where a run training into the artifact ``out`` keeps its checkpoints: ``out.partial``."""
    out = Path(out)
    return out.with_name(f"{out.name}.partial")


class EarlyStopping(keras.callbacks.Callback):
    """Stops after ``patience`` validations without improving ``monitor`` (higher is better) and
    restores the best epoch's weights when training ends.

    Unlike ``keras.callbacks.EarlyStopping`` its state survives a resume (:meth:`get_state`,
    :meth:`set_state`), and epochs without the metric (``eval_every > 1``) are skipped.

    Args:
        monitor: epoch-log key, e.g. ``val_ndcg@10``.
        patience: validations without improvement before stopping (>= 1).
        cooldown: the ``plateau`` schedule's decay: when patience runs out, the best weights
            are restored and the decay begins instead of the run stopping; the decay's end
            ends the run.
    """

    def __init__(
        self, monitor: str = "val_ndcg@10", patience: int = 3, cooldown: Cooldown | None = None
    ) -> None:
        super().__init__()
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        self.monitor, self.patience, self.cooldown = monitor, patience, cooldown
        self.best: float | None = None
        self.best_epoch = 0  # 1-based; 0 = none yet
        self.wait = 0
        self.stopped = False
        self.best_weights: list[np.ndarray] | None = None

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        value = (logs or {}).get(self.monitor)
        if value is None:
            return
        if self.best is None or float(value) > self.best:
            self.best, self.best_epoch, self.wait = float(value), epoch + 1, 0
            self.best_weights = [np.array(w) for w in self.model.get_weights()]
            return
        self.wait += 1
        if self.wait < self.patience:
            return
        if self.cooldown is not None:  # the decay, once begun, ends the run
            if self.cooldown.begin(int(self.model.optimizer.iterations)):
                self.restore_best(self.model)
            self.wait = 0
            return
        self.stopped = True
        self.model.stop_training = True
        log.info("early stopping after round %d: best %s %.5f at round %d", epoch + 1,
                 self.monitor, self.best, self.best_epoch)  # fmt: skip

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.restore_best(self.model)

    def restore_best(self, model: keras.Model) -> None:
        """Sets ``model``'s weights to the best epoch's (if any epoch was validated)."""
        if self.best_weights is not None:
            model.set_weights(self.best_weights)

    def get_state(self) -> dict[str, Any]:
        return {"best": self.best, "best_epoch": self.best_epoch, "wait": self.wait, "stopped": self.stopped}

    def set_state(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch = state["best"], state["best_epoch"]
        self.wait, self.stopped = state["wait"], state["stopped"]


def _signature(variable: Any) -> str:
    """Shape and dtype: variable names carry per-process counters (``dense_3``), so a resumed
    process is matched against the checkpoint by the ordered list of these instead."""
    return f"{tuple(variable.shape)}:{keras.backend.standardize_dtype(variable.dtype)}"


def _state_variables(model: keras.Model, extra: Sequence[Any]) -> list[Any]:
    """Everything a resumed run must get back: the model's variables (weights and dropout seed
    states), the optimizer's (step count, moments) and ``extra`` (e.g. the task's seed counters)."""
    optimizer = [] if model.optimizer is None else list(model.optimizer.variables)
    return [*model.variables, *optimizer, *extra]


def save_checkpoint(
    folder: Path,
    model: keras.Model,
    extra_variables: Sequence[Any],
    state: dict[str, Any],
    best_weights: Sequence[np.ndarray] | None = None,
) -> None:
    """Writes a checkpoint folder atomically (replacing the previous one).

    Args:
        folder: the checkpoint folder, e.g. ``run_folder(out) / "checkpoint"``.
        model: a compiled model; its variables and its optimizer's are saved.
        extra_variables: more variables to save (the task's random state).
        state: JSON-able training state; must hold ``epoch`` (epochs completed).
        best_weights: early stopping's best weights, if any.
    """
    variables = _state_variables(model, extra_variables)
    with write_artifact(folder, CHECKPOINT_KIND, {"epoch": state["epoch"]}, overwrite=True) as tmp:
        np.savez(tmp / _VARIABLES, *[keras.ops.convert_to_numpy(v) for v in variables])
        if best_weights is not None:
            np.savez(tmp / _BEST, *best_weights)
        payload = {**state, "variables": [_signature(v) for v in variables]}
        (tmp / _STATE).write_text(json.dumps(payload, indent=2))


def load_checkpoint(
    folder: Path, model: keras.Model, extra_variables: Sequence[Any]
) -> tuple[dict[str, Any], list[np.ndarray] | None]:
    """Restores a checkpoint written by :func:`save_checkpoint` into ``model`` (compiled, same
    configuration) and ``extra_variables``; builds the optimizer first.

    Returns:
        the saved training state and early stopping's best weights (None if none were saved).

    Raises:
        retrieval.storage.manifest.ArtifactError: the folder is incomplete or corrupted.
        ValueError: the checkpoint was written by a model with other variables.
    """
    folder = Path(folder)
    read_manifest(folder, CHECKPOINT_KIND)  # verifies every file's checksum
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    variables = _state_variables(model, extra_variables)
    state = json.loads((folder / _STATE).read_text())
    if [_signature(v) for v in variables] != state["variables"]:
        raise ValueError(f"{folder} was written by a different model or optimizer: its variables differ")
    with np.load(folder / _VARIABLES) as arrays:
        for i, variable in enumerate(variables):
            variable.assign(arrays[f"arr_{i}"])
    best = None
    if (folder / _BEST).is_file():
        with np.load(folder / _BEST) as arrays:
            best = [arrays[f"arr_{i}"] for i in range(len(arrays.files))]
    return state, best


class EpochTimer(keras.callbacks.Callback):
    """Each epoch's training seconds, from its start to the end of its last step: put it first
    among the callbacks, so that none of their end-of-epoch work (validation, checkpoints) counts.

    Attributes:
        seconds: one entry per epoch timed (a resumed run starts from the saved list).
    """

    def __init__(self, seconds: Sequence[float] = ()) -> None:
        super().__init__()
        self.seconds = [float(s) for s in seconds]
        self._began = time.perf_counter()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._began = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.seconds.append(time.perf_counter() - self._began)


class EpochCheckpoint(keras.callbacks.Callback):
    """Saves a checkpoint (:func:`save_checkpoint`) at the end of every epoch.

    The state holds the epochs completed, the training loss per epoch, the wall time so far,
    each epoch's training seconds (``timer``), the validation history (``validation.history``)
    and early stopping's state.

    Args:
        folder: the checkpoint folder.
        extra_variables: the task's random state.
        validation: a callback whose ``history`` list is saved (None = none).
        early_stopping: saved with its best weights (None = none).
        state: a loaded checkpoint's state, to continue from.
        timer: the run's :class:`EpochTimer` (None = none), whose ``seconds`` are saved.
        cooldown: the ``plateau`` schedule's decay (None = none), whose state is saved.
    """

    def __init__(
        self,
        folder: Path,
        extra_variables: Sequence[Any] = (),
        validation: Any = None,
        early_stopping: EarlyStopping | None = None,
        state: dict[str, Any] | None = None,
        timer: EpochTimer | None = None,
        cooldown: Cooldown | None = None,
    ) -> None:
        super().__init__()
        self.folder, self.extra_variables = Path(folder), list(extra_variables)
        self.validation, self.early_stopping, self.timer = validation, early_stopping, timer
        self.cooldown = cooldown
        state = state or {}
        self.losses: list[float] = list(state.get("loss_per_epoch", []))
        self.previous_seconds = float(state.get("seconds", 0.0))
        self.started = time.perf_counter()

    @property
    def seconds(self) -> float:
        """Training wall time, over every session of the run."""
        return self.previous_seconds + time.perf_counter() - self.started

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))
        state = {
            "epoch": epoch + 1,
            "loss_per_epoch": self.losses,
            "seconds": self.seconds,
            "epoch_seconds": [] if self.timer is None else self.timer.seconds,
            "validation": list(getattr(self.validation, "history", [])),
            "early_stopping": None if self.early_stopping is None else self.early_stopping.get_state(),
            "cooldown": None if self.cooldown is None else self.cooldown.get_state(),
        }
        best = None if self.early_stopping is None else self.early_stopping.best_weights
        save_checkpoint(self.folder, self.model, self.extra_variables, state, best)


class TensorBoardLogger(keras.callbacks.Callback):
    """Writes every epoch's logs (loss, validation metrics) and the learning rate as TensorBoard
    scalars, step = epoch number, so a resumed run continues the same curves.

    Written with TensorFlow's own event writer: training needs no ``tensorboard`` package
    (``keras.callbacks.TensorBoard`` does); viewing the logs does.

    Args:
        log_dir: folder for the event files.
    """

    def __init__(self, log_dir: Path) -> None:
        super().__init__()
        self.log_dir = Path(log_dir)
        self.writer: Any = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.writer = tf.summary.create_file_writer(str(self.log_dir))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        values = {k: float(v) for k, v in (logs or {}).items()}
        if self.model.optimizer is not None:
            values["learning_rate"] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        summary = tf.compat.v1.Summary(
            value=[tf.compat.v1.Summary.Value(tag=k, simple_value=v) for k, v in sorted(values.items())]
        )
        with self.writer.as_default():
            tf.summary.experimental.write_raw_pb(summary.SerializeToString(), step=epoch + 1)
        self.writer.flush()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.writer is not None:
            self.writer.close()
