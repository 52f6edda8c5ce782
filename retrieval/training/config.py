"""The training configuration: one frozen dataclass per section (data, model, train), the
option values each section accepts (``Literal`` aliases, the one source of those names), the
range of every numeric field (a :class:`~retrieval.config.Range` beside it), and the
``config.json`` saved beside every artifact.

Overrides, config files and the checks are :mod:`retrieval.config`'s, as for every config;
``docs/configuration.md`` describes the fields, presets and command-line layers. No TensorFlow
here: a tool checks its whole configuration before loading it.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Literal

from retrieval.config import (
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Range,
    Seed,
    Share,
    check_fields,
    config_from_dict,
    config_to_dict,
    config_to_json,
)
from retrieval.data.columns import TimestampUnit, check_columns

Tower = Literal["youtubednn", "sa", "dr", "mind", "din", "sasrec", "bert4rec", "fmlprec", "bsarec"]
"""``ModelConfig.tower``: the user towers of the ``towers`` registry (a test checks they agree)."""
TrainingProtocol = Literal["loo", "loo-refit", "comirec"]
"""``DataConfig.protocol``: how a run splits its data (:mod:`retrieval.training.protocols`)."""
DataFormat = Literal["movielens", "s3rec", "sasrec", "table", "recbole", "prepared"]
"""``DataConfig.format``: the loaders' formats (:data:`retrieval.data.loaders.FORMATS`) and ``prepared``."""
Fusion = Literal["none", "sum", "concat", "gated", "nova"]
"""``ModelConfig.fusion``: how sasrec and bert4rec fuse side information (``towers.side.FUSIONS``)."""
Similarity = Literal["dot", "cosine"]
"""``ModelConfig.similarity``: how a user vector scores an item (:mod:`retrieval.training.model`)."""
Objective = Literal["last", "all_positions", "cloze"]
"""``TrainConfig.objective``: the training examples (:mod:`retrieval.training.examples`)."""
Loss = Literal["sampled_softmax", "full_softmax", "in_batch", "mixed", "bce", "gbce"]
"""``TrainConfig.loss``: the task :func:`retrieval.training.losses.build_task` builds."""
Sampler = Literal["popularity", "uniform", "log_uniform"]
"""``TrainConfig.sampler``: where sampled negatives come from (:mod:`retrieval.training.losses.samplers`)."""
InterestSelection = Literal["hard", "label_aware", "max"]
"""``TrainConfig.interest_selection``: how K interests meet a target (:mod:`retrieval.training.losses`)."""
LrSchedule = Literal["constant", "cosine", "linear", "plateau"]
"""``TrainConfig.lr_schedule`` (:mod:`retrieval.training.schedules`)."""
LrScaling = Literal["none", "linear", "sqrt"]
"""``TrainConfig.lr_scaling``: the learning rate times 1, the replicas, or their square root."""
Strategy = Literal["default", "mirrored", "multi-worker"]
"""``tools/train.py --strategy``: the ``tf.distribute`` strategy (:mod:`retrieval.training.distribute`)."""

TOWERS: tuple[Tower, ...] = typing.get_args(Tower)
TRAINING_PROTOCOLS: tuple[TrainingProtocol, ...] = typing.get_args(TrainingProtocol)
DATA_FORMATS: tuple[DataFormat, ...] = typing.get_args(DataFormat)
FUSIONS: tuple[Fusion, ...] = typing.get_args(Fusion)
SIMILARITIES: tuple[Similarity, ...] = typing.get_args(Similarity)
OBJECTIVES: tuple[Objective, ...] = typing.get_args(Objective)
LOSSES: tuple[Loss, ...] = typing.get_args(Loss)
SAMPLERS: tuple[Sampler, ...] = typing.get_args(Sampler)
INTEREST_SELECTIONS: tuple[InterestSelection, ...] = typing.get_args(InterestSelection)
LR_SCHEDULES: tuple[LrSchedule, ...] = typing.get_args(LrSchedule)
LR_SCALINGS: tuple[LrScaling, ...] = typing.get_args(LrScaling)
STRATEGIES: tuple[Strategy, ...] = typing.get_args(Strategy)


Dropout = Annotated[float, Range(0, 1, high_open=True)]
"""A share of units or vectors dropped: all of them would leave nothing to train."""
Fraction = Annotated[float, Range(0, 1, low_open=True, high_open=True)]
"""A part of something, neither none of it nor all."""


