"""What :func:`retrieval.train.train` trains and validates on: the :class:`TrainingData` interface.

Two sources implement it: the interactions loaded in memory (:class:`InMemoryData`, every format
of :mod:`retrieval.data`, split and scored by a :class:`Protocol`) or streamed from a prepared
folder (:class:`PreparedData`, :mod:`retrieval.parquet_data`, leave-one-out only);
:func:`open_training_data` picks the one a configuration names.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from retrieval import parquet_data as pdata
from retrieval.config import Config, DataConfig
from retrieval.data import LeaveOneOut, SequenceData, build_sequences, leave_one_out, load_interactions
from retrieval.evaluate import (
    category_codes,
    evaluate_comirec,
    evaluate_ranking,
    full_ranking_top_k,
    popularity_top_k,
)
from retrieval.examples import make_examples
from retrieval.features import (
    SideVocab,
    attribute_table,
    build_side_vocab,
    history_features,
    parse_side_features,
    user_event_features,
)
from retrieval.metrics import (
    COMIREC_KS,
    DEFAULT_KS,
    comirec_metrics,
    ranking_metrics,
    user_comirec_metrics,
    user_ranking_metrics,
)
from retrieval.model_artifact import Features, ModelArtifact
from retrieval.protocols import ComirecSplit, comirec_split
from retrieval.streaming import evaluate_prepared, popularity_prepared, streaming_dataset
from retrieval.vocab import ItemVocab

BASELINE_K = 50


@dataclass(frozen=True)
class Protocol:
    """How an in-memory run splits its data and scores itself (``DataConfig.protocol``).

    Attributes:
        name: ``"loo-full"`` or ``"comirec"`` (as in ``tools/evaluate.py --protocol``).
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


TRAINING_PROTOCOLS = ("loo", "loo-refit", "comirec")
"""``DataConfig.protocol`` values."""


