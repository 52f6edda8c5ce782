"""The public API of :mod:`retrieval.training` (loaded on first use by ``__init__.py``)."""

from .attention import attention_for_history, plot_user_attention, user_history
from .callbacks import run_folder
from .config import (
    DATA_FORMATS,
    FUSIONS,
    INTEREST_SELECTIONS,
    LOSSES,
    LR_SCALINGS,
    LR_SCHEDULES,
    OBJECTIVES,
    SAMPLERS,
    SIMILARITIES,
    STRATEGIES,
    TOWERS,
    TRAINING_PROTOCOLS,
    Config,
    DataConfig,
    ModelConfig,
    TrainConfig,
)
from .distribute import is_chief, make_strategy
from .examples import make_examples, mask_items
from .inputs import InMemoryData, PreparedData, TrainingData, open_training_data, read_interactions
from .model import TwoTowerModel, build_model, export_user_tower, takes_side_information, tower_fusions
from .optimizer import make_optimizer
from .presets import PRESETS, Preset, apply_preset, get_preset, preset_for, preset_names
from .run import TrainResult, save_model, train
from .streaming import streaming_dataset

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
    "SIMILARITIES",
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
    "TrainResult",
    "TrainingData",
    "TwoTowerModel",
    "apply_preset",
    "attention_for_history",
    "build_model",
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
    "read_interactions",
    "run_folder",
    "save_model",
    "streaming_dataset",
    "takes_side_information",
    "tower_fusions",
    "train",
    "user_history",
]