@dataclass(frozen=True)
class DataConfig:
    """Where the interactions come from and how they are split.

    ``format`` None = detected from the path: ``movielens``, ``s3rec`` or ``table``
    (:func:`retrieval.data.loaders.load_interactions`, loaded in memory), or ``prepared``, a folder
    written by ``tools/prepare_data.py`` and streamed (:mod:`retrieval.data.prepared`; the
    leave-one-out split only). ``protocol`` is ``"loo"`` (leave-one-out: every user trains on
    all but the last two events, validates on the second-to-last, tests on the last),
    ``"loo-refit"`` (the same test, the model trained on every event before it, validation
    events included: no validation, so a fixed budget, ``train.max_steps`` = a ``loo`` run's ``best_step``) or
    ``"comirec"`` (ComiRec's: users split 8:1:1 by ``split_seed``; only training users train;
    validation/test users' first 80% of events predict the remaining 20%). ``folds`` > 1
    (``comirec`` only) cuts the shuffled users into that many disjoint folds instead: fold
    ``fold`` (0-based) tests, 10% of the other users validate, the rest train
    (:func:`retrieval.data.splits.comirec_users`); the ``folds`` runs of folds 0 .. N-1 test
    every user once. ``shuffle_buffer``:
    ``prepared`` only, the examples gathered before each shuffle (memory ~ ``shuffle_buffer``
    × ``max_len`` × 4 bytes per input).

    Tables (CSV, TSV, Parquet, a DataFrame) and RecBole files name their columns as they like:
    ``columns`` maps ours (``user``, ``item``, ``timestamp``, ``title``, side columns such as
    ``rating``) to theirs, e.g. ``{"user": "uid", "item": "product_id", "timestamp": "ts"}``
    (``--set data.columns.user=uid``), and ``timestamp_unit`` says how their times are
    written: ``s`` (integer Unix seconds, the default), ``ms`` (integer milliseconds) or
    ``iso`` (ISO-8601 text) (:func:`retrieval.data.tables.table_interactions`).
    """

    path: str = ""
    format: DataFormat | None = None
    protocol: TrainingProtocol = "loo"
    split_seed: Seed = 42
    folds: PositiveInt = 1
    fold: NonNegativeInt = 0
    shuffle_buffer: PositiveInt = 100_000
    columns: dict[str, str] = field(default_factory=dict)
    timestamp_unit: TimestampUnit = "s"

    def __post_init__(self) -> None:
        check_fields(self)
        # One field at a time (overrides apply in order); fold < folds and the protocol are
        # checked where the split is made (retrieval.training.protocols.make_protocol).
        object.__setattr__(self, "columns", check_columns(self.columns))  # names as text


