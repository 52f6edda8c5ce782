"""How an in-memory run splits its data and scores itself under its protocol (``DataConfig.protocol``):
the split, the metrics, the popularity baseline and what validation shows each epoch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from retrieval.artifacts.model import Features, ModelArtifact
from retrieval.data.interactions import SequenceData
from retrieval.data.splits import ComirecSplit, LeaveOneOut, comirec_split, leave_one_out
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
        user_ids: the external id of every user (``SequenceData.users``; the split's user
            numbers are positions in it).
    """

    name: str
    split: LeaveOneOut | ComirecSplit
    train_users: Sequence[int] | np.ndarray
    evaluate: Callable[[ModelArtifact, Sequence[np.ndarray], Any, Features | None], dict[str, float]]
    baseline: Callable[[np.ndarray, Any], dict[str, float]]
    per_user: Callable[[np.ndarray, Any], dict[str, np.ndarray]]
    depth: int
    shown: tuple[str, ...]
    user_ids: Sequence[str]

    def held_out_ids(self, split: str) -> list[str]:
        """The external ids of the ``valid`` or ``test`` users, in the split's order (that of
        ``per_user``'s values), so that per-user results of two runs can be paired by user."""
        if split not in ("valid", "test"):
            raise ValueError(f"unknown split {split!r}; expected valid or test")
        users = self.split.valid_users if split == "valid" else self.split.test_users
        return [self.user_ids[u] for u in users]


LOO_SHOWN = ("ndcg@10", "hr@10", "recall@50")


def make_protocol(config: DataConfig, data: SequenceData) -> Protocol:
    """The split and scoring of ``config.protocol``.

    Raises:
        ValueError: an unknown protocol, ``data.folds > 1`` with another protocol than
            ``comirec``, or ``data.fold`` not below ``data.folds``.
    """
    if config.folds > 1 and config.protocol != "comirec":
        raise ValueError(f"data.folds > 1 needs data.protocol=comirec, not {config.protocol!r}")
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
            data.users,
        )
    if config.protocol == "comirec":
        parts = comirec_split(data.sequences, seed=config.split_seed, folds=config.folds, fold=config.fold)
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
            data.users,
        )
    raise ValueError(f"unknown protocol {config.protocol!r}; choose one of {TRAINING_PROTOCOLS}")
