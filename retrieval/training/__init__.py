"""Training: the two-tower model, its task, its input pipelines and the training loop.

* :mod:`~retrieval.training.config`: :class:`Config` (data, model, train sections), the option
  values (``LOSSES``, ``SAMPLERS``...) and :mod:`~retrieval.training.presets`, named
  configurations per dataset and tower; overrides and config files are :mod:`retrieval.config`'s.
* :mod:`~retrieval.training.model`: :class:`TwoTowerModel`, a user tower (:mod:`towers`) and
  the task that trains it; :mod:`retrieval.training.losses`: the task (negatives, samplers,
  log-Q correction, accidental hits, how K interests meet a target).
* :mod:`~retrieval.training.examples`, :mod:`~retrieval.training.inputs`,
  :mod:`~retrieval.training.batches`, :mod:`~retrieval.training.streaming`: examples per
  objective, in memory or streamed from a prepared folder.
* :mod:`~retrieval.training.run`: :func:`train`, checkpointed every epoch and resumable, with
  full-ranking validation (:mod:`~retrieval.training.validation`), callbacks, the optimizer and
  ``tf.distribute`` (:mod:`~retrieval.training.distribute`).
* :mod:`~retrieval.training.attention`: a trained tower's attention maps.

Names are loaded on first use (PEP 562): ``from retrieval.training import Config,
apply_overrides`` loads the configuration only, without TensorFlow, so ``tools/train.py`` checks
its whole configuration before it loads anything heavy.

Example:
    >>> config = apply_overrides(Config(), ["data.path=log.csv", "model.tower=sasrec"])
    >>> train(config, Path("runs/sasrec"))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from retrieval.config import apply_overrides, config_to_json, load_config_file, update_config
    from retrieval.training.attention import attention_for_history, plot_user_attention, user_history
    from retrieval.training.callbacks import run_folder
    from retrieval.training.config import (
        DATA_FORMATS,
        FUSIONS,
        INTEREST_SELECTIONS,
        LOSSES,
        LR_SCALINGS,
        LR_SCHEDULES,
        OBJECTIVES,
        SAMPLERS,
        STRATEGIES,
        TRAINING_PROTOCOLS,
        Config,
        DataConfig,
        ModelConfig,
        TrainConfig,
    )
    from retrieval.training.distribute import is_chief, make_strategy
    from retrieval.training.examples import make_examples, mask_items
    from retrieval.training.inputs import InMemoryData, PreparedData, TrainingData, open_training_data
    from retrieval.training.model import (
        TwoTowerModel,
        build_model,
        export_user_tower,
        takes_side_information,
    )
    from retrieval.training.optimizer import make_optimizer
    from retrieval.training.presets import (
        PRESETS,
        TOWERS,
        Preset,
        apply_preset,
        get_preset,
        preset_for,
        preset_names,
    )
    from retrieval.training.run import save_model, train
    from retrieval.training.streaming import streaming_dataset

_MODULES: dict[str, tuple[str, ...]] = {
    "retrieval.config": ("apply_overrides", "config_to_json", "load_config_file", "update_config"),
    "retrieval.training.attention": ("attention_for_history", "plot_user_attention", "user_history"),
    "retrieval.training.callbacks": ("run_folder",),
    "retrieval.training.config": (
        "DATA_FORMATS",
        "FUSIONS",
        "INTEREST_SELECTIONS",
        "LOSSES",
        "LR_SCALINGS",
        "LR_SCHEDULES",
        "OBJECTIVES",
        "SAMPLERS",
        "STRATEGIES",
        "TRAINING_PROTOCOLS",
        "Config",
        "DataConfig",
        "ModelConfig",
        "TrainConfig",
    ),
    "retrieval.training.distribute": ("is_chief", "make_strategy"),
    "retrieval.training.examples": ("make_examples", "mask_items"),
    "retrieval.training.inputs": ("InMemoryData", "PreparedData", "TrainingData", "open_training_data"),
    "retrieval.training.model": (
        "TwoTowerModel",
        "build_model",
        "export_user_tower",
        "takes_side_information",
    ),
    "retrieval.training.optimizer": ("make_optimizer",),
    "retrieval.training.presets": (
        "PRESETS",
        "TOWERS",
        "Preset",
        "apply_preset",
        "get_preset",
        "preset_for",
        "preset_names",
    ),
    "retrieval.training.run": ("save_model", "train"),
    "retrieval.training.streaming": ("streaming_dataset",),
}
"""Module -> the public names it defines (the ``TYPE_CHECKING`` imports above, for type checkers)."""

_HOME = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    """Loads a public name's module on first use (and keeps the name here)."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})


__all__ = [
    "DATA_FORMATS",
    "FUSIONS",
    "INTEREST_SELECTIONS",
    "LOSSES",
    "LR_SCALINGS",
    "LR_SCHEDULES",
    "OBJECTIVES",
    "PRESETS",
    "SAMPLERS",
    "STRATEGIES",
    "TOWERS",
    "TRAINING_PROTOCOLS",
    "Config",
    "DataConfig",
    "InMemoryData",
    "ModelConfig",
    "PreparedData",
    "Preset",
    "TrainConfig",
    "TrainingData",
    "TwoTowerModel",
    "apply_overrides",
    "apply_preset",
    "attention_for_history",
    "build_model",
    "config_to_json",
    "export_user_tower",
    "get_preset",
    "is_chief",
    "load_config_file",
    "make_examples",
    "make_optimizer",
    "make_strategy",
    "mask_items",
    "open_training_data",
    "plot_user_attention",
    "preset_for",
    "preset_names",
    "run_folder",
    "save_model",
    "streaming_dataset",
    "takes_side_information",
    "train",
    "update_config",
    "user_history",
]
