"""Evaluation streamed from a prepared folder (:mod:`retrieval.data.prepared`): the split's users a
batch at a time, per-user metrics averaged over all of them, which is what one
:func:`~retrieval.evaluation.evaluate.evaluate_ranking` call over every user gives."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from index import VectorIndex
from retrieval.artifacts.model import ModelArtifact
from retrieval.data.prepared.reader import (
    EvalBatch,
    Prepared,
    item_counts,
    iter_eval_batches,
    open_prepared,
    read_vocab,
)
from retrieval.data.vocab import PAD
from retrieval.evaluation.evaluate import evaluate_ranking, popularity_top_k
from retrieval.evaluation.metrics import DEFAULT_KS, ranking_metrics
from retrieval.evaluation.protocols import in_model_ids


def _user_mean(batches: Iterator[tuple[int, dict[str, float]]]) -> tuple[dict[str, float], int]:
    """Per-user means from per-batch means weighted by the batches' user counts, and the users."""
    totals: dict[str, float] = {}
    users = 0
    for n, metrics in batches:
        for name, value in metrics.items():
            totals[name] = totals.get(name, 0.0) + value * n
        users += n
    return ({name: total / users for name, total in totals.items()} if users else {}), users


def _to_model(model: ModelArtifact, prepared: Prepared) -> np.ndarray | None:
    """The folder's dense ids -> the model's (``[num_embeddings]``, 0 = unknown to the model), or
    None when the two vocabularies are the same (a model trained on this folder or its source)."""
    vocab = read_vocab(prepared)
    if model.vocab is None or model.vocab.ids == vocab.ids:
        return None
    return np.concatenate([[PAD], model.vocab.lookup(list(vocab.ids))]).astype(np.int64)


def _in_model_ids(batch: EvalBatch, to_model: np.ndarray | None) -> EvalBatch:
    """``batch`` in the model's ids: history items it does not know dropped (with their side
    features), unknown targets 0 (a miss), as :func:`~retrieval.evaluation.protocols.evaluate_protocol`
    does (:func:`~retrieval.evaluation.protocols.in_model_ids`)."""
    if to_model is None:
        return batch
    histories, features = in_model_ids(to_model, batch.histories, batch.features)
    return EvalBatch(batch.users, tuple(histories), to_model[batch.targets], features)


def evaluate_prepared_users(
    model: ModelArtifact,
    folder: str | Path | Prepared,
    split: str = "valid",
    ks: Sequence[int] = DEFAULT_KS,
    batch_size: int = 1024,
    index: VectorIndex | None = None,
) -> tuple[dict[str, float], int]:
    """Full-ranking metrics (:func:`~retrieval.evaluation.evaluate.evaluate_ranking`, history excluded) of
    the ``valid`` or ``test`` users of a prepared folder, ``batch_size`` users in memory at a
    time; the model's side features are encoded from the folder's event columns. A model with
    another vocabulary is evaluated through it: history items it does not know are dropped,
    unknown targets count as misses.

    Returns:
        ``{"hr@10": …, "ndcg@10": …, …}``, means over all the split's users ({} when none), and
        the number of users evaluated.
    """
    prepared = open_prepared(folder)
    side = model.side if model.side.event_features else None
    to_model = _to_model(model, prepared)

    def per_batch(batch: EvalBatch) -> tuple[int, dict[str, float]]:
        batch = _in_model_ids(batch, to_model)
        features = batch.features or None
        return len(batch.targets), evaluate_ranking(
            model, batch.histories, batch.targets, ks, features, index
        )

    return _user_mean(per_batch(b) for b in iter_eval_batches(prepared, split, batch_size, side))


def evaluate_prepared(
    model: ModelArtifact, folder: str | Path | Prepared, split: str = "valid", **options: Any
) -> dict[str, float]:
    """:func:`evaluate_prepared_users`' metrics alone (``options``: its ``ks``, ``batch_size``, ``index``)."""
    return evaluate_prepared_users(model, folder, split, **options)[0]


def popularity_prepared(
    folder: str | Path | Prepared, split: str = "test", ks: Sequence[int] = DEFAULT_KS, batch_size: int = 1024
) -> dict[str, float]:
    """The most-popular baseline (training counts, history excluded) on a prepared folder's split."""
    counts = item_counts(folder, "train")

    def per_batch(batch: EvalBatch) -> tuple[int, dict[str, float]]:
        top = popularity_top_k(counts, batch.histories, max(ks))
        return len(batch.targets), ranking_metrics(top, batch.targets, ks)

    return _user_mean(per_batch(b) for b in iter_eval_batches(folder, split, batch_size))[0]
