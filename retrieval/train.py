"""Training: data -> split -> training with a named loss (on one device or several) -> model artifact.

:func:`train` reads its data through a :class:`TrainingData`: the interactions loaded in memory
(:class:`InMemoryData`, every format and protocol of :mod:`retrieval.data`) or streamed from a
prepared folder (:class:`PreparedData`, :mod:`retrieval.parquet_data`, leave-one-out only), and
runs under a ``tf.distribute`` strategy (:func:`make_strategy`): one device, the replicas of one
machine, or synchronous workers configured by ``TF_CONFIG``.
"""

from __future__ import annotations

import abc
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from retrieval import parquet_data as pdata
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
from retrieval.streaming import evaluate_prepared, popularity_prepared, streaming_dataset
from retrieval.vocab import ItemVocab

log = logging.getLogger(__name__)

STRATEGIES = ("default", "mirrored", "multi-worker")
"""Names accepted by :func:`make_strategy` (``tools/train.py --strategy``)."""
LR_SCALINGS = ("none", "linear", "sqrt")
"""``TrainConfig.lr_scaling``: the learning rate times 1, the replicas, or their square root."""
BASELINE_K = 50


# --------------------------------------------------------------------------- distribution


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
            '"task": {"type": "worker", "index": i}}, one per host (README, "Training at scale")'
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


def _wait_for_workers(strategy: tf.distribute.Strategy) -> None:
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
def _fit_under(strategy: tf.distribute.Strategy, model: TwoTowerModel) -> Iterator[None]:
    """Prepares ``model`` (built and compiled in ``strategy``'s scope) for ``fit`` under the
    strategy, around two bugs of Keras 3 (3.15, TF backend) that stop any ``fit`` under
    ``MultiWorkerMirroredStrategy``:

    * ``fit`` first takes a batch and averages it over the replicas with ``strategy.reduce``,
      which the multi-worker strategy refuses for a batch of several tensors
      (keras-team/keras#20329). The batch only serves to build the model and its optimizer:
      the model is built, the optimizer is built here, and that step is skipped.
    * Each step's logs are averaged with ``strategy.reduce(MEAN, value, axis=0)`` across
      workers, and a scalar has no axis 0: the step's logs are given one.
    """
    with strategy.scope():
        distributed = tf.distribute.has_strategy()  # False for the default strategy
        if distributed and not model.optimizer.built:  # in the scope, not inside a replica's step
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


def live_artifact(model: TwoTowerModel, vocab: ItemVocab, max_len: int, side: SideVocab) -> ModelArtifact:
    """A :class:`ModelArtifact` view of a model in memory, for evaluation during training."""
    predict = tf.function(lambda inputs: model(inputs, training=False), reduce_retracing=True)
    table = np.array(model.item_tower.all_items())
    manifest = {"version": "training", "max_len": max_len, "num_interests": model.user_tower.num_interests}

    def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:
        return predict({k: tf.constant(v, tf.int32) for k, v in inputs.items()}).numpy()

    return ModelArtifact(None, manifest, vocab, table, user_vectors, side)


# --------------------------------------------------------------------------- data sources


