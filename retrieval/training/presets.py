"""Named training presets, one per dataset × user tower: ``tools/train.py --preset beauty-sasrec``.

A preset is a list of ``section.field=value`` overrides (the same strings as ``--set``) plus
the dataset it is meant for; ``tools/train.py`` applies it to the defaults before its own flags
and ``--set`` overrides, so anything in a preset can still be changed on the command line.

Tuned presets (``Preset.tuned``) hold what a search on their dataset's validation split found;
the others hold the defaults (``retrieval.training.config``), plus what a tower needs on any data (DIN's
early stopping). ``note`` says where a preset's values and numbers come from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from retrieval.training.config import Config, apply_overrides

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
"""``../shared/data`` beside the checkout, where the benchmark datasets live."""

DATASETS = {
    "ml100k": "ml-100k",
    "beauty": "amazon-beauty/Beauty.txt",
    "sports": "amazon-sports/Sports_and_Outdoors.txt",
}
"""Preset dataset name -> path under :data:`SHARED_DATA`."""

TOWERS = ("youtubednn", "sa", "dr", "mind", "din", "sasrec", "bert4rec")
"""Towers with a preset for every dataset (a test checks this is every registered tower)."""

_NOT_TUNED = "not tuned: the defaults of retrieval.training.config"

_EVERY_DATASET: dict[str, tuple[tuple[str, ...], str]] = {
    "din": (
        ("train.patience=2",),
        "not tuned: the defaults of retrieval.training.config, with early stopping (train.patience=2): the "
        "un-normalised activation unit overfits within a few epochs, as the DIN paper reports "
        "(on Beauty validation NDCG@10 peaked at epoch 4, 0.039, then fell while the training "
        "loss kept falling)",
    ),
}
"""Per tower, what its presets hold on every dataset that has no tuned preset."""

_MAX = "train.interest_selection=max"
_BUCKETS = "train.length_buckets=true"
_ML100K_COMIREC = (
    "tuned on ML-100K under the ComiRec protocol (validation Recall@50, 2026-12-01): "
    "interest_selection=max instead of hard lifts test Recall@50 "
)
_BEAUTY_COMIREC = (
    "tuned on Beauty under the ComiRec protocol, 20 epochs (validation Recall@50 of "
    "`bench.peers --protocols comirec --sides ours` runs, 2026-12-02): "
)
_TUNED: dict[str, tuple[tuple[str, ...], str]] = {
    "beauty-sasrec": (
        (
            "train.num_negatives=4096",
            "train.sampler=uniform",
            "model.dropout=0.5",
            _BUCKETS,
            "train.epochs=39",
            "train.eval_every=3",
            "train.learning_rate=0.003",
            "train.warmup_steps=200",
            "train.lr_schedule=cosine",
        ),
        "tuned on Beauty validation NDCG@10 (2026-12-01): 4,096 uniformly sampled negatives "
        "with log-Q correction (0.0690, 12 s/epoch; full softmax over the catalogue reached 0.0711 "
        "at 21.5 s/epoch, over the 10-minute budget at 39 epochs; 1,000 popularity-sampled: "
        "0.0625 at dropout 0.2), dropout 0.5 (full softmax: 0.0711 vs 0.0658 at 0.2), length "
        "buckets (same validation per epoch, 4x cheaper epochs); 39 epochs = the best epoch of a "
        "run with patience 4; lr 3e-3 with 200 warm-up steps and cosine decay (2026-12-02, "
        "bench.peers loo runs): validation 0.0702 (test 0.0579), 0.0465 after epoch 9 where a "
        "constant 1e-3 had 0.024 (lr 2e-3: 0.0709, test 0.0582, 0.0383 after epoch 9)",
    ),
    "beauty-sa": (
        (_BUCKETS,),
        _BEAUTY_COMIREC + "length buckets: 2.1x cheaper epochs (7.2 vs 15.1 s) at about the same "
        "Recall@50 (0.178 vs 0.183); interest_selection=max (0.175) and lr 3e-3 (0.176) did not help",
    ),
    "beauty-dr": (
        (_BUCKETS, _MAX, "train.learning_rate=0.003"),
        _BEAUTY_COMIREC + "hard selection 0.112; + length buckets and interest_selection=max "
        "0.131; + lr 3e-3 0.173 (still rising at epoch 20)",
    ),
    "beauty-mind": (
        (_BUCKETS, _MAX, "train.learning_rate=0.003"),
        _BEAUTY_COMIREC + "hard selection 0.141; + length buckets and interest_selection=max "
        "0.150; + lr 3e-3 0.155 (best at epoch 7)",
    ),
    "ml100k-sa": ((_MAX,), _ML100K_COMIREC + "0.268 -> 0.373"),
    "ml100k-dr": ((_MAX,), _ML100K_COMIREC + "0.290 -> 0.343"),
    "ml100k-mind": ((_MAX,), _ML100K_COMIREC + "0.268 -> 0.349"),
    "ml100k-din": ((_MAX, "train.patience=3"), _ML100K_COMIREC + "0.365 -> 0.376 (both with early stopping)"),
}
"""Presets searched on their dataset: overrides and what the search measured."""

_BORROWED: dict[str, tuple[str, str]] = {
    "sports-sasrec": (
        "beauty-sasrec",
        "not tuned on Sports: beauty-sasrec's values (Sports has the same S3-Rec preprocessing "
        "and about as short histories, 8.3 vs 8.9 events per user)",
    ),
}
"""Presets that take another dataset's tuned values: preset -> (the tuned preset, note)."""


