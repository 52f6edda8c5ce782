"""The public API of :mod:`retrieval.training.losses` (loaded on first use by ``__init__.py``)."""

from .interests import interest_scores, label_aware_attention, select_interest
from .logits import GeneralisedBCE, LogitLoss, SoftmaxCrossEntropy, candidate_logits
from .negatives import AllItems, InBatchNegatives, Negatives, SampledNegatives
from .samplers import CandidateSampler, SeedStream
from .task import RetrievalTask, build_task

__all__ = [
    "AllItems",
    "CandidateSampler",
    "GeneralisedBCE",
    "InBatchNegatives",
    "LogitLoss",
    "Negatives",
    "RetrievalTask",
    "SampledNegatives",
    "SeedStream",
    "SoftmaxCrossEntropy",
    "build_task",
    "candidate_logits",
    "interest_scores",
    "label_aware_attention",
    "select_interest",
]