@dataclass(frozen=True)
class Protocol:
    """How an in-memory run splits its data and scores itself (``DataConfig.protocol``).

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


LOO_SHOWN = ("ndcg@10", "hr@10", "recall@50")


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
            ("recall@50", "hitrate@50", "recall@20"),
        )
    raise ValueError(f"unknown protocol {config.protocol!r}; choose loo or comirec")


class TrainingData(abc.ABC):
    """What :func:`train` trains and validates on; it sees nothing else of the data.

    Attributes:
        vocab: the item vocabulary (dense id ``i`` = ``vocab.ids[i - 1]``, 0 = padding).
        side: the side features the model reads and their vocabularies.
        dense_attributes: dense item id -> attribute values (empty when the data has none).
        item_attributes: external item id -> attribute values, saved with the artifact (or None).
        protocol: the evaluation protocol's name (``loo-full`` or ``comirec``).
        shown: validation metrics shown per epoch; the first is the early-stopping monitor.
        users: users in the data.
    """

    def __init__(
        self,
        vocab: ItemVocab,
        side: SideVocab,
        dense_attributes: Mapping[int, Sequence[str]],
        item_attributes: dict[str, list[str]] | None,
        protocol: str,
        shown: tuple[str, ...],
        users: int,
    ) -> None:
        self.vocab, self.side = vocab, side
        self.dense_attributes, self.item_attributes = dense_attributes, item_attributes
        self.protocol, self.shown, self.users = protocol, shown, users

    def attribute_table(self) -> np.ndarray:
        """Item -> attribute ids ``[num_embeddings, A]`` (:func:`retrieval.features.attribute_table`)."""
        return attribute_table(self.side, self.dense_attributes, self.vocab.num_embeddings)

    @abc.abstractmethod
    def train_counts(self) -> np.ndarray:
        """Events of each dense id in the training sequences, int64 ``[num_embeddings]``."""

    @abc.abstractmethod
    def num_examples(self, objective: str, max_len: int) -> int:
        """Training examples in one epoch."""

    @abc.abstractmethod
    def target_counts(self, objective: str, max_len: int) -> np.ndarray:
        """How often each dense id is a training target, ``[num_embeddings]`` (0 = none counted)."""

    @abc.abstractmethod
    def batches(
        self, objective: str, max_len: int, batch_size: int, seed: int, first_epoch: int, epochs: int
    ) -> tf.data.Dataset:
        """Training batches ``(x, y)`` of epochs ``first_epoch .. epochs - 1``, each epoch in an
        order fixed by ``(seed, epoch)`` (a resumed run sees what the uninterrupted one would)."""

    @abc.abstractmethod
    def evaluate(self, model: ModelArtifact, split: str) -> dict[str, float]:
        """The protocol's metrics on the ``valid`` or ``test`` users ({} when there are none)."""

    @abc.abstractmethod
    def baseline(self, split: str) -> dict[str, float]:
        """The most-popular baseline (training counts, history excluded) on the same users."""


