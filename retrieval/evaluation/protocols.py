"""A saved model's metrics on a dataset under one protocol (:mod:`retrieval.data.splits`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from index import VectorIndex
from retrieval.artifacts.model import ModelArtifact, data_options
from retrieval.data.features import history_features, user_event_features
from retrieval.data.interactions import Interactions, SequenceData, build_sequences
from retrieval.data.loaders import load_interactions
from retrieval.data.splits import DEFAULT_SEED, PROTOCOLS, comirec_split, leave_one_out, sample_negatives
from retrieval.data.vocab import PAD
from retrieval.evaluation.evaluate import category_codes, evaluate_comirec, evaluate_ranking, evaluate_sampled


@dataclass(frozen=True)
class ProtocolResult:
    """One protocol's metrics on one split of a dataset.

    Attributes:
        protocol: one of ``retrieval.data.splits.PROTOCOLS``.
        split: ``"valid"`` or ``"test"``.
        metrics: metric name -> mean over the evaluated users.
        users: users evaluated.
        settings: what else fixes the numbers (seed, negatives, the user split's sizes).
    """

    protocol: str
    split: str
    metrics: dict[str, float]
    users: int
    settings: dict[str, Any] = field(default_factory=dict)

    def record(self, **context: Any) -> dict[str, Any]:
        """A flat JSON-able record: ``context`` (model, data, search...), the protocol, split,
        users, settings and every metric; what ``tools/evaluate.py`` prints and saves."""
        return {
            **context,
            "protocol": self.protocol,
            "split": self.split,
            "users": self.users,
            **self.settings,
            **self.metrics,
        }


def _model_categories(interactions: Interactions, model: ModelArtifact) -> np.ndarray | None:
    """Every item's first attribute in the data (items without events too), as codes over the
    model's ids; ``None`` when the data has no attributes."""
    items = interactions.items
    if "attributes" not in items.columns:
        return None
    dense = model.vocab.lookup(items["item"].astype(str).tolist())
    first = {
        int(d): str(values[0])
        for d, values in zip(dense, items["attributes"], strict=True)
        if d != PAD and values is not None and len(values)
    }
    return category_codes(first, len(model.item_embeddings))


def in_model_ids(
    to_model: np.ndarray, histories: Sequence[np.ndarray], features: Mapping[str, Sequence[np.ndarray]]
) -> tuple[list[np.ndarray], dict[str, list[np.ndarray]]]:
    """Data-id histories -> model ids (``to_model``, 0 = unknown), the items the model does not
    know dropped, with their values of each side feature (aligned with the histories)."""
    raw = [to_model[h] for h in histories]
    known = [h != PAD for h in raw]
    kept = {name: [v[k] for v, k in zip(values, known, strict=True)] for name, values in features.items()}
    return [h[k] for h, k in zip(raw, known, strict=True)], kept


@dataclass(frozen=True)
class _InModel:
    """A dataset's sequences seen by a model: ``to_model`` maps data ids to the model's, and
    ``per_user`` holds every user's side features in the model's vocabularies."""

    data: SequenceData
    to_model: np.ndarray
    per_user: dict[str, tuple[np.ndarray, ...]]

    @classmethod
    def of(cls, model: ModelArtifact, data: SequenceData) -> _InModel:
        """``data`` through ``model``'s item and side-feature vocabularies."""
        to_model = np.concatenate([[PAD], model.vocab.lookup(list(data.vocab.ids))])  # data id -> model id
        return cls(data, to_model, user_event_features(data, model.side))

    def histories(
        self, users: np.ndarray, histories: Sequence[np.ndarray]
    ) -> tuple[list[np.ndarray], dict[str, list[np.ndarray]]]:
        """Data-id histories (prefixes of the users' sequences) in model ids (:func:`in_model_ids`),
        with each side feature cut alike."""
        cut = history_features(self.per_user, users, [len(h) for h in histories])
        return in_model_ids(self.to_model, histories, cut)


def evaluate_protocol(
    model: ModelArtifact,
    data_path: str | Path,
    protocol: str = "loo",
    data_format: str | None = None,
    split: str = "test",
    index: VectorIndex | None = None,
    *,
    seed: int = DEFAULT_SEED,
    num_negatives: int = 100,
    folds: int = 1,
    fold: int = 0,
) -> ProtocolResult:
    """A trained model's metrics on a dataset under one protocol (:mod:`retrieval.data.splits`).

    The data is split as the protocol says and its item ids are mapped through the model's
    vocabulary: history items the model does not know are dropped, unknown targets count
    as misses.

    * ``loo``: leave-one-out, full ranking, history excluded: ``hr``, ``ndcg``, ``recall``
      at 5, 10, 20, 50 (exact, or through ``index``).
    * ``loo-sampled``: leave-one-out, the target against ``num_negatives`` items the user
      never interacted with (drawn with ``seed``): ``sampled_hr@10``, ``sampled_ndcg@10``.
    * ``comirec``: ComiRec's user split (``seed``; with ``folds`` > 1 test fold ``fold``, as
      ``data.folds`` and ``data.fold`` train), history = first 80%, targets = the rest:
      ``recall``, ``hitrate``, ``ndcg`` (ComiRec's definitions) and, when the data has item
      attributes, ``diversity`` (categories = first attribute), at 20 and 50.

    Raises:
        ValueError: unknown protocol or split, ``index`` with ``loo-sampled``, too few items to
            sample negatives from, or ``folds`` > 1 with another protocol than ``comirec``.
    """
    _check_request(protocol, split, folds, index)
    interactions = load_interactions(data_path, data_format, **data_options(model.path))
    seen = _InModel.of(model, build_sequences(interactions))  # encoded with the model's vocabularies
    if protocol == "comirec":
        return _comirec(model, interactions, seen, split, index, seed, folds, fold)
    return _leave_one_out(model, seen, protocol, split, index, seed, num_negatives)


def _check_request(protocol: str, split: str, folds: int, index: VectorIndex | None) -> None:
    """Refuses an unknown protocol or split, folds outside ``comirec``, an index with ``loo-sampled``."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")
    if split not in ("valid", "test"):
        raise ValueError(f"split must be 'valid' or 'test', got {split!r}")
    if folds > 1 and protocol != "comirec":
        raise ValueError(f"test folds apply to the comirec protocol only, not {protocol!r}")
    if protocol == "loo-sampled" and index is not None:
        raise ValueError("loo-sampled scores the target and its negatives exactly: an index does not apply")


def _comirec(
    model: ModelArtifact,
    interactions: Interactions,
    seen: _InModel,
    split: str,
    index: VectorIndex | None,
    seed: int,
    folds: int,
    fold: int,
) -> ProtocolResult:
    """:func:`evaluate_protocol` under ``comirec``."""
    test = split == "test"
    parts = comirec_split(seen.data.sequences, seed, folds=folds, fold=fold)
    users = parts.test_users if test else parts.valid_users
    histories, features = seen.histories(users, parts.test_histories if test else parts.valid_histories)
    targets = [seen.to_model[t] for t in (parts.test_targets if test else parts.valid_targets)]
    categories = _model_categories(interactions, model)
    metrics = evaluate_comirec(model, histories, targets, features, categories, index=index)
    settings = {
        "seed": seed,
        "folds": folds,
        "fold": fold,
        "train_users": len(parts.train_users),
        "valid_users": len(parts.valid_users),
        "test_users": len(parts.test_users),
        "dropped_users": len(parts.dropped_users),
    }
    return ProtocolResult("comirec", split, metrics, len(users), settings)


def _leave_one_out(
    model: ModelArtifact,
    seen: _InModel,
    protocol: str,
    split: str,
    index: VectorIndex | None,
    seed: int,
    num_negatives: int,
) -> ProtocolResult:
    """:func:`evaluate_protocol` under ``loo`` or ``loo-sampled``."""
    test = split == "test"
    loo = leave_one_out(seen.data)
    users = loo.test_users if test else loo.valid_users
    histories, features = seen.histories(users, loo.test_histories if test else loo.valid_histories)
    targets = seen.to_model[loo.test_targets if test else loo.valid_targets]
    if protocol == "loo":
        metrics = evaluate_ranking(model, histories, targets, features=features, index=index)
        return ProtocolResult(protocol, split, metrics, len(users))
    # Everything the user ever touched (the validation and test items too) stays out of the negatives.
    user_items = [seen.to_model[seen.data.sequences[u]] for u in users]
    negatives = sample_negatives(user_items, len(model.vocab), num_negatives, seed)
    metrics = evaluate_sampled(model, histories, targets, negatives, features)
    return ProtocolResult(protocol, split, metrics, len(users), {"seed": seed, "negatives": num_negatives})


def evaluate_model_on_data(
    model: ModelArtifact,
    data_path: str | Path,
    data_format: str | None = None,
    split: str = "test",
    index: VectorIndex | None = None,
) -> dict[str, float]:
    """Leave-one-out full-ranking metrics of a trained model on a dataset (exact, or through
    ``index``): :func:`evaluate_protocol` with ``loo``."""
    return evaluate_protocol(model, data_path, "loo", data_format, split, index).metrics
