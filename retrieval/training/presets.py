"""Named training presets: one per user tower for any data (``tools/train.py --preset sasrec
--data mine.csv``) and one per dataset × tower (``--preset beauty-sasrec``).

A preset is a list of ``section.field=value`` overrides (the same strings as ``--set``) plus the
dataset it is meant for, a name of :data:`retrieval.data.datasets.DATASETS` found under the data
root (``--data-root`` or ``$MITT_DATA``, :func:`retrieval.data.datasets.data_root`), or none (a
tower's own preset: give the data). ``tools/train.py`` applies it to the defaults before a
``--config`` file, its own flags and ``--set``, so anything in a preset can still be changed on
the command line.

Every preset budgets its run in optimizer steps and stops when validation stops improving
(``train.max_steps``, ``eval_every_steps``, ``patience``: :class:`~retrieval.training.config.TrainConfig`),
so a preset tuned on one dataset also trains long enough on a smaller or larger one; none sets
``train.epochs``, which would count the budget in epochs again.

Tuned presets (``Preset.tuned``) hold what a search on their dataset's validation split found;
the others hold the defaults (``retrieval.training.config``), plus what a tower needs on any data
(DIN's early stopping). ``note`` says in one line what a preset was tuned on; the searches and
their numbers are in ``docs/configuration.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from retrieval.config import apply_overrides
from retrieval.data.datasets import DATASETS, dataset_path
from retrieval.training.config import TOWERS, Config

_NOT_TUNED = "not tuned: the defaults of retrieval.training.config"

_BUCKETS = "train.length_buckets=true"
_SASREC = (
    "train.num_negatives=4096",  # on a catalogue of at most 4,096 items: the full softmax
    "train.sampler=uniform",
    "model.dropout=0.5",
    _BUCKETS,
    "train.learning_rate=0.003",
    "train.warmup_steps=200",
    "model.dim=128",
    "model.similarity=cosine",
    "train.temperature=0.05",
    "train.lr_schedule=plateau",
)
"""``sasrec`` on any data: beauty-sasrec's values without its schedule's horizon (the rate
decays when validation stops improving, not at a step count tuned on one dataset)."""

_EVERY_DATASET: dict[str, tuple[tuple[str, ...], str]] = {
    "sasrec": (
        _SASREC,
        "not tuned on this data: beauty-sasrec's values, the rate decaying once validation"
        " stops improving; measured on ML-100K, Beauty and Sports (docs/configuration.md)",
    ),
    "din": (
        ("train.patience=2",),
        "not tuned: the defaults, with earlier stopping (train.patience=2) against DIN's overfitting",
    ),
}
"""Per tower, what its presets hold on any data: its own preset (``--preset din``) and every
dataset's that has no tuned one."""

_MAX = "train.interest_selection=max"
_ML100K_COMIREC = "tuned on ML-100K: validation Recall@50 under the comirec protocol"
_BEAUTY_COMIREC = "tuned on Beauty: validation Recall@50 under the comirec protocol, 20 epochs"
_TUNED: dict[str, tuple[tuple[str, ...], str]] = {
    "beauty-sasrec": (
        (
            *_SASREC,
            # Tuned as 39 epochs validated every 3: 3,432 steps of 88 on Beauty, every 264.
            "train.max_steps=3500",
            "train.eval_every_steps=250",
            "train.lr_schedule=cosine",
        ),
        "tuned on Beauty: validation NDCG@10 under the loo protocol",
    ),
    "beauty-sa": ((_BUCKETS,), _BEAUTY_COMIREC),
    "beauty-dr": ((_BUCKETS, _MAX, "train.learning_rate=0.003"), _BEAUTY_COMIREC),
    "beauty-mind": ((_BUCKETS, _MAX, "train.learning_rate=0.003"), _BEAUTY_COMIREC),
    "ml100k-sa": ((_MAX,), _ML100K_COMIREC),
    "ml100k-dr": ((_MAX,), _ML100K_COMIREC),
    "ml100k-mind": ((_MAX,), _ML100K_COMIREC),
    "ml100k-din": ((_MAX, "train.patience=3"), _ML100K_COMIREC),
}
"""Presets searched on their dataset: overrides and what they were tuned on."""