@dataclass(frozen=True)
class ModelConfig:
    """User tower and embedding sizes. ``num_interests`` None = the tower's default (sa: 4, sasrec: 1).

    ``RETIRED``: fields removed since, accepted in a saved config at their defaults.

    ``filter_alpha`` and ``filter_cutoff`` are bsarec's: the frequency filter's share of each
    block's mixing (BSARec's α; 1 − α goes to self-attention, 0 = SASRec's block) and how many
    of the lowest rFFT frequencies over ``max_len`` positions its low-pass keeps (the mean
    included; the authors' ``c`` keeps ``c // 2 + 1``).

    ``similarity`` is how a user vector scores an item: ``dot`` (the inner product) or
    ``cosine`` (both vectors scaled to unit length: the user tower's interests, and the item
    vectors the loss scores and the index holds; the history the tower reads is not scaled).
    Cosine logits lie in [-1, 1], so train it with a ``train.temperature`` well below 1.
    """

    RETIRED: ClassVar[Mapping[str, Any]] = MappingProxyType({"block": "pre_ln", "ffn_multiplier": 1})

    tower: Tower = "sa"
    dim: PositiveInt = 64
    max_len: PositiveInt = 50
    num_interests: PositiveInt | None = None
    num_blocks: PositiveInt = 2
    num_heads: PositiveInt = 1
    dropout: Dropout = 0.2
    routing_iterations: PositiveInt = 3  # dr, mind
    dynamic_interests: bool | None = None  # dr, mind: MIND's K'_u per user (None = tower default)
    attention_penalty: NonNegativeFloat = 0.0  # sa: weight of Lin et al.'s ‖A Aᵀ − I‖²_F (0 = off)
    fusion: Fusion = "none"  # sasrec, bert4rec: side information fusion (towers.side)
    side_features: str = ""  # comma list of attributes, action, gap_prev (retrieval.data.features)
    id_dropout: Dropout = 0.0  # share of item vectors trained on their attributes alone (cold start)
    filter_alpha: Share = 0.7  # bsarec: the filter's share of the mixing (BSARec's α)
    filter_cutoff: PositiveInt = 3  # bsarec: rFFT frequencies the low-pass keeps (<= max_len // 2 + 1)
    similarity: Similarity = "dot"  # or "cosine": unit-length interests and item vectors

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, the loss and its negatives, and the training loop (``RETIRED``: fields
    removed since, accepted in a saved config at their defaults).

    ``loss`` is one of :data:`LOSSES`: ``sampled_softmax``, ``full_softmax``,
    ``in_batch``, ``mixed`` (in-batch + sampled), ``bce`` or ``gbce`` (gSASRec, calibration
    ``gbce_t``). Sampled negatives come from ``sampler``: ``"popularity"`` (q ∝
    (count + 1)^``sampler_alpha`` over training events), ``"uniform"`` or ``"log_uniform"``
    (Zipf over the popularity rank); ``num_negatives`` are shared by a batch, or
    ``negatives_per_positive`` (> 0) are drawn for each target. Softmax logits are log-Q
    corrected unless ``logq_correction`` is false (BCE losses never are). ``objective`` is one
    of :data:`OBJECTIVES` (None = the tower's default: ``all_positions`` for
    sasrec, ``cloze`` for bert4rec, ``last`` otherwise); ``mask_ratio`` is the cloze task's.

    The loop: Adam, AdamW when ``weight_decay`` > 0, ``seed`` fixing initial weights, data
    order, negatives and dropout (the same seed repeats a run, also across a resume).

    The budget is counted in optimizer steps, so that one setting fits 1,000 users and 100,000
    (20 epochs of one example per user are 80 steps of 256 on the first, 7,820 on the second),
    and ends when validation stops improving: a validation every ``eval_every_steps`` steps,
    or every epoch when an epoch is longer (at most every ``10 × eval_every_steps``), so that
    patience spans whole passes over the data; early stopping after ``patience`` validations without a better
    validation NDCG@10 (0 = off; the best validation's weights are exported and its step
    recorded, ``TrainResult.best_step``), at most ``max_steps`` steps (rounded up to a whole
    number of validations). ``lr_schedule`` ``constant``, ``cosine`` or ``linear`` decays to 0
    at ``max_steps`` after ``warmup_steps`` of linear warm-up: ``max_steps`` is the
    schedule's horizon, so a decaying preset sets it to the steps its data needs, and a run
    stopped early by patience ends with part of the decay done. ``plateau`` needs no horizon:
    the rate stays constant until validation stops improving (``patience``), then, from the
    best validation's weights, decays linearly to 0 over ``cooldown_fraction`` of the steps
    trained so far, and the run ends there (patience does not cut the decay short); without
    validation, or if validation keeps improving, the decay takes the budget's last
    ``cooldown_fraction``.

    ``epochs`` (None by default) counts the budget in epochs instead, as configs before the
    step budget did: a run of exactly ``epochs`` epochs (fewer if ``patience`` stops it),
    validated every ``eval_every`` epochs, its schedule decaying over those epochs;
    ``max_steps`` and ``eval_every_steps`` are then not used. Tests and benchmarks that want a
    fixed short run set it; old ``config.json`` files, which all hold it, run as they did.
    ``data.protocol=loo-refit`` has no validation, so its budget is fixed whatever
    ``patience`` says: set ``max_steps`` to the ``best_step`` of a ``loo`` run.

    Under a ``tf.distribute`` strategy (``tools/train.py --strategy``) ``batch_size`` is the
    global batch, split over the replicas; ``lr_scaling`` multiplies the learning rate by the
    number of replicas (``linear``) or its square root (``sqrt``), for runs whose global batch
    grows with the replicas (``none``, the default, keeps the single-device run's).
    ``dense_gradients`` sums each embedding gradient's rows per item before Adam: Keras 3's
    Adam squares the rows one by one, which makes the update depend on how a batch is split
    (one device and several replicas then diverge); off by default until re-benchmarked.
    """

    RETIRED: ClassVar[Mapping[str, Any]] = MappingProxyType(
        {"contrastive_weight": 0.0, "contrastive_temperature": 1.0}
    )

    objective: Objective | None = None
    mask_ratio: Share = 0.2
    max_steps: PositiveInt = 20_000  # the step budget's cap and the schedule's horizon
    epochs: PositiveInt | None = None  # a budget in epochs instead (max_steps, eval_every_steps unused)
    batch_size: PositiveInt = 256
    learning_rate: PositiveFloat = 1e-3
    loss: Loss = "sampled_softmax"
    num_negatives: PositiveInt = 1000
    negatives_per_positive: NonNegativeInt = 0  # > 0: per-target negatives instead of num_negatives shared
    sampler: Sampler = "popularity"
    sampler_alpha: NonNegativeFloat = 0.75
    logq_correction: bool = True
    gbce_t: Share = 0.75  # gSASRec's calibration t (loss = gbce)
    temperature: PositiveFloat = 1.0
    remove_accidental_hits: bool = True
    interest_selection: InterestSelection = "hard"  # how K interests meet the target
    label_aware_power: NonNegativeFloat = 1.0  # MIND's p, for interest_selection="label_aware"
    weight_decay: NonNegativeFloat = 0.0  # > 0: AdamW's decoupled weight decay
    lr_schedule: LrSchedule = "constant"  # cosine, linear: decay to 0 by the last step; plateau
    cooldown_fraction: Fraction = 0.2  # plateau: the decay's length, a fraction of the steps before it
    warmup_steps: NonNegativeInt = 0  # linear warm-up, at most a tenth of the schedule's horizon
    patience: NonNegativeInt = 5  # validations without a better validation NDCG@10 before stopping (0 = off)
    seed: Seed = 42
    eval_every_steps: PositiveInt = 200  # steps between validations (or one epoch, if longer: at most 10x)
    eval_every: PositiveInt = 1  # epochs between validations, with a budget in epochs
    lr_scaling: LrScaling = "none"  # learning rate × replicas (linear) or √replicas (sqrt)
    dense_gradients: bool = False  # sum embedding gradients per item before Adam (retrieval.training.run)
    length_buckets: bool = False  # batches of similar history lengths, padding trimmed (in memory)

    def __post_init__(self) -> None:
        check_fields(self)

    def budget(self, steps_per_epoch: int) -> Budget:
        """The run's steps, validations and schedule horizon for data of ``steps_per_epoch`` steps."""
        if self.epochs is not None:
            return Budget(steps_per_epoch, self.epochs, self.eval_every, self.epochs * steps_per_epoch)
        # An epoch longer than eval_every_steps is one round (up to 10 x eval_every_steps):
        # patience then spans several passes over the data, not a fraction of one, whose
        # validations rise too slowly and noisily to stop on (docs/training.md, "The budget").
        every = max(self.eval_every_steps, min(steps_per_epoch, 10 * self.eval_every_steps))
        every = min(every, self.max_steps)
        return Budget(every, -(-self.max_steps // every), 1, self.max_steps)


@dataclass(frozen=True)
class Budget:
    """How long a run trains, in Keras' terms: ``rounds`` fits of ``round_steps`` steps each (a
    Keras "epoch": one epoch of the data with a budget in epochs, ``eval_every_steps`` steps
    with a budget in steps), a validation after every ``validate_every`` rounds, and the
    learning-rate schedule's horizon ``schedule_steps`` (:meth:`TrainConfig.budget`).
    """

    round_steps: int
    rounds: int
    validate_every: int
    schedule_steps: int

    @property
    def steps(self) -> int:
        """The most steps the run takes (early stopping may end it sooner)."""
        return self.rounds * self.round_steps


@dataclass(frozen=True)
class Config:
    """A training run's whole configuration, saved as the artifact's ``config.json``."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)

    def save(self, path: Path) -> None:
        """Writes ``config.json`` as ``tools/train.py --print-config`` prints it (``--config`` reads it)."""
        Path(path).write_text(config_to_json(self))

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> Config:
        """The config a mapping describes (sections and fields left out keep the defaults).

        Raises:
            ValueError: an unknown key or a value of the wrong type (:func:`retrieval.config.update_config`).
        """
        return config_from_dict(cls, payload)
