"""Trains a ranker on the retriever's candidates and evaluates it reranking the test users' lists."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from rankers import Ranker, build_ranker, ranker_class
from retrieval.artifacts.model import data_options
from retrieval.artifacts.ranker import UNCLICKED_RANKERS, save_ranker
from retrieval.artifacts.ranker_inputs import AttributeTable
from retrieval.artifacts.ranker_scorer import RankerScorer, with_attributes
from retrieval.data.interactions import build_sequences
from retrieval.data.loaders import load_interactions
from retrieval.data.vocab import PAD
from retrieval.ranking.blend import fit_bias, fit_blend, fit_list_blend, list_loss
from retrieval.ranking.config import RankerConfig, check_config
from retrieval.ranking.data import CandidateLists, ClickExamples, RankingData, build_ranking_data
from retrieval.ranking.metrics import ScoreFn, auc, evaluate_reranking, gauc, list_metrics
from retrieval.serving.retriever import Retriever
from towers.saving import constructor_parameters

log = logging.getLogger(__name__)


class _Validation(keras.callbacks.Callback):
    """Validation AUC / GAUC before training (epoch 0) and after every epoch, the best weights
    kept, early stopping on GAUC.

    Epoch 0 makes the untrained ranker a candidate too: with ``retrieval_score`` it orders as the
    retriever does, so a training run that never improves on that order on the validation
    clicks keeps it instead of a worse one.
    """

    def __init__(
        self,
        dataset: tf.data.Dataset | None,
        examples: ClickExamples,
        patience: int,
        name: str,
        blend: str | None = None,
        lists: CandidateLists | None = None,
        score_lists: ScoreFn | None = None,
    ) -> None:
        super().__init__()
        self.dataset, self.examples, self.patience, self.name = dataset, examples, patience, name
        # retrieval_fit "lists" / "clicks": fit (g, w, b) on the validation lists or clicks.
        self.blend, self.lists, self.score_lists = blend, lists, score_lists
        self.best_blend: tuple[float, float, float] | None = None
        self.history: list[dict[str, Any]] = []
        self.best: float = -np.inf
        self.best_epoch = 0
        self.best_weights: list[np.ndarray] | None = None
        self.wait = 0
        self.started = time.perf_counter()

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.dataset is not None:
            self.started = time.perf_counter()
            self.record(0, {"epoch": 0})

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.record(epoch + 1, {"epoch": epoch + 1, "loss": float((logs or {}).get("loss", np.nan))})
        if self.patience and self.wait >= self.patience:
            log.info("%s: no better validation for %d epochs, stopping", self.name, self.patience)
            self.model.stop_training = True

    def record(self, epoch: int, record: dict[str, Any]) -> None:
        """Validates, logs and keeps the weights when they are the best so far."""
        if self.dataset is not None:
            record.update(self._validate())
        record["seconds"] = round(time.perf_counter() - self.started, 1)
        self.history.append(record)
        better = self._keep_if_best(epoch, record)
        shown = ", ".join(f"{k} {v:.4f}" for k, v in record.items() if k.startswith(("loss", "val_")))
        if "blend" in record:
            shown += f", blend (g, w, b) {record['blend']}"
        log.info(
            "%s epoch %d: %s [%.1f s]%s",
            self.name,
            epoch,
            shown,
            record["seconds"],
            " (best)" if better else "",
        )

    def _validate(self) -> dict[str, Any]:
        """The validation clicks' AUC and GAUC (``val_auc``, ``val_gauc``) under the fitted blend
        (``blend``: ``[g, w, b]``) when there is one, and with ``retrieval_fit="lists"`` the
        validation lists' loss and NDCG@10 (``val_list_loss``, ``val_list_ndcg``)."""
        scores = self.model.predict(self.dataset, verbose=0)
        valid = self.examples.candidates > 0
        labels = self.examples.labels > 0
        retrieval = self.examples.retrieval_scores
        out: dict[str, Any] = {}
        # With a blend the model's logits are its own part alone (g = 1, w = b = 0).
        if self.blend == "clicks":
            g, w, b = fit_blend(scores, retrieval, labels, valid)
        elif self.blend == "lists" and self.lists is not None and self.score_lists is not None:
            (g, w, b), found = _fit_on_lists(self.lists, self.score_lists, scores, retrieval, labels, valid)
            out.update(found)
        if self.blend:
            scores = g * scores + w * retrieval + b
            out["blend"] = [round(v, 4) for v in (g, w, b)]
        group, _ = gauc(scores, labels, valid)
        out.update(val_auc=auc(scores[valid], labels[valid]), val_gauc=group)
        return out

    def _keep_if_best(self, epoch: int, record: dict[str, Any]) -> bool:
        """Keeps the weights (and blend) when ``record`` is the best so far; counts the epochs
        since the best otherwise. Monitored: the lists' loss, else GAUC, else the training loss."""
        if "val_list_loss" in record:
            monitored = -record["val_list_loss"]
        else:
            monitored = record.get("val_gauc", -record.get("loss", np.inf))
        better = bool(monitored > self.best)
        if better:
            self.best, self.best_epoch, self.wait = monitored, epoch, 0
            self.best_weights = [np.array(w) for w in self.model.get_weights()]
            self.best_blend = tuple(record["blend"]) if "blend" in record else None
        elif epoch:
            self.wait += 1
        return better


