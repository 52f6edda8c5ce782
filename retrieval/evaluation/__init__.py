"""Evaluation: full-ranking metrics under the three protocols, exact or through an index.

* :mod:`~retrieval.evaluation.metrics`: Recall, NDCG, HitRate (full ranking, the headline),
  sampled metrics (labelled as such), ComiRec's metrics and diversity, paired differences.
* :mod:`~retrieval.evaluation.evaluate`: top-k of a model (exact search is the oracle, or the
  index's multi-interest search) and the metrics of each protocol.
* :mod:`~retrieval.evaluation.protocols`: a saved model on a dataset under one protocol.
* :mod:`~retrieval.evaluation.prepared`: the same, streamed from a prepared folder.
* :mod:`~retrieval.evaluation.runs`: runs side by side as a table.
"""

from retrieval.evaluation.evaluate import (
    candidate_scores,
    category_codes,
    evaluate_comirec,
    evaluate_ranking,
    evaluate_sampled,
    exact_top_k,
    full_ranking_top_k,
    popularity_top_k,
)
from retrieval.evaluation.metrics import (
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
from retrieval.evaluation.prepared import evaluate_prepared, evaluate_prepared_users, popularity_prepared
from retrieval.evaluation.protocols import ProtocolResult, evaluate_model_on_data, evaluate_protocol
from retrieval.evaluation.runs import METRICS_FILE, comparison_markdown, load_run_rows, markdown_table

__all__ = [
    "COMIREC_KS",
    "DEFAULT_KS",
    "METRICS_FILE",
    "SAMPLED_KS",
    "ProtocolResult",
    "candidate_scores",
    "category_codes",
    "comirec_metrics",
    "comparison_markdown",
    "diversity_at_k",
    "evaluate_comirec",
    "evaluate_model_on_data",
    "evaluate_prepared",
    "evaluate_prepared_users",
    "evaluate_protocol",
    "evaluate_ranking",
    "evaluate_sampled",
    "exact_top_k",
    "full_ranking_top_k",
    "load_run_rows",
    "markdown_table",
    "paired_difference",
    "popularity_prepared",
    "popularity_top_k",
    "ranking_metrics",
    "sampled_metrics",
    "user_comirec_metrics",
    "user_means",
    "user_ranking_metrics",
]