class InMemoryData(TrainingData):
    """Interactions loaded whole (:func:`retrieval.data.load_interactions`) and split by the
    configured protocol (:func:`make_protocol`); examples are cut once and kept in memory.

    Attributes:
        rules: the protocol: its split, training users and scoring.
        features: per side feature, per user the encoded events, aligned with the sequences.

    Args:
        config: the run's configuration (``data`` and ``model.side_features`` are read).
    """

    def __init__(self, config: Config) -> None:
        data = build_sequences(load_interactions(config.data.path, config.data.format))
        self.rules = make_protocol(config.data, data)
        side = build_side_vocab(data, parse_side_features(config.model.side_features))
        external = None
        if data.item_attributes:
            external = {data.vocab.ids[i - 1]: list(a) for i, a in sorted(data.item_attributes.items())}
        attributes = data.item_attributes or {}
        users = len(data.users)
        super().__init__(data.vocab, side, attributes, external, self.rules.name, self.rules.shown, users)
        self.features = user_event_features(data, side)
        self._examples: dict[tuple[str, int], tuple[dict[str, np.ndarray], np.ndarray]] = {}

    def examples(self, objective: str, max_len: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """:func:`~retrieval.examples.make_examples` of the training users' sequences (cut once)."""
        if (objective, max_len) not in self._examples:
            train = self.rules.split.train
            lengths = [len(s) for s in train]
            side = history_features(self.features, self.rules.train_users, lengths, request_time=False)
            self._examples[objective, max_len] = make_examples(objective, {"items": train, **side}, max_len)
        return self._examples[objective, max_len]

    def train_counts(self) -> np.ndarray:
        return item_counts(self.rules.split.train, self.vocab.num_embeddings)

    def num_examples(self, objective: str, max_len: int) -> int:
        return len(self.examples(objective, max_len)[1])

    def target_counts(self, objective: str, max_len: int) -> np.ndarray:
        return target_counts(self.examples(objective, max_len)[1], self.vocab.num_embeddings)

    def batches(
        self, objective: str, max_len: int, batch_size: int, seed: int, first_epoch: int, epochs: int
    ) -> tf.data.Dataset:
        x, y = self.examples(objective, max_len)
        return epoch_batches(x, y, batch_size, seed, first_epoch, epochs)

    def _held_out(self, split: str) -> tuple[Sequence[np.ndarray], Any, dict[str, list[np.ndarray]]]:
        """The split's histories, targets and the histories' side features."""
        parts = self.rules.split
        if split == "valid":
            histories, targets, users = parts.valid_histories, parts.valid_targets, parts.valid_users
        elif split == "test":
            histories, targets, users = parts.test_histories, parts.test_targets, parts.test_users
        else:
            raise ValueError(f"unknown split {split!r}; expected valid or test")
        return histories, targets, history_features(self.features, users, [len(h) for h in histories])

    def evaluate(self, model: ModelArtifact, split: str) -> dict[str, float]:
        histories, targets, features = self._held_out(split)
        return self.rules.evaluate(model, histories, targets, features) if len(targets) else {}

    def baseline(self, split: str) -> dict[str, float]:
        histories, targets, _ = self._held_out(split)
        if not len(targets):
            return {}
        return self.rules.baseline(popularity_top_k(self.train_counts(), histories, BASELINE_K), targets)


class PreparedData(TrainingData):
    """A prepared folder (``tools/prepare_data.py``, :mod:`retrieval.parquet_data`), streamed:
    examples are cut a row group at a time (:func:`retrieval.streaming.streaming_dataset`) and
    evaluation reads a batch of users at a time, so memory does not grow with the data.

    The folder holds the leave-one-out split only. Batches are shuffled through a buffer of
    ``data.shuffle_buffer`` examples and the order of the row groups, not over the whole epoch
    as in memory: the same seed gives the same run, but not the in-memory run's batches.

    Args:
        config: the run's configuration.

    Raises:
        ValueError: another protocol than ``loo``, or side feature ``gap_now`` (not streamed yet).
    """

    def __init__(self, config: Config) -> None:
        path = config.data.path
        if config.data.protocol != "loo":
            raise ValueError(
                f"{path} is a prepared folder, which holds the leave-one-out split only: protocol "
                f"{config.data.protocol!r} needs the raw interactions (train on them instead)"
            )
        features = parse_side_features(config.model.side_features)
        if "gap_now" in features:
            raise ValueError("side feature 'gap_now' is not supported with a prepared folder yet")
        self.prepared = pdata.open_prepared(path)
        self.shuffle_buffer = config.data.shuffle_buffer
        vocab = pdata.read_vocab(self.prepared)
        external = pdata.read_item_attributes(self.prepared)
        dense: dict[int, tuple[str, ...]] = {}
        if external:
            ids = vocab.lookup(list(external))
            dense = {int(i): tuple(a) for i, a in zip(ids, external.values(), strict=True) if i}
        side = pdata.side_vocab(self.prepared, features)
        users = int(self.prepared.meta["users"])
        super().__init__(vocab, side, dense, external, "loo-full", LOO_SHOWN, users)

    def train_counts(self) -> np.ndarray:
        return pdata.item_counts(self.prepared, "train")

    def num_examples(self, objective: str, max_len: int) -> int:
        return pdata.count_examples(self.prepared, objective, max_len)

    def target_counts(self, objective: str, max_len: int) -> np.ndarray:
        return pdata.target_counts(self.prepared, objective)

    def batches(
        self, objective: str, max_len: int, batch_size: int, seed: int, first_epoch: int, epochs: int
    ) -> tf.data.Dataset:
        side = self.side if self.side.event_features else None
        buffer = self.shuffle_buffer
        return streaming_dataset(
            self.prepared, objective, max_len, batch_size, seed, first_epoch, epochs, buffer, side
        )

    def evaluate(self, model: ModelArtifact, split: str) -> dict[str, float]:
        return evaluate_prepared(model, self.prepared, split)

    def baseline(self, split: str) -> dict[str, float]:
        return popularity_prepared(self.prepared, split)


def open_training_data(config: Config) -> TrainingData:
    """The data ``config.data`` names: :class:`PreparedData` for format ``prepared`` (or, with
    no format given, a path holding a prepared folder), else :class:`InMemoryData`."""
    data_format = config.data.format
    if data_format is None and pdata.is_prepared(config.data.path):
        data_format = "prepared"
    return PreparedData(config) if data_format == "prepared" else InMemoryData(config)


class FullRankingValidation(keras.callbacks.Callback):
    """Computes full-ranking validation metrics after every ``every`` epochs.

    The data's shown metrics (e.g. ``val_ndcg@10``) go into the epoch logs (and so the
    progress bar and any later callback); the full set per epoch is kept in ``history``.
    """

    def __init__(self, data: TrainingData, max_len: int, every: int = 1) -> None:
        super().__init__()
        self.data, self.max_len, self.every = data, max_len, every
        self.history: list[dict[str, float]] = []

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if (epoch + 1) % self.every:
            return
        assert isinstance(self.model, TwoTowerModel)
        artifact = live_artifact(self.model, self.data.vocab, self.max_len, self.data.side)
        metrics = self.data.evaluate(artifact, "valid")
        if not metrics:  # no validation users
            return
        self.history.append({"epoch": epoch + 1, **metrics})
        if logs is not None:  # shown on the progress bar; every metric goes to metrics.json
            logs.update({f"val_{k}": metrics[k] for k in self.data.shown})


# --------------------------------------------------------------------------- task and optimizer


def item_counts(sequences: Sequence[np.ndarray], num_embeddings: int) -> np.ndarray:
    """Occurrences of each dense id in ``sequences``, int64 ``[num_embeddings]``."""
    flat = np.concatenate(sequences) if len(sequences) else np.zeros(0, np.int64)
    return np.bincount(flat, minlength=num_embeddings)


def target_counts(targets: np.ndarray, num_embeddings: int) -> np.ndarray:
    """How often each dense id is a training target (0 = no target: not counted), ``[num_embeddings]``."""
    flat = np.asarray(targets).ravel()
    return np.bincount(flat[flat > 0], minlength=num_embeddings)


def target_probabilities(targets: np.ndarray, num_embeddings: int) -> np.ndarray:
    """How often each dense id is a training target, as a share of all targets, ``[num_embeddings]``."""
    counts = target_counts(targets, num_embeddings).astype(np.float64)
    return counts / max(counts.sum(), 1.0)


def build_training_task(config: TrainConfig, counts: np.ndarray, as_targets: np.ndarray) -> RetrievalTask:
    """The task ``config.loss`` names, its sampler over ``counts`` (training events per item) and
    its in-batch correction from ``as_targets``, how often each item is a training target
    (``[num_embeddings]``, :meth:`TrainingData.target_counts`)."""
    sampler = CandidateSampler.from_counts(counts, config.sampler, config.sampler_alpha, seed=config.seed)
    frequency = np.asarray(as_targets, np.float64)
    return build_task(
        config.loss,
        sampler=sampler,
        num_negatives=config.num_negatives,
        target_probabilities=frequency / max(frequency.sum(), 1.0),
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


def peak_learning_rate(config: TrainConfig, replicas: int = 1) -> float:
    """``learning_rate``, times the replicas (``lr_scaling=linear``) or their square root (``sqrt``).

    Raises:
        ValueError: an unknown scaling.
    """
    if config.lr_scaling not in LR_SCALINGS:
        raise ValueError(f"unknown lr_scaling {config.lr_scaling!r}; choose one of {LR_SCALINGS}")
    factor = {"none": 1.0, "linear": float(replicas), "sqrt": float(np.sqrt(replicas))}[config.lr_scaling]
    return config.learning_rate * factor


def make_optimizer(config: TrainConfig, total_steps: int, replicas: int = 1) -> keras.optimizers.Optimizer:
    """Adam (AdamW when ``weight_decay`` > 0, biases and normalisation scales not decayed) with
    the configured warm-up and decay over ``total_steps``, peaking at :func:`peak_learning_rate`;
    with ``dense_gradients``, embedding gradients are summed per row first (:func:`_sum_rows_first`)."""
    peak = peak_learning_rate(config, replicas)
    if config.lr_schedule == "constant" and config.warmup_steps == 0:
        rate: float | WarmupDecay = peak
    else:
        rate = WarmupDecay(peak, total_steps, config.warmup_steps, config.lr_schedule)
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
    ``tests/test_distributed.py``) although their gradients agree to 1e-7. Summing first gives
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


@dataclass(frozen=True)
class _Outputs:
    """Where a process writes (``out``, ``run``) and the checkpoint it resumes from (if any)."""

    out: Path
    run: Path
    restore: Path | None


@contextmanager
def _outputs(
    config: Config, out: Path, strategy: tf.distribute.Strategy, resume: bool, overwrite: bool
) -> Iterator[_Outputs]:
    """The chief writes the artifact ``out`` and the run folder ``out.partial``. Every other
    worker runs the same steps (collective ops need them all, saving included) into a scratch
    folder it deletes at the end, and on ``resume`` restores the chief's checkpoint, which it
    must therefore see (``out`` on storage shared by the workers)."""
    run = run_folder(out)
    if is_chief(strategy):
        if out.exists() and not overwrite:
            raise FileExistsError(f"{out} already exists (pass --overwrite to replace it)")
        load = _resume_state(config, run, resume, overwrite)
        yield _Outputs(out, run, run / "checkpoint" if load else None)
        return
    try:
        load = resume and _resume_state(config, run, resume, overwrite=False)
    except ValueError as e:
        raise ValueError(f"{e} (seen from a non-chief worker: --resume needs {run} on shared storage)") from e
    with tempfile.TemporaryDirectory(prefix="retrieval-worker-") as folder:
        scratch = Path(folder)
        yield _Outputs(scratch / out.name, scratch / run.name, run / "checkpoint" if load else None)


def train(
    config: Config,
    out: Path,
    overwrite: bool = False,
    verbose: int | str = "auto",
    resume: bool = False,
    tensorboard: Path | None = None,
    strategy: tf.distribute.Strategy | None = None,
) -> dict[str, Any]:
    """Trains the configured towers and writes the model artifact to ``out``.

    The run keeps a checkpoint of every epoch in ``out.partial/`` (removed once ``out`` is
    written); ``resume`` continues an interrupted run from its last checkpoint (same
    configuration, ``train.epochs`` may be raised; the strategy and the number of workers may
    change).

    Under a strategy with several replicas, ``train.batch_size`` is the global batch (each
    replica computes ``batch_size / replicas`` examples of it) and the loss and its gradient are
    those of one device with that batch (:class:`GlobalBatchTask`). In a cluster every worker
    calls this function with the same arguments; only the chief writes ``out`` and its
    checkpoints (:func:`is_chief`).

    Args:
        config: the resolved configuration.
        out: the model artifact folder to write.
        overwrite: replace an existing ``out`` (and discard an interrupted run in ``out.partial``).
        verbose: Keras' progress output (0 = none).
        resume: continue the run in ``out.partial``.
        tensorboard: write TensorBoard logs (loss, learning rate, validation metrics) there (chief only).
        strategy: a ``tf.distribute`` strategy (:func:`make_strategy`); None = the current one.

    Returns:
        the metrics written to ``out/metrics.json``: ``validation`` (per epoch and final),
        ``test``, ``baseline_popularity_test``, the training time and the epochs trained.
    """
    if not config.data.path:
        raise ValueError("config.data.path is empty: give the interactions to train on")
    strategy = strategy or tf.distribute.get_strategy()
    replicas = int(strategy.num_replicas_in_sync)
    if replicas > 1 and config.model.attention_penalty > 0:
        # The tower adds it with add_loss, which TwoTowerModel.compute_loss does not share out.
        raise ValueError("model.attention_penalty is not supported with several replicas yet")
    if not is_chief(strategy):
        tensorboard = None
    with _outputs(config, Path(out), strategy, resume, overwrite) as where:
        return _train(config, where, overwrite, verbose, tensorboard, strategy)


def _train(
    config: Config,
    where: _Outputs,
    overwrite: bool,
    verbose: int | str,
    tensorboard: Path | None,
    strategy: tf.distribute.Strategy,
) -> dict[str, Any]:
    """:func:`train` once the outputs are settled."""
    keras.utils.set_random_seed(config.train.seed)
    data = open_training_data(config)
    t, max_len, replicas = config.train, config.model.max_len, int(strategy.num_replicas_in_sync)
    # Variables (weights, optimizer slots, the sampler's seed counters) are created in the
    # strategy's scope: mirrored on every replica.
    with strategy.scope():
        model = build_model(config.model, data.vocab.num_embeddings, data.side, data.attribute_table())
        model.set_objective(t.objective)
    examples = data.num_examples(model.objective, max_len)
    if not examples:
        raise ValueError(f"{config.data.path}: no training examples (every user needs >= 2 training events)")
    log.info(
        "%d users, %d items, %d training examples (objective %s, loss %s), %d replica(s)",
        data.users, len(data.vocab), examples, model.objective, t.loss, replicas,
    )  # fmt: skip
    steps = -(-examples // t.batch_size)
    with strategy.scope():
        task = build_training_task(t, data.train_counts(), data.target_counts(model.objective, max_len))
        model.task = task if replicas == 1 else GlobalBatchTask(task)
        # XLA has no kernel for the sampler and was slower on CPU (MEASURED.md): keep it off.
        model.compile(optimizer=make_optimizer(t, t.epochs * steps, replicas), jit_compile=False)

    validation = FullRankingValidation(data, max_len, t.eval_every)
    early = EarlyStopping(f"val_{data.shown[0]}", t.patience) if t.patience > 0 else None
    state: dict[str, Any] = {}
    if where.restore is not None:
        with strategy.scope():  # the optimizer's variables are built here
            state, best_weights = load_checkpoint(where.restore, model, model.task.variables)
        validation.history = list(state["validation"])
        if early is not None and state.get("early_stopping"):
            early.set_state(state["early_stopping"])
            early.best_weights = best_weights
        log.info("resuming %s after epoch %d", where.restore.parent, state["epoch"])
    else:
        where.run.mkdir(parents=True, exist_ok=True)
        config.save(where.run / "config.json")
    first_epoch = int(state.get("epoch", 0))
    checkpoint = EpochCheckpoint(where.run / "checkpoint", model.task.variables, validation, early, state)
    callbacks: list[keras.callbacks.Callback] = [validation, *([early] if early else []), checkpoint]
    if tensorboard is not None:
        callbacks.append(TensorBoardLogger(tensorboard))

    if first_epoch < t.epochs and not (early is not None and early.stopped):
        dataset = data.batches(model.objective, max_len, t.batch_size, t.seed, first_epoch, t.epochs)
        if model.objective == "cloze":  # fresh masks every step, seeded by (run seed, step)
            mask_id = model.user_tower.mask_id

            def mask(step: Any, batch: tuple[dict[str, Any], Any]) -> tuple[dict[str, Any], Any]:
                seed = tf.stack([tf.constant(t.seed, tf.int64), step])
                return mask_items(*batch, mask_id, t.mask_ratio, seed=seed)

            dataset = dataset.enumerate(start=first_epoch * steps).map(mask, tf.data.AUTOTUNE)
        options = tf.data.Options()
        # Every worker reads the whole input and keeps its replicas' share of each global batch
        # (a generator cannot be split by files), so the batches are the single-device ones.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        dataset = dataset.with_options(options).prefetch(tf.data.AUTOTUNE)
        with _fit_under(strategy, model):
            model.fit(
                dataset,
                epochs=t.epochs,
                initial_epoch=first_epoch,
                steps_per_epoch=steps,
                callbacks=callbacks,
                verbose=verbose,
                shuffle=False,  # the data orders every epoch itself (seeded)
            )
    elif early is not None:  # the run had already finished training: export its best weights
        early.restore_best(model)

    artifact = live_artifact(model, data.vocab, max_len, data.side)
    metrics = {
        "validation": _exported_validation(validation.history, early),
        "validation_per_epoch": validation.history,
        "protocol": data.protocol,
        "test": data.evaluate(artifact, "test"),
        "baseline_popularity_test": data.baseline("test"),
        "train_loss_per_epoch": checkpoint.losses,
        "train_seconds": round(checkpoint.seconds, 1),
        "train_examples": examples,
        "objective": model.objective,
        "loss": t.loss,
        "replicas": replicas,
        "epochs_trained": len(checkpoint.losses),
        "best_epoch": early.best_epoch if early is not None else None,
        "stopped_early": bool(early is not None and early.stopped),
    }
    save_model(model, config, data.vocab, data.side, metrics, where.out, overwrite, data.item_attributes)
    shutil.rmtree(where.run, ignore_errors=True)  # the artifact is complete: the checkpoints are done with
    _wait_for_workers(strategy)
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