def _fit_on_lists(
    lists: CandidateLists,
    score_lists: ScoreFn,
    scores: np.ndarray,
    retrieval: np.ndarray,
    labels: np.ndarray,
    valid: np.ndarray,
) -> tuple[tuple[float, float, float], dict[str, float]]:
    """``(g, w, b)``: ``g``, ``w`` fitted on the validation lists (:func:`fit_list_blend`), ``b``
    calibrating the blend on the validation clicks; with the blended lists' ``val_list_loss`` and
    ``val_list_ndcg`` (NDCG@10).

    Args:
        scores, retrieval, labels, valid: ``[E, C]`` the validation clicks' own logits, retrieval
            scores, labels and real candidates.
    """
    present = lists.candidates > 0
    own = score_lists(
        lists.histories, np.where(present, lists.candidates, PAD), lists.unclicked, lists.scores
    )
    targets = present & (lists.candidates == lists.targets[:, None])
    g, w = fit_list_blend(own, lists.scores, targets, present)
    b = fit_bias(g * scores + w * retrieval, labels, valid)
    blended = np.where(present, g * own + w * np.where(present, lists.scores, 0.0) + b, -np.inf)
    found = list_metrics(lists.candidates, blended, lists.targets)
    return (g, w, b), {
        "val_list_loss": list_loss(blended, targets, present),
        "val_list_ndcg": found["ndcg@10"],
    }


@dataclass(frozen=True)
class RankerMetrics:
    """What a ranker's training measured (:func:`train_ranker`); its artifact's ``metrics.json``
    holds :meth:`to_dict`.

    Attributes:
        ranker: the ranker's name.
        model_version: the retrieval model's version.
        users, candidates, candidate_recall: the test users reranked, the retrieved list's
            length, and how often the target is in it.
        retrieval, reranked: NDCG@10, HR@10, AUC, GAUC of the retriever's order and the ranker's.
        validation: the monitored validation metrics of the kept epoch.
        validation_per_epoch: every validation (epoch 0: before training).
        best_epoch, epochs_trained, train_seconds: the kept epoch, epochs run, time.
        retrieval_term: the blend ``g``, ``w``, ``b`` of a ranker reading the retrieval score, or
            ``None``.
        settings: how the examples were built (:attr:`RankingData.settings`).
    """

    ranker: str
    model_version: str
    users: int
    candidates: int
    candidate_recall: float
    retrieval: dict[str, float]
    reranked: dict[str, float]
    validation: dict[str, float]
    validation_per_epoch: list[dict[str, float]]
    best_epoch: int
    epochs_trained: int
    train_seconds: float
    retrieval_term: dict[str, float] | None
    settings: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """One flat record: the fields, the retrieval term when there is one, the settings."""
        flat = [f.name for f in fields(self) if f.name not in ("retrieval_term", "settings")]
        record = {name: getattr(self, name) for name in flat}
        if self.retrieval_term is not None:
            record["retrieval_term"] = self.retrieval_term
        return {**record, **self.settings}


