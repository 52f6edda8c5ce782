"""The public API of :mod:`retrieval.evaluation` (loaded on first use by ``__init__.py``)."""

from .evaluate import (
    candidate_scores,
    category_codes,
    evaluate_comirec,
    evaluate_ranking,
    evaluate_sampled,
    exact_top_k,
    full_ranking_top_k,
    mask_excluded,
    popularity_top_k,
)
from .metrics import (
    COMIREC_KS,
    DEFAULT_KS,
    SAMPLED_KS,
    comirec_metrics,
    diversity_at_k,
    paired_difference,
    ranking_metrics,
    sampled_metrics,
    user_comirec_metrics,
    user_means,
    user_ranking_metrics,
)
from .paired import (
    USER_METRICS_FILE,
    PairedComparison,
    UserMetrics,
    compare_user_metrics,
    paired_comparison,
)
from .prepared import evaluate_prepared, evaluate_prepared_users, popularity_prepared
from .protocols import ProtocolResult, evaluate_protocol
from .runs import METRICS_FILE, comparison_markdown, load_run_rows, markdown_table

__all__ = [
    "COMIREC_KS",
    "DEFAULT_KS",
    "METRICS_FILE",
    "SAMPLED_KS",
    "USER_METRICS_FILE",
    "PairedComparison",
    "ProtocolResult",
    "UserMetrics",
    "candidate_scores",
    "category_codes",
    "comirec_metrics",
    "compare_user_metrics",
    "comparison_markdown",
    "diversity_at_k",
    "evaluate_comirec",
    "evaluate_prepared",
    "evaluate_prepared_users",
    "evaluate_protocol",
    "evaluate_ranking",
    "evaluate_sampled",
    "exact_top_k",
    "full_ranking_top_k",
    "load_run_rows",
    "markdown_table",
    "mask_excluded",
    "paired_comparison",
    "paired_difference",
    "popularity_prepared",
    "popularity_top_k",
    "ranking_metrics",
    "sampled_metrics",
    "user_comirec_metrics",
    "user_means",
    "user_ranking_metrics",
]
