"""Learning-rate schedules: a warm-up, then a constant rate or a decay whose end is known in
advance (:class:`WarmupDecay`), or found by validation (``plateau``: :class:`Cooldown`)."""

from __future__ import annotations

import logging
import math
from typing import Any

import keras
import tensorflow as tf

from retrieval.training.config import LR_SCHEDULES

log = logging.getLogger(__name__)


@keras.saving.register_keras_serializable(package="retrieval")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from ``peak / warmup_steps`` to ``peak``, then a decay to 0 at ``total_steps``.

    Args:
        peak: the learning rate reached after warm-up.
        total_steps: steps of the whole run (the decay ends there).
        warmup_steps: steps of linear warm-up (0 = none).
        kind: ``constant`` (no decay), ``cosine`` or ``linear``; or ``plateau``: constant
            until :meth:`decay_from` is called, then a linear decay to 0 over the steps given.

    Example:
        >>> float(WarmupDecay(1e-3, 100, 10, "linear")(10))  # warm-up done, decay starts
        0.001
    """

    def __init__(self, peak: float, total_steps: int, warmup_steps: int = 0, kind: str = "constant") -> None:
        if kind not in LR_SCHEDULES:
            raise ValueError(f"unknown learning-rate schedule {kind!r}; choose one of {LR_SCHEDULES}")
        if peak <= 0 or warmup_steps < 0 or total_steps < 1:
            raise ValueError("need peak > 0, warmup_steps >= 0 and total_steps >= 1")
        self.peak, self.total_steps, self.warmup_steps, self.kind = peak, total_steps, warmup_steps, kind
        # plateau: where the decay starts and how long it takes (no decay until it is set)
        self.decay = tf.Variable([math.inf, 1.0], trainable=False, dtype=tf.float32, name="plateau_decay")

    def decay_from(self, step: int, steps: int) -> None:
        """``plateau``: the rate decays linearly from ``step`` to 0 at ``step + steps``."""
        self.decay.assign([float(step), float(max(steps, 1))])

    def __call__(self, step: Any) -> Any:
        step = tf.cast(step, tf.float32)
        warm = tf.cast(max(self.warmup_steps, 1), tf.float32)
        warmup = self.peak * tf.minimum((step + 1.0) / warm, 1.0)
        start = tf.cast(self.warmup_steps, tf.float32)
        span = tf.cast(max(self.total_steps - self.warmup_steps, 1), tf.float32)
        if self.kind == "plateau":
            start, span = self.decay[0], self.decay[1]
        progress = tf.clip_by_value((step - start) / span, 0.0, 1.0)
        if self.kind == "cosine":
            decayed = self.peak * 0.5 * (1.0 + tf.cos(math.pi * progress))
        elif self.kind in ("linear", "plateau"):
            decayed = self.peak * (1.0 - progress)
        else:
            decayed = tf.constant(self.peak, tf.float32)
        return tf.where(step < self.warmup_steps, warmup, decayed)

    def get_config(self) -> dict[str, Any]:
        return {
            "peak": self.peak,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "kind": self.kind,
        }


class Cooldown(keras.callbacks.Callback):
    """The ``plateau`` schedule's decay, and the end of the run when it is done.

    The decay starts when validation stops improving (:meth:`begin`, called by early stopping
    when its patience runs out) or, at the latest, when ``fraction`` of the budget is left; it
    lasts ``fraction`` of the steps before it, in whole rounds, so no horizon is set in
    advance. The run stops when the rate reaches 0: a decay is not cut short by patience, as
    its first steps, still at a high rate, seldom beat the best validation.

    Args:
        schedule: the optimizer's ``plateau`` schedule.
        fraction: the decay's length, as a fraction of the steps trained before it (0 < f < 1).
        total_steps: the budget's steps (the decay ends there at the latest).
        round_steps: steps between two ``on_epoch_end`` calls.
    """

    def __init__(self, schedule: WarmupDecay, fraction: float, total_steps: int, round_steps: int) -> None:
        super().__init__()
        if not 0 < fraction < 1:
            raise ValueError(f"the cool-down fraction must be in (0, 1), got {fraction}")
        self.schedule, self.fraction = schedule, fraction
        self.total_steps, self.round_steps = total_steps, round_steps
        self.start: int | None = None
        self.steps = 0

    def begin(self, step: int) -> bool:
        """Starts the decay at ``step``; False (and nothing done) if it has started already."""
        if self.start is not None:
            return False
        rounds = max(1, math.ceil(self.fraction * step / self.round_steps))
        self.set_state(
            {"start": step, "steps": min(rounds * self.round_steps, max(self.total_steps - step, 1))}
        )
        log.info("learning rate decays to 0 from step %d over %d steps", self.start, self.steps)
        return True

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        step = int(self.model.optimizer.iterations)
        if self.start is None and step >= (1 - self.fraction) * self.total_steps:
            self.begin(step)
        elif self.start is not None and step >= self.start + self.steps:
            self.model.stop_training = True

    def get_state(self) -> dict[str, Any]:
        return {"start": self.start, "steps": self.steps}

    def set_state(self, state: dict[str, Any]) -> None:
        self.start, self.steps = state["start"], int(state["steps"])
        if self.start is not None:
            self.schedule.decay_from(self.start, self.steps)