@dataclass(frozen=True)
class TrainedRanker:
    """A trained ranker with its scorer and its metrics (:func:`train_ranker`)."""

    name: str
    model: Ranker
    kwargs: dict[str, Any]
    scorer: RankerScorer
    metrics: RankerMetrics


def ranker_kwargs(
    config: RankerConfig, num_items: int, attributes: AttributeTable | None, retriever_dim: int
) -> dict[str, Any]:
    """Constructor arguments of the configured ranker (seeded when it takes a ``seed``).

    Raises:
        ValueError: ``item_init="retriever"`` with a ``dim`` other than the retriever's.
    """
    dim = config.dim or retriever_dim
    if config.item_init == "retriever" and dim != retriever_dim:
        raise ValueError(
            f"item_init=retriever copies the retriever's {retriever_dim}-d item embeddings: "
            f"dim must be {retriever_dim} (or 0), not {dim}"
        )
    kwargs: dict[str, Any] = {
        "num_items": num_items,
        "dim": dim,
        "max_len": config.max_len,
        "num_attributes": 0 if attributes is None else attributes.num_attributes,
        **config.options,
    }
    parameters = constructor_parameters(ranker_class(config.ranker))
    if "seed" in parameters:
        kwargs.setdefault("seed", config.seed)
    if "context_size" in parameters:
        kwargs["context_size"] = config.context_size
    return kwargs


def _dataset(
    examples: ClickExamples,
    table: tf.Tensor | None,
    keys: dict[str, bool],
    batch_size: int,
    seed: int | None,
) -> tf.data.Dataset:
    """Batches of ``(inputs, labels)`` (shuffled with ``seed``; in order when ``None``), attributes
    added; ``keys`` says which optional inputs to feed (:meth:`ClickExamples.inputs`)."""
    dataset = tf.data.Dataset.from_tensor_slices((examples.inputs(**keys), examples.labels))
    if seed is not None:
        dataset = dataset.shuffle(len(examples), seed=seed, reshuffle_each_iteration=True)

    @tf.autograph.experimental.do_not_convert  # type: ignore[untyped-decorator]  # TensorFlow is untyped
    def add_attributes(x: dict[str, tf.Tensor], y: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        return with_attributes(x, table), y

    dataset = dataset.batch(batch_size).map(add_attributes, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)


def train_ranker(
    config: RankerConfig,
    data: RankingData,
    out: Path | None = None,
    *,
    overwrite: bool = False,
    verbose: int | str = 2,
) -> TrainedRanker:
    """Trains ``config.ranker`` on ``data``'s click examples, evaluates it by reranking the test
    candidates and (with ``out``) writes its artifact (:mod:`retrieval.artifacts.ranker`).

    The run is seeded (weights, example order, the rankers' own sampling); progress goes to the
    log (one line per epoch) and to Keras' progress output (``verbose``).

    Returns:
        The ranker, its scorer and the metrics written to ``out/metrics.json``: ``retrieval`` vs
        ``reranked`` (NDCG@10, HR@10, AUC, GAUC), validation per epoch, training time.

    Raises:
        ValueError: an invalid configuration or no training examples.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
    """
    check_config(config)
    if out is not None and Path(out).exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass overwrite to replace it)")
    if not len(data.train):
        raise ValueError("no training examples: every user needs at least 2 training events")
    keras.utils.set_random_seed(config.seed)
    attributes = data.attributes if config.attributes else None
    model, kwargs = _build(config, data, attributes)
    uses_unclicked = config.ranker in UNCLICKED_RANKERS and config.unclicked != "none"
    train_set, valid_set = _datasets(config, data, model, attributes, uses_unclicked)
    blend = _start_blend(config, model, data, valid_set is not None)
    model.compile(optimizer=keras.optimizers.Adam(config.learning_rate), jit_compile=False)
    # Built here, not by Keras inside the first traced step: tf.function traces a step that
    # creates variables twice.
    model.optimizer.build(model.trainable_variables)
    # Scores lists with the model's current weights (the scorer's graph reads its variables).
    list_scorer = RankerScorer(model, attributes, uses_unclicked) if blend == "lists" else None
    validation = _Validation(
        valid_set, data.valid, config.patience, config.ranker, blend, data.valid_lists,
        None if list_scorer is None else list_scorer.score,
    )  # fmt: skip
    log.info(
        "training %s: %d examples of %d candidates, %d validation, %d attributes",
        config.ranker, len(data.train), data.train.candidates.shape[1], len(data.valid),
        kwargs["num_attributes"],
    )  # fmt: skip
    seconds = _fit(model, train_set, validation, config.epochs, verbose)
    scorer = RankerScorer(model, attributes, uses_unclicked)
    metrics = _metrics(config, data, model, scorer, validation, seconds)
    if out is not None:
        save_ranker(
            Path(out), model, config.ranker, kwargs, data.vocab, data.model_version,
            attributes=attributes, config=config.to_dict(), metrics=metrics.to_dict(), overwrite=overwrite,
        )  # fmt: skip
    return TrainedRanker(config.ranker, model, kwargs, scorer, metrics)


