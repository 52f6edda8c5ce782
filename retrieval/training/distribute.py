"""Running :func:`retrieval.training.run.train` under ``tf.distribute``: one device, the replicas of one
machine, or synchronous workers configured by ``TF_CONFIG``.

The strategy (:func:`make_strategy`) and which process writes the outputs (:func:`is_chief`);
the loss as one replica's share of the global batch's (:class:`GlobalBatchTask`); the learning
rate scaled with the replicas (:func:`peak_learning_rate`); the workarounds that let Keras'
``fit`` run under a multi-worker strategy (:func:`fit_under`); and the barrier the chief waits
at before exiting (:func:`wait_for_workers`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import tensorflow as tf

from retrieval.training.config import LR_SCALINGS, STRATEGIES, TrainConfig
from retrieval.training.losses.task import RetrievalTask
from retrieval.training.model import TwoTowerModel


def make_strategy(name: str = "default", replicas: int | None = None) -> tf.distribute.Strategy:
    """The ``tf.distribute`` strategy called ``name`` (one of :data:`STRATEGIES`).

    Call it first in the process, before any other TensorFlow op: a
    ``MultiWorkerMirroredStrategy`` sets up the process's collective ops, and logical CPU
    devices can only be configured before TensorFlow initialises its devices.

    * ``default``: one device, no distribution.
    * ``mirrored``: synchronous replicas on this machine, one per GPU (``replicas`` of them,
      default all); on a machine without GPUs, ``replicas`` logical CPU devices (default 1),
      which share the CPU's cores: a way to test a multi-replica run, not a speed-up.
    * ``multi-worker``: ``MultiWorkerMirroredStrategy``, one process per host; the cluster and
      this process's place in it come from the ``TF_CONFIG`` environment variable.

    Raises:
        ValueError: an unknown name, ``replicas`` < 1, or ``multi-worker`` without a valid ``TF_CONFIG``.

    Example:
        >>> strategy = make_strategy("mirrored", replicas=2)  # first thing in main()
        >>> train(config, Path("runs/x"), strategy=strategy)
    """
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {STRATEGIES}")
    if replicas is not None and (replicas < 1 or name != "mirrored"):
        raise ValueError(f"replicas must be >= 1 and is for the mirrored strategy only, got {replicas}")
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            return tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(replicas or len(gpus))])
        count = replicas or 1
        if count > 1:
            (cpu, *_) = tf.config.list_physical_devices("CPU")
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
        return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(count)])
    raw = os.environ.get("TF_CONFIG", "")
    try:
        tf_config = json.loads(raw) if raw else None
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON: {e}") from None
    if not isinstance(tf_config, dict) or not {"cluster", "task"} <= set(tf_config):
        raise ValueError(
            'the multi-worker strategy needs TF_CONFIG: {"cluster": {"worker": ["host:port", ...]}, '
            '"task": {"type": "worker", "index": i}}, one per host '
            '(docs/training.md, "Several devices or hosts")'
        )
    return tf.distribute.MultiWorkerMirroredStrategy()


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes the run's outputs: always without a cluster; in a cluster,
    the ``chief`` task, or worker 0 when there is none (TensorFlow's convention)."""
    resolver = strategy.cluster_resolver
    if resolver is None or not resolver.task_type:
        return True
    if resolver.task_type == "chief":
        return True
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return resolver.task_type == "worker" and resolver.task_id == 0 and not has_chief


def _multi_worker(strategy: tf.distribute.Strategy) -> bool:
    """More than one process takes part (more replicas in sync than this process's devices)."""
    if strategy.cluster_resolver is None:  # the default and mirrored strategies: this process alone
        return False
    return bool(strategy.num_replicas_in_sync > len(strategy.extended.worker_devices))


def wait_for_workers(strategy: tf.distribute.Strategy) -> None:
    """Returns once every worker has got here (a collective sum over the replicas): the chief's
    process hosts the cluster's coordination service and must not exit before the others."""
    if _multi_worker(strategy):
        strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)


