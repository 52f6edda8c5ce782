"""What :func:`retrieval.training.run.train` trains and validates on: the :class:`TrainingData` interface.

Two sources implement it: the interactions loaded in memory (:class:`InMemoryData`, every format
of :mod:`retrieval.data`, split and scored by a :class:`Protocol`) or streamed from a prepared
folder (:class:`PreparedData`, :mod:`retrieval.data.prepared`, leave-one-out only);
:func:`open_training_data` picks the one a configuration names (or a pandas DataFrame given to
:func:`~retrieval.training.run.train`), :func:`read_interactions` reads the in-memory ones.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import tensorflow as tf

from retrieval.artifacts.model import ModelArtifact
from retrieval.data.errors import DataError
from retrieval.data.features import (
    SideVocab,
    attribute_table,
    build_side_vocab,
    history_features,
    parse_side_features,
    user_event_features,
)
from retrieval.data.interactions import Interactions, build_sequences
from retrieval.data.loaders import load_interactions
from retrieval.data.prepared import reader as pdata
from retrieval.data.tables import interactions_from_frame
from retrieval.data.vocab import ItemVocab
from retrieval.evaluation.evaluate import (
    full_ranking_top_k,
    popularity_top_k,
)
from retrieval.evaluation.prepared import evaluate_prepared, popularity_prepared
from retrieval.training.batches import epoch_batches
from retrieval.training.config import Config, DataConfig
from retrieval.training.examples import make_examples
from retrieval.training.protocols import BASELINE_K, LOO_SHOWN, make_protocol
from retrieval.training.streaming import streaming_dataset


class TrainingData(abc.ABC):
    """What :func:`train` trains and validates on; it sees nothing else of the data.

    Attributes:
        vocab: the item vocabulary (dense id ``i`` = ``vocab.ids[i - 1]``, 0 = padding).
        side: the side features the model reads and their vocabularies.
        dense_attributes: dense item id -> attribute values (empty when the data has none).
        item_attributes: external item id -> attribute values, saved with the artifact (or None).
        protocol: the evaluation protocol's name (``loo`` or ``comirec``).
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
        """Item -> attribute ids ``[num_embeddings, A]`` (:func:`retrieval.data.features.attribute_table`)."""
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
    """Interactions loaded whole (:func:`retrieval.data.loaders.load_interactions`) and split by the
    configured protocol (:func:`make_protocol`); examples are cut once and kept in memory.

    Attributes:
        rules: the protocol: its split, training users and scoring.
        features: per side feature, per user the encoded events, aligned with the sequences.

    Args:
        config: the run's configuration (``data`` and ``model.side_features`` are read).
        frame: the interactions as a pandas DataFrame (columns named per ``data.columns``),
            read instead of ``data.path``.
    """

    def __init__(self, config: Config, frame: pd.DataFrame | None = None) -> None:
        data = build_sequences(read_interactions(config.data, frame))
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
        """:func:`~retrieval.training.examples.make_examples` of the training users' sequences (cut once)."""
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
    """A prepared folder (``tools/prepare_data.py``, :mod:`retrieval.data.prepared`), streamed:
    examples are cut a row group at a time (:func:`retrieval.training.streaming.streaming_dataset`) and
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
        super().__init__(vocab, side, dense, external, "loo", LOO_SHOWN, users)

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


def open_training_data(config: Config, frame: pd.DataFrame | None = None) -> TrainingData:
    """The data ``config.data`` names: :class:`PreparedData` for format ``prepared`` (or, with
    no format given, a path holding a prepared folder), else :class:`InMemoryData` (of
    ``frame`` when one is given)."""
    if frame is not None:
        return InMemoryData(config, frame)
    data_format = config.data.format
    if data_format is None and pdata.is_prepared(config.data.path):
        data_format = "prepared"
    return PreparedData(config) if data_format == "prepared" else InMemoryData(config)


def read_interactions(data: DataConfig, frame: pd.DataFrame | None = None) -> Interactions:
    """The interactions ``data`` names, read in memory with its column mapping and timestamp
    unit: ``frame`` when given (a table, :func:`~retrieval.data.tables.interactions_from_frame`),
    else the file or folder at ``data.path`` (:func:`~retrieval.data.loaders.load_interactions`).

    Raises:
        DataError: what the loader refuses; a frame with a format other than ``table``.
    """
    if frame is None:
        return load_interactions(
            data.path, data.format, columns=data.columns, timestamp_unit=data.timestamp_unit
        )
    if data.format not in (None, "table"):
        raise DataError(f"a DataFrame is a table: data.format {data.format!r} does not apply to it")
    return interactions_from_frame(frame, data.columns, data.timestamp_unit)


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