def _datasets(
    config: RankerConfig,
    data: RankingData,
    model: Ranker,
    attributes: AttributeTable | None,
    uses_unclicked: bool,
) -> tuple[tf.data.Dataset, tf.data.Dataset | None]:
    """The training batches (shuffled) and the validation batches (``None`` without validation
    examples), with the optional inputs ``model`` reads."""
    keys = {"unclicked": uses_unclicked, "scores": model.retrieval_score, "context": model.context_size > 0}
    table = None if attributes is None else tf.constant(attributes.table, tf.int32)
    train_set = _dataset(data.train, table, keys, config.batch_size, config.seed)
    valid_set = _dataset(data.valid, table, keys, 4 * config.batch_size, None) if len(data.valid) else None
    return train_set, valid_set


def _fit(
    model: Ranker, train_set: tf.data.Dataset, validation: _Validation, epochs: int, verbose: int | str
) -> float:
    """Trains ``model`` and keeps the best validated weights and blend; returns the training seconds."""
    started = time.perf_counter()
    model.fit(train_set, epochs=epochs, callbacks=[validation], verbose=verbose, shuffle=False)
    seconds = time.perf_counter() - started
    if validation.best_weights is not None:
        model.set_weights(validation.best_weights)
    if validation.best_blend is not None:
        model.set_blend(*validation.best_blend)
    return seconds


def _build(
    config: RankerConfig, data: RankingData, attributes: AttributeTable | None
) -> tuple[Ranker, dict[str, Any]]:
    """The configured ranker, built, and its constructor arguments.

    Raises:
        ValueError: as :func:`ranker_kwargs`, or examples holding less context than it reads.
    """
    kwargs = ranker_kwargs(config, len(data.vocab), attributes, int(data.item_embeddings.shape[1]))
    model: Ranker = build_ranker(config.ranker, **kwargs)
    model.build()
    if config.item_init == "retriever":
        # The retriever learnt its item vectors from every training event; the ranker, trained on
        # a few clicks per user, starts from them instead of from noise (row 0, padding, is 0).
        model.item_tower.embedding.embeddings.assign(np.asarray(data.item_embeddings, np.float32))
    if model.context_size and data.train.context.shape[1] < model.context_size + 1:
        raise ValueError(
            f"the examples hold {data.train.context.shape[1]} context items, the ranker reads "
            f"{model.context_size + 1}: build the data with context_size={model.context_size}"
        )
    return model, kwargs


