"""Training: the two-tower model, its task, its input pipelines and the training loop.

* :mod:`~retrieval.training.config`: :class:`Config` (data, model, train sections) and
  :mod:`~retrieval.training.presets`, named configurations per dataset and tower.
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

Example:
    >>> config = apply_overrides(Config(), ["data.path=log.csv", "model.tower=sasrec"])
    >>> train(config, Path("runs/sasrec"))
"""

from retrieval.training.attention import attention_for_history, plot_user_attention, user_history
from retrieval.training.callbacks import LR_SCHEDULES, run_folder
from retrieval.training.config import Config, DataConfig, ModelConfig, TrainConfig, apply_overrides
from retrieval.training.distribute import LR_SCALINGS, STRATEGIES, is_chief, make_strategy
from retrieval.training.examples import OBJECTIVES, make_examples, mask_items
from retrieval.training.inputs import InMemoryData, PreparedData, TrainingData, open_training_data
from retrieval.training.model import TwoTowerModel, build_model, export_user_tower, takes_side_information
from retrieval.training.optimizer import make_optimizer
from retrieval.training.presets import (
    DATASETS,
    PRESETS,
    SHARED_DATA,
    TOWERS,
    Preset,
    apply_preset,
    dataset_at,
    get_preset,
    preset_for,
    preset_names,
)
from retrieval.training.run import save_model, train
from retrieval.training.streaming import streaming_dataset
from retrieval.training.validation import TRAINING_PROTOCOLS

__all__ = [
    "DATASETS",
    "LR_SCALINGS",
    "LR_SCHEDULES",
    "OBJECTIVES",
    "PRESETS",
    "SHARED_DATA",
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
    "dataset_at",
    "export_user_tower",
    "get_preset",
    "is_chief",
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
    "user_history",
]