_BORROWED: dict[str, tuple[str, tuple[str, ...], str]] = {
    "sports-sasrec": (
        "beauty-sasrec",
        ("train.loss=full_softmax",),
        "not tuned on Sports: beauty-sasrec's values (same preprocessing), with the full softmax"
        " (validation NDCG@10 higher on Sports, 3 seeds of 3)",
    ),
}
"""Presets that take another dataset's tuned values: preset -> (the tuned preset, the
preset's own overrides after them, note)."""


@dataclass(frozen=True)
class Preset:
    """Hyper-parameters for one dataset and tower.

    Attributes:
        name: ``<dataset>-<tower>``, or ``<tower>`` for any data.
        dataset: a key of :data:`retrieval.data.datasets.DATASETS`; None for any data.
        overrides: ``section.field=value`` strings, applied in order.
        note: one line on what the values were tuned on (or that they are defaults).
        tuned: whether the values come from a search on this dataset.
    """

    name: str
    dataset: str | None
    overrides: tuple[str, ...]
    note: str = _NOT_TUNED
    tuned: bool = False

    def dataset_path(self, data_root: str | Path | None = None) -> Path:
        """Where the preset's dataset is under ``data_root`` (default ``$MITT_DATA``).

        Raises:
            ValueError: a preset for any data (it names no dataset).
            retrieval.data.DataError: no data root, or the dataset is not there.
        """
        if self.dataset is None:
            raise ValueError(f"preset {self.name!r} is for any data: it names no dataset")
        return dataset_path(self.dataset, data_root)


def _default_presets() -> dict[str, Preset]:
    presets: dict[str, Preset] = {}
    for tower in TOWERS:
        overrides, note = _EVERY_DATASET.get(tower, ((), _NOT_TUNED))
        presets[tower] = Preset(tower, None, (f"model.tower={tower}", *overrides), note)
    for dataset in DATASETS:
        for tower in TOWERS:
            name, base = f"{dataset}-{tower}", (f"model.tower={tower}",)
            if name in _TUNED:
                overrides, note = _TUNED[name]
                presets[name] = Preset(name, dataset, base + overrides, note, tuned=True)
            elif name in _BORROWED:
                source, own, note = _BORROWED[name]
                presets[name] = Preset(name, dataset, base + _TUNED[source][0] + own, note)
            else:
                overrides, note = _EVERY_DATASET.get(tower, ((), _NOT_TUNED))
                presets[name] = Preset(name, dataset, base + overrides, note)
    return presets


PRESETS: dict[str, Preset] = _default_presets()


def preset_names() -> list[str]:
    """Every preset's name, sorted."""
    return sorted(PRESETS)


def get_preset(name: str) -> Preset:
    """The preset called ``name``.

    Raises:
        ValueError: no such preset (the message lists them all).
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(preset_names())}")
    return PRESETS[name]


def preset_for(dataset: str | None, tower: str) -> str:
    """The preset a run of ``tower`` on ``dataset`` starts from: ``<dataset>-<tower>`` when
    ``dataset`` is given and that preset exists, else the tower's own (``<tower>``, any data).

    Raises:
        ValueError: an unknown tower.
    """
    name = f"{dataset}-{tower}"
    return name if dataset and name in PRESETS else get_preset(tower).name


def apply_preset(config: Config, name: str, data_root: str | Path | None = None) -> Config:
    """``config`` with the preset's dataset (found under ``data_root``, default ``$MITT_DATA``)
    as ``data.path`` and its overrides applied (a preset for any data leaves ``data.path``).

    Example:
        >>> apply_preset(Config(), "beauty-sasrec", "/data").data.path  # /data/amazon-beauty/ holds it
        '/data/amazon-beauty/Beauty.txt'

    Raises:
        ValueError: an unknown preset.
        retrieval.data.DataError: no data root, or the dataset is not there.
    """
    preset = get_preset(name)
    where = [f"data.path={preset.dataset_path(data_root)}"] if preset.dataset is not None else []
    return apply_overrides(config, [*where, *preset.overrides])
