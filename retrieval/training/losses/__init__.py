"""The training task: how interests meet a target, where negatives come from, and the loss.

Towers only compute embeddings; everything about the loss lives here. A
:class:`RetrievalTask` is assembled from two strategies:

* **negatives** (:class:`Negatives`): the catalogue (:class:`AllItems`), items drawn by a
  :class:`CandidateSampler` (:class:`SampledNegatives`), or the batch's other targets
  (:class:`InBatchNegatives`), alone or mixed;
* **loss on the logits** (:class:`SoftmaxCrossEntropy`, :class:`GeneralisedBCE`).

Every candidate logit is ``<q, e_j> / T``; softmax losses subtract ``log E[count of j]`` (the
log-Q correction, summed over the sources that propose j), and accidental hits (a candidate
equal to the row's own target) are removed. :data:`LOSSES` names the combinations and
:func:`build_task` builds one by name.
"""

from retrieval.training.config import INTEREST_SELECTIONS, LOSSES, SAMPLERS
from retrieval.training.losses.interests import (
    interest_scores,
    label_aware_attention,
    select_interest,
)
from retrieval.training.losses.logits import (
    GeneralisedBCE,
    LogitLoss,
    SoftmaxCrossEntropy,
    candidate_logits,
    sampled_softmax_loss,
)
from retrieval.training.losses.negatives import AllItems, InBatchNegatives, Negatives, SampledNegatives
from retrieval.training.losses.samplers import CandidateSampler, SeedStream
from retrieval.training.losses.task import RetrievalTask, SampledSoftmaxTask, build_task

__all__ = [
    "INTEREST_SELECTIONS",
    "LOSSES",
    "SAMPLERS",
    "AllItems",
    "CandidateSampler",
    "GeneralisedBCE",
    "InBatchNegatives",
    "LogitLoss",
    "Negatives",
    "RetrievalTask",
    "SampledNegatives",
    "SampledSoftmaxTask",
    "SeedStream",
    "SoftmaxCrossEntropy",
    "build_task",
    "candidate_logits",
    "interest_scores",
    "label_aware_attention",
    "sampled_softmax_loss",
    "select_interest",
]