def _start_blend(config: RankerConfig, model: Ranker, data: RankingData, validated: bool) -> str | None:
    """Sets the ranker's blend ``g, w, b`` up for training and says where it is fitted:
    ``"lists"`` or ``"clicks"`` after each epoch on held-out data (:class:`_Validation`), the
    ranker's own part trained alone; ``None`` with the ranker (or without a retrieval score)."""
    blend = None
    if model.retrieval_score and config.retrieval_fit != "joint" and validated:
        blend = "lists" if config.retrieval_fit == "lists" and data.valid_lists is not None else "clicks"
    if blend:  # the ranker's own part alone; g, w, b are fitted on held-out data
        model.set_blend(1.0, 0.0, 0.0)
        for variable in model.blend_variables:
            variable.trainable = False
    elif model.retrieval_score:
        # w = 1, b = 0 orders as the retriever but is badly calibrated (raw inner products far
        # from click log-odds): the first epoch would spend itself on w and b at the learning
        # rate's pace, the ranker's own part compensating meanwhile. Start from the logistic fit
        # of the training clicks on the retrieval score instead: the same order (w > 0), calibrated.
        train = data.train
        _, w, b = fit_blend(
            np.zeros_like(train.retrieval_scores),
            train.retrieval_scores,
            train.labels > 0,
            train.candidates > 0,
        )
        if w > 0:
            model.retrieval_weight.assign(w)
            model.retrieval_bias.assign(b)
    return blend


def _metrics(
    config: RankerConfig,
    data: RankingData,
    model: Ranker,
    scorer: RankerScorer,
    validation: _Validation,
    seconds: float,
) -> RankerMetrics:
    """The trained ranker's metrics (:func:`train_ranker`): the test lists reranked, validation."""
    found = evaluate_reranking(data.test, {config.ranker: scorer.score})
    best = next((h for h in validation.history if h["epoch"] == validation.best_epoch), {})
    return RankerMetrics(
        ranker=config.ranker,
        model_version=data.model_version,
        users=found["users"],
        candidates=found["candidates"],
        candidate_recall=found["candidate_recall"],
        retrieval=found["retrieval"],
        reranked=found["rerankers"][config.ranker],
        validation={k: v for k, v in best.items() if k.startswith("val_")},
        validation_per_epoch=validation.history,
        best_epoch=validation.best_epoch,
        epochs_trained=sum(1 for h in validation.history if h["epoch"] > 0),
        train_seconds=round(seconds, 1),
        retrieval_term=_retrieval_term(model),
        settings=dict(data.settings),
    )


def load_retrieval(model_dir: Path, index_dir: Path) -> Retriever:
    """The retriever of a model folder and its index folder (versions checked)."""
    return Retriever.from_dirs(Path(model_dir), Path(index_dir))


def _retrieval_term(model: Ranker) -> dict[str, float] | None:
    """The learned ``g``, ``w``, ``b`` of a ranker reading the retrieval scores (else ``None``)."""
    if not model.retrieval_score:
        return None
    names = ("ranker_scale", "retrieval_weight", "retrieval_bias")
    values = (float(np.asarray(v)) for v in model.blend_variables)
    return dict(zip(names, values, strict=True))


def train_ranker_from_dirs(
    config: RankerConfig,
    model_dir: Path,
    index_dir: Path,
    data_path: str | Path,
    out: Path,
    *,
    data_format: str | None = None,
    overwrite: bool = False,
    verbose: int | str = 2,
) -> RankerMetrics:
    """The whole pipeline from folders: load the retriever, build the examples from the data,
    train, evaluate, write the ranker artifact ``out`` (see :func:`train_ranker`).

    Raises:
        ValueError, FileExistsError: as :func:`train_ranker`; ``DataError`` for unreadable data.
        retrieval.storage.manifest.ArtifactError: a missing or mismatched model or index folder.
    """
    check_config(config)
    if Path(out).exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass --overwrite to replace it)")
    retriever = load_retrieval(model_dir, index_dir)
    if retriever.model.side.event_features:
        log.warning(
            "%s reads per-event side features %s: retrieval for the ranking examples gives it item "
            "ids only (unknown events)", model_dir, list(retriever.model.side.event_features),
        )  # fmt: skip
    options = data_options(retriever.model.path)
    sequences = build_sequences(load_interactions(data_path, data_format, **options))
    data = build_ranking_data(retriever.model, retriever.index, sequences, config)
    return train_ranker(config, data, out, overwrite=overwrite, verbose=verbose).metrics
