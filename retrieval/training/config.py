"""Configuration: one frozen dataclass per component, ``a.b=c`` overrides, saved beside artifacts."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class DataConfig:
    """Where the interactions come from and how they are split.

    ``format`` None = detected from the path: ``movielens``, ``s3rec`` or ``table``
    (:func:`retrieval.data.loaders.load_interactions`, loaded in memory), or ``prepared``, a folder
    written by ``tools/prepare_data.py`` and streamed (:mod:`retrieval.data.prepared`; the
    leave-one-out split only). ``protocol`` is ``"loo"`` (leave-one-out: every user trains on
    all but the last two events, validates on the second-to-last, tests on the last),
    ``"loo-refit"`` (the same test, the model trained on every event before it, validation
    events included: no validation, so a fixed number of epochs, chosen by a ``loo`` run) or
    ``"comirec"`` (ComiRec's: users split 8:1:1 by ``split_seed``; only training users train;
    validation/test users' first 80% of events predict the remaining 20%). ``shuffle_buffer``:
    ``prepared`` only, the examples gathered before each shuffle (memory ~ ``shuffle_buffer``
    × ``max_len`` × 4 bytes per input).
    """

    path: str = ""
    format: str | None = None
    protocol: str = "loo"
    split_seed: int = 42
    shuffle_buffer: int = 100_000


@dataclass(frozen=True)
class ModelConfig:
    """User tower and embedding sizes. ``num_interests`` None = the tower's default (sa: 4, sasrec: 1)."""

    tower: str = "sa"
    dim: int = 64
    max_len: int = 50
    num_interests: int | None = None
    num_blocks: int = 2
    num_heads: int = 1
    dropout: float = 0.2
    routing_iterations: int = 3  # dr, mind
    dynamic_interests: bool | None = None  # dr, mind: MIND's K'_u per user (None = tower default)
    attention_penalty: float = 0.0  # sa: weight of Lin et al.'s ‖A Aᵀ − I‖²_F (0 = off)
    fusion: str = "none"  # sasrec, bert4rec: none | sum | concat | gated | nova (towers.side)
    side_features: str = ""  # comma list of attributes, action, gap_prev (retrieval.data.features)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, the loss and its negatives, and the training loop.

    ``loss`` is one of ``retrieval.training.losses.task.LOSSES``: ``sampled_softmax``, ``full_softmax``,
    ``in_batch``, ``mixed`` (in-batch + sampled), ``bce`` or ``gbce`` (gSASRec, calibration
    ``gbce_t``). Sampled negatives come from ``sampler``: ``"popularity"`` (q ∝
    (count + 1)^``sampler_alpha`` over training events), ``"uniform"`` or ``"log_uniform"``
    (Zipf over the popularity rank); ``num_negatives`` are shared by a batch, or
    ``negatives_per_positive`` (> 0) are drawn for each target. Softmax logits are log-Q
    corrected unless ``logq_correction`` is false (BCE losses never are). ``objective`` is one
    of ``retrieval.training.examples.OBJECTIVES`` (None = the tower's default: ``all_positions`` for
    sasrec, ``cloze`` for bert4rec, ``last`` otherwise); ``mask_ratio`` is the cloze task's.

    The loop: Adam, AdamW when ``weight_decay`` > 0; ``lr_schedule`` ``constant``, ``cosine``
    or ``linear`` decay to 0 over the run after ``warmup_steps`` of linear warm-up; early
    stopping after ``patience`` validations (one every ``eval_every`` epochs) without a better
    NDCG@10 (0 = off), the best weights exported. ``seed`` fixes initial weights, data order,
    negatives and dropout: the same seed repeats a run, also across a resume.

    Under a ``tf.distribute`` strategy (``tools/train.py --strategy``) ``batch_size`` is the
    global batch, split over the replicas; ``lr_scaling`` multiplies the learning rate by the
    number of replicas (``linear``) or its square root (``sqrt``), for runs whose global batch
    grows with the replicas (``none``, the default, keeps the single-device run's).
    ``dense_gradients`` sums each embedding gradient's rows per item before Adam: Keras 3's
    Adam squares the rows one by one, which makes the update depend on how a batch is split
    (one device and several replicas then diverge); off by default until re-benchmarked.
    """

    objective: str | None = None
    mask_ratio: float = 0.2
    epochs: int = 20
    batch_size: int = 256
    learning_rate: float = 1e-3
    loss: str = "sampled_softmax"
    num_negatives: int = 1000
    negatives_per_positive: int = 0  # > 0: per-target negatives instead of num_negatives shared
    sampler: str = "popularity"
    sampler_alpha: float = 0.75
    logq_correction: bool = True
    gbce_t: float = 0.75  # gSASRec's calibration t in [0, 1] (loss = gbce)
    temperature: float = 1.0
    remove_accidental_hits: bool = True
    interest_selection: str = "hard"  # how K interests meet the target: hard | label_aware | max
    label_aware_power: float = 1.0  # MIND's p, for interest_selection="label_aware"
    weight_decay: float = 0.0  # > 0: AdamW's decoupled weight decay
    lr_schedule: str = "constant"  # constant | cosine | linear (decay to 0 by the last step)
    warmup_steps: int = 0
    patience: int = 0  # early stopping on validation NDCG@10 (0 = off)
    seed: int = 42
    eval_every: int = 1
    lr_scaling: str = "none"  # none | linear | sqrt: learning rate × replicas (or √replicas)
    dense_gradients: bool = False  # sum embedding gradients per item before Adam (retrieval.training.run)
    length_buckets: bool = False  # batches of similar history lengths, padding trimmed (in memory)


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> Config:
        return cls(
            DataConfig(**payload.get("data", {})),
            ModelConfig(**payload.get("model", {})),
            TrainConfig(**payload.get("train", {})),
        )


def _coerce(raw: str, annotation: Any, key: str) -> Any:
    hint = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    if raw.lower() in ("none", "null") and type(None) in hint:
        return None
    target = next(t for t in hint if t is not type(None))
    if target is bool:
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"{key}: expected true/false, got {raw!r}")
        return raw.lower() in ("true", "1")
    try:
        return target(raw)
    except ValueError:
        raise ValueError(f"{key}: expected {target.__name__}, got {raw!r}") from None


def apply_overrides(config: Config, overrides: Iterable[str]) -> Config:
    """Returns ``config`` with ``section.field=value`` overrides applied (values typed by the field).

    Example:
        >>> apply_overrides(Config(), ["train.epochs=3", "model.tower=sasrec"]).train.epochs
        3
    """
    for item in overrides:
        key, sep, raw = item.partition("=")
        section_name, _, field_name = key.strip().partition(".")
        if not sep or not field_name:
            raise ValueError(f"override {item!r} is not of the form section.field=value")
        if section_name not in {f.name for f in dataclasses.fields(config)}:
            raise ValueError(f"unknown config section {section_name!r} in {item!r}")
        section = getattr(config, section_name)
        hints = typing.get_type_hints(type(section))
        if field_name not in hints:
            raise ValueError(f"unknown field {key!r}; {section_name} has {sorted(hints)}")
        value = _coerce(raw.strip(), hints[field_name], key)
        config = dataclasses.replace(
            config, **{section_name: dataclasses.replace(section, **{field_name: value})}
        )
    return config
