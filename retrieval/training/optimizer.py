"""The optimizer of a run: Adam or AdamW with the configured warm-up and decay."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from retrieval.training.config import TrainConfig
from retrieval.training.distribute import peak_learning_rate
from retrieval.training.schedules import WarmupDecay


def make_schedule(config: TrainConfig, total_steps: int, replicas: int = 1) -> float | WarmupDecay:
    """The learning rate: the configured warm-up (at most a tenth of ``total_steps``) and decay
    over ``total_steps``, peaking at :func:`peak_learning_rate` (a float when it is constant)."""
    peak = peak_learning_rate(config, replicas)
    warmup = min(config.warmup_steps, total_steps // 10)  # a short run is not all warm-up
    if config.lr_schedule == "constant" and warmup == 0:
        return peak
    return WarmupDecay(peak, total_steps, warmup, config.lr_schedule)


def make_optimizer(config: TrainConfig, rate: float | WarmupDecay) -> keras.optimizers.Optimizer:
    """Adam (AdamW when ``weight_decay`` > 0, biases and normalisation scales not decayed) at
    ``rate`` (:func:`make_schedule`); with ``dense_gradients``, embedding gradients are summed
    per row first (:func:`_sum_rows_first`)."""
    if config.weight_decay <= 0:
        optimizer = keras.optimizers.Adam(rate)
    else:
        optimizer = keras.optimizers.AdamW(rate, weight_decay=config.weight_decay)
        optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    if config.dense_gradients:
        _sum_rows_first(optimizer)
    return optimizer


def _sum_rows_first(optimizer: keras.optimizers.Optimizer) -> None:
    """Makes ``optimizer`` sum a sparse gradient's rows per index before its update.

    An embedding's gradient is a ``tf.IndexedSlices`` with one row per occurrence of an item in
    the batch (history positions, targets, negatives). Keras 3's Adam squares those rows one by
    one (its second moment of an item is then the sum of the squares, not the square of the
    sum), so the step an item takes depends on how its gradient was split: one device and two
    replicas move the table differently (5% apart after the 16 steps of
    ``tests/training/test_distributed.py``) although their gradients agree to 1e-7. Summing first gives
    Adam's textbook update, the same for any split; the cost is a dense ``[items, d]``
    gradient, which Keras 3's Adam builds anyway. The override lives on the instance, so the
    saved optimizer is a plain Keras one.
    """
    update = optimizer.update_step

    def update_step(gradient: Any, variable: Any, learning_rate: Any) -> Any:
        if isinstance(gradient, tf.IndexedSlices):
            gradient = tf.convert_to_tensor(gradient)  # rows of the same index summed
        return update(gradient, variable, learning_rate)

    optimizer.update_step = update_step
