"""Training: data -> split -> training with a named loss (on one device or several) -> model artifact.

:func:`train` reads its data through a :class:`~retrieval.training.inputs.TrainingData`
(:mod:`retrieval.training.inputs`), builds the task (:func:`build_training_task`) and the
optimizer (:func:`make_optimizer`), fits under a ``tf.distribute`` strategy
(:mod:`retrieval.training.distribute`) for the configured budget (:meth:`TrainConfig.budget`:
optimizer steps, or epochs) while validating on full rankings (:class:`FullRankingValidation`)
and stopping when validation stops improving (:class:`EarlyStopping`), and writes the model
artifact (:func:`save_model`).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from retrieval.artifacts.model import (
    ATTRIBUTE_EMBEDDINGS_FILE,
    EMBEDDINGS_FILE,
    KIND,
    SIDE_FILE,
    TOWER_DIR,
    TOWER_TABLE_FILE,
)
from retrieval.data.features import SideVocab
from retrieval.data.tables import frame_source
from retrieval.data.vocab import ItemVocab
from retrieval.storage.folders import link_or_copy, remove_folder, remove_stale_temporaries, write_artifact
from retrieval.storage.manifest import ArtifactError, read_manifest
from retrieval.training.callbacks import (
    EarlyStopping,
    EpochCheckpoint,
    EpochTimer,
    TensorBoardLogger,
    load_checkpoint,
    run_folder,
)
from retrieval.training.config import Budget, Config, TrainConfig
from retrieval.training.distribute import (
    GlobalBatchTask,
    fit_under,
    is_chief,
    wait_for_workers,
)
from retrieval.training.examples import mask_items
from retrieval.training.inputs import TrainingData, open_training_data
from retrieval.training.losses.samplers import CandidateSampler
from retrieval.training.losses.task import RetrievalTask, build_task
from retrieval.training.model import TwoTowerModel, build_model, export_user_tower, item_table, scoring_table
from retrieval.training.optimizer import make_optimizer, make_schedule
from retrieval.training.schedules import Cooldown, WarmupDecay
from retrieval.training.validation import FullRankingValidation, live_artifact

log = logging.getLogger(__name__)


def trained_loss(config: TrainConfig, num_embeddings: int) -> str:
    """``config.loss``, except that shared sampled negatives at least as many as the items
    (``num_embeddings - 1``, padding aside) make the full softmax: the loss they estimate, exact
    and over fewer logits."""
    shared = config.negatives_per_positive == 0
    if config.loss == "sampled_softmax" and shared and config.num_negatives >= num_embeddings - 1:
        return "full_softmax"
    return config.loss


def build_training_task(config: TrainConfig, counts: np.ndarray, as_targets: np.ndarray) -> RetrievalTask:
    """The task :func:`trained_loss` names, its sampler over ``counts`` (training events per
    item) and its in-batch correction from ``as_targets``, how often each item is a training
    target (``[num_embeddings]``, :meth:`TrainingData.target_counts`)."""
    sampler = CandidateSampler.from_counts(counts, config.sampler, config.sampler_alpha, seed=config.seed)
    frequency = np.asarray(as_targets, np.float64)
    return build_task(
        trained_loss(config, len(frequency)),
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
            remove_folder(run)
        return False
    if not (run / "config.json").is_file():
        raise ValueError(f"nothing to resume: {run} does not exist (train without --resume)")
    saved = Config.from_dict(json.loads((run / "config.json").read_text()))
    # Only the budget may change on resume (to train a run for longer).
    saved_flat = {f"{s}.{k}": v for s, fields in saved.to_dict().items() for k, v in fields.items()}
    given_flat = {f"{s}.{k}": v for s, fields in config.to_dict().items() for k, v in fields.items()}
    budget = ("train.epochs", "train.max_steps")
    differ = sorted(k for k in given_flat if k not in budget and given_flat[k] != saved_flat.get(k))
    if differ:
        changes = ", ".join(f"{k}: {saved_flat.get(k)!r} -> {given_flat[k]!r}" for k in differ)
        raise ValueError(f"cannot resume {run} with another configuration ({changes})")
    if not checkpoint.is_dir():
        log.info("%s has no checkpoint yet: training from the first epoch", run)
        return False
    return True


def _finished_run(config: Config, out: Path) -> TrainResult | None:
    """The metrics of ``out`` when it is the finished artifact of this very configuration (a run
    killed after its artifact was in place, before its run folder was gone): the run folder is
    cleared and there is nothing left to train. ``None`` when ``out`` is not that."""
    try:
        read_manifest(out, KIND)
        same = json.loads((out / "config.json").read_text()) == config.to_dict()
    except (ArtifactError, OSError, ValueError):
        return None
    if not same:
        return None
    log.info("%s is already complete: clearing its run folder", out)
    remove_folder(run_folder(out))
    remove_stale_temporaries(out.parent)
    return TrainResult.from_dict(json.loads((out / "metrics.json").read_text()))


@dataclass(frozen=True)
class TrainResult:
    """What a training run measured, as its artifact's ``metrics.json`` holds it (:meth:`to_dict`).

    The ``*_per_epoch`` lists and ``best_epoch`` count the run's rounds (:class:`Budget`): data
    epochs with a budget in epochs (``train.epochs``), else ``train.eval_every_steps`` steps each.

    Attributes:
        validation: the validation metrics of the exported weights (the best validation's with
            early stopping, else the last; empty without validation users).
        validation_per_epoch: every validation, ``{"epoch": round, "step": s, metric: value, ...}``.
        protocol: the evaluation protocol's name (``loo`` or ``comirec``).
        test: the exported weights' test metrics.
        baseline_popularity_test: the most-popular baseline's on the same test.
        train_loss_per_epoch: the mean training loss of each round.
        train_seconds: training time, validation included.
        train_seconds_per_epoch: each round's training time, validation excluded.
        train_examples: examples per epoch.
        objective, loss: what was trained (``train.objective`` resolved, :func:`trained_loss`).
        replicas: devices the batch was shared by.
        epochs_trained: whole epochs of the data run.
        best_epoch: the round exported with early stopping, ``None`` without it.
        stopped_early: whether early stopping ended the run.
        steps_per_epoch: optimizer steps in one epoch of the data.
        steps_trained: optimizer steps run.
        best_step: the steps trained by the exported weights with early stopping (``None``
            without it): the budget a ``loo-refit`` run of the same configuration reuses
            (``train.max_steps``).
    """

    validation: dict[str, float]
    validation_per_epoch: list[dict[str, float]]
    protocol: str
    test: dict[str, float]
    baseline_popularity_test: dict[str, float]
    train_loss_per_epoch: list[float]
    train_seconds: float
    train_seconds_per_epoch: list[float]
    train_examples: int
    objective: str
    loss: str
    replicas: int
    epochs_trained: int
    best_epoch: int | None
    stopped_early: bool
    steps_per_epoch: int = 0  # 0: a metrics.json written before these were recorded
    steps_trained: int = 0
    best_step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> TrainResult:
        """From a ``metrics.json``."""
        return cls(**payload)


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
    data: pd.DataFrame | str | Path | None = None,
) -> TrainResult:
    """Trains the configured towers and writes the model artifact to ``out``.

    The interactions are ``config.data.path``, or ``data``: a path (which replaces it) or a
    pandas DataFrame, read as a table with ``config.data.columns`` and ``timestamp_unit``. The
    artifact's ``config.json`` then names the frame by its shape and SHA-256 in ``data.path``
    (:func:`~retrieval.data.tables.frame_source`): honest about what trained it, and refused
    by the loaders if given again as a path (pass the frame again, or ``--data``).

    Example:
        >>> frame = pd.DataFrame({"user": [...], "item": [...], "timestamp": [...]})
        >>> result = train(Config(), "runs/mine", data=frame)
        >>> result.test["ndcg@10"]

    The run keeps a checkpoint after every round (:class:`Budget`) in ``out.partial/`` (removed
    once ``out`` is written); ``resume`` continues an interrupted run from its last checkpoint
    (same configuration, ``train.max_steps`` or ``train.epochs`` may be raised; the strategy and
    the number of workers may change).

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
        strategy: a ``tf.distribute`` strategy (:func:`~retrieval.training.distribute.make_strategy`);
            None = the current one.
        data: the interactions, instead of ``config.data.path``: a path, or a DataFrame.

    Returns:
        What the run measured, also written to ``out/metrics.json``.
    """
    frame = data if isinstance(data, pd.DataFrame) else None
    if data is not None:
        path = frame_source(frame) if frame is not None else str(data)
        config = replace(config, data=replace(config.data, path=path))
    if not config.data.path:
        raise ValueError("config.data.path is empty: give the interactions to train on")
    strategy = strategy or tf.distribute.get_strategy()
    replicas = int(strategy.num_replicas_in_sync)
    if replicas > 1 and config.model.attention_penalty > 0:
        # The tower adds it with add_loss, which TwoTowerModel.compute_loss does not share out.
        raise ValueError("model.attention_penalty is not supported with several replicas yet")
    if not is_chief(strategy):
        tensorboard = None
    elif resume and not overwrite and (finished := _finished_run(config, Path(out))) is not None:
        return finished
    with _outputs(config, Path(out), strategy, resume, overwrite) as where:
        return _train(config, where, overwrite, verbose, tensorboard, strategy, frame)


def _train(
    config: Config,
    where: _Outputs,
    overwrite: bool,
    verbose: int | str,
    tensorboard: Path | None,
    strategy: tf.distribute.Strategy,
    frame: pd.DataFrame | None = None,
) -> TrainResult:
    """:func:`train` once the outputs are settled."""
    keras.utils.set_random_seed(config.train.seed)
    data = open_training_data(config, frame)
    model = _built_model(config, data, strategy)
    plan = _plan(config, data, model.objective, int(strategy.num_replicas_in_sync))
    task, rate = _compile(model, config, data, plan, strategy)
    run = _start_run(config, data, model, task.variables, rate, plan.budget, where, strategy, tensorboard)
    if run.first_round < plan.budget.rounds and not (run.early is not None and run.early.stopped):
        _fit(model, config, data, plan, run, strategy, verbose)
    elif run.early is not None:  # the run had already finished training: export its best weights
        run.early.restore_best(model)
    result = _result(model, config, data, plan, run)
    metrics = result.to_dict()
    save_model(model, config, data.vocab, data.side, metrics, where.out, overwrite, data.item_attributes)
    remove_folder(where.run)  # the artifact is complete: the checkpoints are done with
    wait_for_workers(strategy)
    return result


@dataclass(frozen=True)
class _Plan:
    """What a run trains: ``examples`` and ``steps`` per epoch of the data, its ``budget``, its
    ``loss`` (:func:`trained_loss`) and the ``replicas`` sharing each batch."""

    examples: int
    steps: int
    budget: Budget
    loss: str
    replicas: int


@dataclass(frozen=True)
class _Run:
    """The callbacks a run trains under (restored on resume) and the round it starts from."""

    validation: FullRankingValidation
    early: EarlyStopping | None
    timer: EpochTimer
    checkpoint: EpochCheckpoint
    callbacks: list[keras.callbacks.Callback]
    first_round: int


def _built_model(config: Config, data: TrainingData, strategy: tf.distribute.Strategy) -> TwoTowerModel:
    """The configured two-tower model with its objective set, built in the strategy's scope."""
    # Variables (weights, optimizer slots, the sampler's seed counters) are created in the
    # strategy's scope: mirrored on every replica.
    with strategy.scope():
        model = build_model(config.model, data.vocab.num_embeddings, data.side, data.attribute_table())
        model.set_objective(config.train.objective)
    return model