@dataclass(frozen=True)
class Preset:
    """Hyper-parameters for one dataset and tower.

    Attributes:
        name: ``<dataset>-<tower>``.
        dataset: a key of :data:`DATASETS`.
        overrides: ``section.field=value`` strings, applied in order.
        note: where the values come from (tuned, measured, or defaults).
        tuned: whether the values come from a search on this dataset.
    """

    name: str
    dataset: str
    overrides: tuple[str, ...]
    note: str = _NOT_TUNED
    tuned: bool = False

    @property
    def data_path(self) -> Path:
        """The dataset's default location."""
        return SHARED_DATA / DATASETS[self.dataset]


def _default_presets() -> dict[str, Preset]:
    presets = {}
    for dataset in DATASETS:
        for tower in TOWERS:
            name, base = f"{dataset}-{tower}", (f"model.tower={tower}",)
            if name in _TUNED:
                overrides, note = _TUNED[name]
                presets[name] = Preset(name, dataset, base + overrides, note, tuned=True)
            elif name in _BORROWED:
                source, note = _BORROWED[name]
                presets[name] = Preset(name, dataset, base + _TUNED[source][0], note)
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


def preset_for(dataset: str | None, tower: str) -> str | None:
    """The preset ``<dataset>-<tower>`` when ``dataset`` is given and that preset exists."""
    name = f"{dataset}-{tower}"
    return name if dataset and name in PRESETS else None


def dataset_at(path: str | Path) -> str | None:
    """The preset dataset (a key of :data:`DATASETS`) whose default location is ``path``, or
    None for any other path.

    Example:
        >>> dataset_at(SHARED_DATA / "ml-100k")
        'ml100k'
    """
    resolved = Path(path).resolve()
    return next((name for name, rel in DATASETS.items() if (SHARED_DATA / rel).resolve() == resolved), None)


def apply_preset(config: Config, name: str) -> Config:
    """``config`` with the preset's dataset path and overrides applied.

    Example:
        >>> apply_preset(Config(), "beauty-sasrec").model.tower
        'sasrec'
    """
    preset = get_preset(name)
    return apply_overrides(config, [f"data.path={preset.data_path}", *preset.overrides])
