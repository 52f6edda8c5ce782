"""The public API of :mod:`retrieval.ranking` (loaded on first use by ``__init__.py``)."""

from .blend import fit_bias, fit_blend, fit_list_blend, list_loss
from .config import ITEM_INITS, RankerConfig, check_config, negative_counts
from .data import CandidateLists, ClickExamples, RankingData, build_ranking_data
from .metrics import auc, evaluate_reranking, gauc, list_metrics, per_user_auc
from .training import (
    RankerMetrics,
    TrainedRanker,
    load_retrieval,
    ranker_kwargs,
    train_ranker,
    train_ranker_from_dirs,
)

__all__ = [
    "ITEM_INITS",
    "CandidateLists",
    "ClickExamples",
    "RankerConfig",
    "RankerMetrics",
    "RankingData",
    "TrainedRanker",
    "auc",
    "build_ranking_data",
    "check_config",
    "evaluate_reranking",
    "fit_bias",
    "fit_blend",
    "fit_list_blend",
    "gauc",
    "list_loss",
    "list_metrics",
    "load_retrieval",
    "negative_counts",
    "per_user_auc",
    "ranker_kwargs",
    "train_ranker",
    "train_ranker_from_dirs",
]