def _plan(config: Config, data: TrainingData, objective: str, replicas: int) -> _Plan:
    """The run's examples, steps, budget and loss, logged; refuses data without examples."""
    t = config.train
    examples = data.num_examples(objective, config.model.max_len)
    if not examples:
        raise ValueError(f"{config.data.path}: no training examples (every user needs >= 2 training events)")
    loss = trained_loss(t, data.vocab.num_embeddings)
    log.info(
        "%d users, %d items, %d training examples (objective %s, loss %s%s), %d replica(s)",
        data.users, len(data.vocab), examples, objective, loss,
        "" if loss == t.loss else f": {t.num_negatives} negatives cover the catalogue", replicas,
    )  # fmt: skip
    steps = -(-examples // t.batch_size)  # per epoch of the data
    return _Plan(examples, steps, t.budget(steps), loss, replicas)


def _compile(
    model: TwoTowerModel, config: Config, data: TrainingData, plan: _Plan, strategy: tf.distribute.Strategy
) -> tuple[RetrievalTask, float | WarmupDecay]:
    """Gives ``model`` its task and compiles it with the optimizer; returns both and the learning rate."""
    t = config.train
    with strategy.scope():
        counts, as_targets = data.train_counts(), data.target_counts(model.objective, config.model.max_len)
        task = build_training_task(t, counts, as_targets)
        model.task = task if plan.replicas == 1 else GlobalBatchTask(task)
        # XLA off: it has no kernel for the candidate sampler, and compiled steps ran slower on CPU.
        rate = make_schedule(t, plan.budget.schedule_steps, plan.replicas)
        model.compile(optimizer=make_optimizer(t, rate), jit_compile=False)
    return model.task, rate


def _stoppers(
    config: Config, data: TrainingData, rate: float | WarmupDecay, budget: Budget
) -> tuple[EarlyStopping | None, Cooldown | None]:
    """Early stopping (``train.patience``, not under ``loo-refit``) and the cooldown of a plateau schedule."""
    t = config.train
    cooldown = None
    if isinstance(rate, WarmupDecay) and rate.kind == "plateau":
        cooldown = Cooldown(rate, t.cooldown_fraction, budget.schedule_steps, budget.round_steps)
    early = None
    if t.patience > 0 and config.data.protocol == "loo-refit":
        log.info("data.protocol=loo-refit has no validation: train.patience is not used, the budget is fixed")
    elif t.patience > 0:
        early = EarlyStopping(f"val_{data.shown[0]}", t.patience, cooldown)
    return early, cooldown


def _start_run(
    config: Config,
    data: TrainingData,
    model: TwoTowerModel,
    variables: list[Any],
    rate: float | WarmupDecay,
    budget: Budget,
    where: _Outputs,
    strategy: tf.distribute.Strategy,
    tensorboard: Path | None,
) -> _Run:
    """The run's callbacks, restored from ``where.restore`` on resume (with the model and the
    task's ``variables``), else a new run folder."""
    validation = FullRankingValidation(data, config.model.max_len, budget.validate_every, budget.round_steps)
    early, cooldown = _stoppers(config, data, rate, budget)
    state: dict[str, Any] = {}
    if where.restore is not None:
        state = _restore(where.restore, model, variables, strategy, validation, early, cooldown, budget)
    else:
        where.run.mkdir(parents=True, exist_ok=True)
        config.save(where.run / "config.json")
    timer = EpochTimer(state.get("epoch_seconds", []))
    checkpoint = EpochCheckpoint(
        where.run / "checkpoint", variables, validation, early, state, timer, cooldown
    )
    ends = [c for c in (early, cooldown) if c is not None]
    callbacks: list[keras.callbacks.Callback] = [timer, validation, *ends, checkpoint]
    if tensorboard is not None:
        callbacks.append(TensorBoardLogger(tensorboard))
    return _Run(validation, early, timer, checkpoint, callbacks, int(state.get("epoch", 0)))


def _restore(
    checkpoint: Path,
    model: TwoTowerModel,
    variables: list[Any],
    strategy: tf.distribute.Strategy,
    validation: FullRankingValidation,
    early: EarlyStopping | None,
    cooldown: Cooldown | None,
    budget: Budget,
) -> dict[str, Any]:
    """Loads ``checkpoint`` into the model, the task's ``variables`` and the callbacks; returns its state."""
    with strategy.scope():  # the optimizer's variables are built here
        state, best_weights = load_checkpoint(checkpoint, model, variables)
    validation.history = list(state["validation"])
    if early is not None and state.get("early_stopping"):
        early.set_state(state["early_stopping"])
        early.best_weights = best_weights
    if cooldown is not None and state.get("cooldown"):
        cooldown.set_state(state["cooldown"])
    done = int(state["epoch"])  # Keras' epochs: the budget's rounds
    step = done * budget.round_steps
    log.info("resuming %s after epoch %d (step %d)", checkpoint.parent, done, step)
    return state


def _fit(
    model: TwoTowerModel,
    config: Config,
    data: TrainingData,
    plan: _Plan,
    run: _Run,
    strategy: tf.distribute.Strategy,
    verbose: int | str,
) -> None:
    """Fits ``model`` from the run's first round to the budget's last (early stopping may end it sooner)."""
    dataset = _dataset(model, config.train, data, config.model.max_len, plan, run.first_round)
    with fit_under(strategy, model):
        model.fit(
            dataset,
            epochs=plan.budget.rounds,
            initial_epoch=run.first_round,
            steps_per_epoch=plan.budget.round_steps,
            callbacks=run.callbacks,
            verbose=verbose,
            shuffle=False,  # the data orders every epoch itself (seeded)
        )


def _dataset(
    model: TwoTowerModel, t: TrainConfig, data: TrainingData, max_len: int, plan: _Plan, first_round: int
) -> tf.data.Dataset:
    """The training batches from ``first_round`` on, masked afresh every step for ``cloze``."""
    steps, budget = plan.steps, plan.budget
    first_step = first_round * budget.round_steps
    # Data epochs back to back, from the one the run stopped in (a round may end mid-epoch).
    first_epoch, last_epoch = first_step // steps, -(-budget.steps // steps)
    dataset = data.batches(model.objective, max_len, t.batch_size, t.seed, first_epoch, last_epoch)
    dataset = dataset.skip(first_step - first_epoch * steps)
    if model.objective == "cloze":  # fresh masks every step, seeded by (run seed, step)
        mask_id = model.user_tower.mask_id

        def mask(step: Any, batch: tuple[Any, ...]) -> tuple[Any, ...]:
            seed = tf.stack([tf.constant(t.seed, tf.int64), step])
            masked = mask_items(batch[0], batch[1], mask_id, t.mask_ratio, seed=seed)
            return (*masked, *batch[2:])  # and the batch's sample weight, when it has one

        dataset = dataset.enumerate(start=first_step).map(mask, tf.data.AUTOTUNE)
    options = tf.data.Options()
    # Every worker reads the whole input and keeps its replicas' share of each global batch
    # (a generator cannot be split by files), so the batches are the single-device ones.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


def _result(model: TwoTowerModel, config: Config, data: TrainingData, plan: _Plan, run: _Run) -> TrainResult:
    """What the run measured: the exported weights' validation and test metrics, losses, times, steps."""
    artifact = live_artifact(model, data.vocab, config.model.max_len, data.side, run.validation.tower)
    early, budget = run.early, plan.budget
    steps_trained = len(run.checkpoint.losses) * budget.round_steps
    best_round = early.best_epoch if early is not None else None
    return TrainResult(
        validation=_exported_validation(run.validation.history, early),
        validation_per_epoch=run.validation.history,
        protocol=data.protocol,
        test=data.evaluate(artifact, "test"),
        baseline_popularity_test=data.baseline("test"),
        train_loss_per_epoch=run.checkpoint.losses,
        train_seconds=round(run.checkpoint.seconds, 1),
        train_seconds_per_epoch=[round(x, 3) for x in run.timer.seconds],  # validation excluded
        train_examples=plan.examples,
        objective=model.objective,
        loss=plan.loss,
        replicas=plan.replicas,
        epochs_trained=steps_trained // plan.steps,
        best_epoch=best_round,
        stopped_early=bool(early is not None and early.stopped),
        steps_per_epoch=plan.steps,
        steps_trained=steps_trained,
        best_step=None if best_round is None else best_round * budget.round_steps,
    )


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
    """Writes the model artifact (layout in :mod:`retrieval.artifacts.model`) atomically.

    ``attributes`` (external item id -> attribute values, e.g. genres) is saved when given.
    """
    table = item_table(model)
    scored = scoring_table(model, table)
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
        "explanation": model.user_tower.explanation,
        "tower_items": len(vocab),
        "similarity": model.similarity,
    }
    with write_artifact(out, KIND, meta, overwrite=overwrite) as tmp:
        config.save(tmp / "config.json")
        vocab.save(tmp / "vocab.json")
        if attributes:
            (tmp / "item_attributes.json").write_text(json.dumps(attributes, ensure_ascii=False))
        if side.features:
            side.save(tmp / SIDE_FILE)
        if model.item_tower.attribute_embedding is not None:  # what embeds items added later
            np.save(tmp / ATTRIBUTE_EMBEDDINGS_FILE, np.asarray(model.item_tower.attribute_table, np.float32))
        export_user_tower(model, tmp / TOWER_DIR, ("items", *side.event_features), table)
        if scored is table:
            link_or_copy(tmp / TOWER_TABLE_FILE, tmp / EMBEDDINGS_FILE)  # one file: pages shared
        else:  # cosine: the index's vectors are unit length, the tower reads the trained ones
            np.save(tmp / EMBEDDINGS_FILE, scored)
        model.save(tmp / "model.keras")
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2))