class GlobalBatchTask(RetrievalTask):
    """A task's loss as one replica's share of the mean over the *global* batch.

    Under a ``tf.distribute`` strategy Keras sums the replicas' gradients, and multiplies the
    loss ``compute_loss`` returns by the number of replicas before logging it. Each replica
    therefore returns ``sum of its examples' losses / examples in the global batch`` (the
    count all-reduced over the replicas): the summed gradient is exactly the gradient of the
    global batch's mean, however the batch was split (a short last batch, ``[B, L]`` targets
    with a varying number of real ones, a replica with no example at all). The value it
    returns is the global mean divided by the replicas (a ``stop_gradient`` term), so every
    replica logs the same loss, the one a single device would.

    Negatives: the seed counters of the wrapped task are mirrored variables, advanced in step
    by every replica, so all replicas draw the negatives one device would draw for the whole
    batch; in-batch negatives are the replica's own share of the batch.

    Args:
        task: the task to wrap (its other attributes are read through).
    """

    def __init__(self, task: RetrievalTask) -> None:  # a view of ``task``: nothing of its own to set up
        self.task = task

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)

    @property
    def variables(self) -> list[Any]:
        return self.task.variables

    def __call__(self, outputs: Any, target_ids: Any, embed: Callable[[Any], Any]) -> Any:
        losses, _ = self.task.per_example(outputs, target_ids, embed)  # [M] on this replica
        replica = tf.distribute.get_replica_context()
        local = tf.reduce_sum(losses)
        count = tf.cast(tf.size(losses), local.dtype)
        totals = replica.all_reduce("sum", tf.stack([tf.stop_gradient(local), count]))
        examples = tf.maximum(totals[1], 1.0)
        share = local / examples
        mean = totals[0] / examples
        return share + tf.stop_gradient(mean / replica.num_replicas_in_sync - share)


@contextmanager
def fit_under(strategy: tf.distribute.Strategy, model: TwoTowerModel) -> Iterator[None]:
    """Prepares ``model`` (built and compiled in ``strategy``'s scope) for ``fit`` under the
    strategy: builds its optimizer, and works around two bugs of Keras 3 (3.15, TF backend) that
    stop any ``fit`` under ``MultiWorkerMirroredStrategy``:

    * ``fit`` first takes a batch and averages it over the replicas with ``strategy.reduce``,
      which the multi-worker strategy refuses for a batch of several tensors
      (keras-team/keras#20329). The batch only serves to build the model and its optimizer:
      the model is built, the optimizer is built here, and that step is skipped.
    * Each step's logs are averaged with ``strategy.reduce(MEAN, value, axis=0)`` across
      workers, and a scalar has no axis 0: the step's logs are given one.

    The optimizer is built here under the default strategy too: Keras would build it inside the
    first traced step, and a step that creates variables is traced twice by ``tf.function``
    (the same losses, half the tracing).
    """
    with strategy.scope():
        distributed = tf.distribute.has_strategy()  # False for the default strategy
        if not model.optimizer.built:  # in the scope, not inside a replica's step
            model.optimizer.build(model.trainable_variables)
    if not distributed:
        yield
        return
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None
    if _multi_worker(strategy):
        step = model.train_step

        def train_step(data: Any) -> dict[str, Any]:
            return {name: tf.reshape(value, [1]) for name, value in step(data).items()}

        model.train_step = train_step
    try:
        yield
    finally:  # the model as it was (its train function is built anew by the next fit)
        model.__dict__.pop("_maybe_symbolic_build", None)
        model.__dict__.pop("train_step", None)
        model.train_function = None


def peak_learning_rate(config: TrainConfig, replicas: int = 1) -> float:
    """``learning_rate``, times the replicas (``lr_scaling=linear``) or their square root (``sqrt``).

    Raises:
        ValueError: an unknown scaling.
    """
    if config.lr_scaling not in LR_SCALINGS:
        raise ValueError(f"unknown lr_scaling {config.lr_scaling!r}; choose one of {LR_SCALINGS}")
    factor = {"none": 1.0, "linear": float(replicas), "sqrt": float(np.sqrt(replicas))}[config.lr_scaling]
    return config.learning_rate * factor