def make_protocol(config: DataConfig, data: SequenceData) -> Protocol:
    """The split and scoring of ``config.protocol``.

    Raises:
        ValueError: an unknown protocol.
    """
    if config.protocol in ("loo", "loo-refit"):
        return Protocol(
            "loo-full",
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
        self.length_buckets = config.train.length_buckets
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
        return epoch_batches(x, y, batch_size, seed, first_epoch, epochs, self.length_buckets)

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

    def user_metrics(self, model: ModelArtifact, split: str) -> dict[str, np.ndarray]:
        """The protocol's ranking metrics of every ``valid`` or ``test`` user (exact search), in
        the split's user order: what a paired comparison of two models needs."""
        histories, targets, features = self._held_out(split)
        return self.rules.per_user(full_ranking_top_k(model, histories, self.rules.depth, features), targets)

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


TRIM_MULTIPLE = 8
"""A trimmed batch keeps a multiple of this many columns (fewer shapes to trace)."""
BUCKET_BATCHES = 64
"""Length bucketing sorts runs of this many batches' examples by length."""


def epoch_batches(
    x: dict[str, np.ndarray],
    y: np.ndarray,
    batch_size: int,
    seed: int,
    first_epoch: int,
    epochs: int,
    length_buckets: bool = False,
) -> tf.data.Dataset:
    """Batches for epochs ``first_epoch .. epochs - 1`` back to back, each epoch in its own order.

    Epoch ``e``'s order depends only on ``(seed, e)``, so a resumed run sees the batches the
    uninterrupted run would have. Every batch drops the leading columns that are padding in all
    its rows (inputs ``[B, L]`` left-padded, and ``[B, L]`` targets), keeping a multiple of
    :data:`TRIM_MULTIPLE` columns: the towers ignore padding, so only the work changes.

    With ``length_buckets`` (:func:`bucketed_order`) a batch holds histories of similar
    lengths, so trimming removes most of the padding (mixed-length batching), and every epoch
    still has ``ceil(N / batch_size)`` batches. With one target per example a batch has
    ``batch_size`` rows; with ``[N, L]`` targets (``all_positions``, ``cloze``) the rows vary
    and each batch holds about the same number of targets (the epoch's targets over its
    batches), as a mixed batch does on average: long histories come a few to a batch, short
    ones many.
    """
    n = len(y)
    x_all = {k: tf.constant(v) for k, v in x.items()}
    y_all = tf.constant(y)
    num_batches = -(-n // batch_size)
    lengths = np.count_nonzero(x["items"], axis=1)
    targets = np.count_nonzero(y.reshape(n, -1), axis=1)

    def epoch_order(e: Any) -> tf.data.Dataset:
        key = tf.stack([tf.constant(seed, tf.int64), e])
        order = tf.argsort(tf.random.stateless_uniform([n], key))
        if not length_buckets:
            return tf.data.Dataset.from_tensor_slices(order).batch(batch_size)
        rows, splits = tf.numpy_function(
            lambda order, e: bucketed_order(order, lengths, targets, batch_size, seed, int(e)),
            [order, e],
            [tf.int64, tf.int64],
            stateful=False,
        )
        rows.set_shape([n])
        splits.set_shape([num_batches + 1])
        return tf.data.Dataset.from_tensor_slices(tf.RaggedTensor.from_row_splits(rows, splits))

    def gather(rows: Any) -> tuple[Any, ...]:
        return _trim_padding({k: tf.gather(v, rows) for k, v in x_all.items()}, tf.gather(y_all, rows))

    epochs_ds = tf.data.Dataset.range(first_epoch, epochs)
    return epochs_ds.flat_map(epoch_order).map(
        gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )


def bucketed_order(
    order: np.ndarray, lengths: np.ndarray, targets: np.ndarray, batch_size: int, seed: int, epoch: int
) -> tuple[np.ndarray, np.ndarray]:
    """One epoch's length-bucketed batches: the rows of ``order`` regrouped, and the batch bounds.

    The shuffled ``order`` is cut into runs of :data:`BUCKET_BATCHES` × ``batch_size``
    examples; each run is sorted by history length (``lengths``) and cut into
    ``ceil(run / batch_size)`` batches holding about equal numbers of targets (``targets``
    per example: every batch ``batch_size`` rows when each example has one), never empty; the
    batches of a run are shuffled (seeded by ``(seed, epoch)``).

    Returns:
        ``rows`` int64 ``[N]`` (a permutation of ``order``) and ``splits`` int64
        ``[num_batches + 1]``: batch ``b`` is ``rows[splits[b]:splits[b + 1]]``.
    """
    rng = np.random.default_rng([seed, epoch, 1])
    run_size = batch_size * BUCKET_BATCHES
    pieces: list[np.ndarray] = []
    for start in range(0, len(order), run_size):
        run = order[start : start + run_size]
        run = run[np.argsort(lengths[run], kind="stable")]
        k = -(-len(run) // batch_size)
        cum = np.cumsum(targets[run], dtype=np.float64)
        # Bound j (1..k-1) where the run's targets reach j/k, kept strictly increasing and
        # inside the run so that every batch has at least one row.
        bounds = np.searchsorted(cum, cum[-1] * np.arange(1, k) / k, side="right")
        j = np.arange(1, k)
        bounds = np.clip(bounds, j, len(run) - (k - j))
        bounds = np.maximum.accumulate(bounds - j) + j
        batches = np.split(run, bounds)
        pieces += [batches[b] for b in rng.permutation(k)]
    splits = np.cumsum([0] + [len(b) for b in pieces])
    return np.concatenate(pieces).astype(np.int64), splits.astype(np.int64)


def _trim_padding(x: dict[str, Any], y: Any) -> tuple[dict[str, Any], Any]:
    """Drops the leading columns of ``[B, L]`` inputs (and ``[B, L]`` targets) that hold no item
    and no target in any row, keeping a multiple of :data:`TRIM_MULTIPLE` (at most ``L``)."""
    items = x["items"]
    full, width = tf.shape(items)[1], items.shape[1]
    used = tf.reduce_any(items != 0, axis=0)
    if y.shape.rank == 2:
        used = used | tf.reduce_any(y != 0, axis=0)
    first = tf.argmax(tf.cast(used, tf.int32), output_type=tf.int32)  # the first column in use
    needed = tf.where(tf.reduce_any(used), full - first, 1)
    keep = tf.minimum(full, -(-needed // TRIM_MULTIPLE) * TRIM_MULTIPLE)

    def cut(v: Any) -> Any:
        return v[:, full - keep :] if v.shape.rank == 2 and v.shape[1] == width else v

    return {k: cut(v) for k, v in x.items()}, cut(y)
