"""Named training presets, one per dataset × user tower: ``tools/train.py --preset beauty-sasrec``.

A preset is a list of ``section.field=value`` overrides (the same strings as ``--set``) plus
the dataset it is meant for; ``tools/train.py`` applies it to the defaults before its own flags
and ``--set`` overrides, so anything in a preset can still be changed on the command line.

Not tuned yet: every preset holds the current defaults (``retrieval.config``) with the
dataset's path. ``note`` says where a preset's numbers were measured, when they were.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from retrieval.config import Config, apply_overrides

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
"""``../shared/data`` beside the checkout, where the benchmark datasets live."""

DATASETS = {
    "ml100k": "ml-100k",
    "beauty": "amazon-beauty/Beauty.txt",
    "sports": "amazon-sports/Sports_and_Outdoors.txt",
}
"""Preset dataset name -> path under :data:`SHARED_DATA`."""

TOWERS = ("youtubednn", "sa", "dr", "mind", "din", "sasrec", "bert4rec")
"""Towers with a preset for every dataset (a test checks this is every registered tower)."""

_NOT_TUNED = "not tuned: the defaults of retrieval.config"
_MEASURED = {  # the README's measurements of these defaults (2026-11-30)
    "ml100k-sa": "defaults, not tuned; measured (README): test NDCG@10 0.0444, HR@10 0.0923",
    "beauty-sasrec": "defaults, not tuned; measured (README): test NDCG@10 0.0475, HR@10 0.0810",
}


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
            name = f"{dataset}-{tower}"
            presets[name] = Preset(name, dataset, (f"model.tower={tower}",), _MEASURED.get(name, _NOT_TUNED))
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


def apply_preset(config: Config, name: str) -> Config:
    """``config`` with the preset's dataset path and overrides applied.

    Example:
        >>> apply_preset(Config(), "beauty-sasrec").model.tower
        'sasrec'
    """
    preset = get_preset(name)
    return apply_overrides(config, [f"data.path={preset.data_path}", *preset.overrides])
