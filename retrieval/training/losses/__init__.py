"""The training task: how interests meet a target, where negatives come from, and the loss.

Towers only compute embeddings; everything about the loss lives here. A
:class:`RetrievalTask` is assembled from two strategies:

* **negatives** (:mod:`~retrieval.training.losses.negatives`): the catalogue (``AllItems``),
  items drawn by a :class:`CandidateSampler` (``SampledNegatives``), or the batch's other
  targets (``InBatchNegatives``), alone or mixed;
* **loss on the logits** (:mod:`~retrieval.training.losses.logits`: ``SoftmaxCrossEntropy``,
  ``GeneralisedBCE``).

Every candidate logit is ``<q, e_j> / T``; softmax losses subtract ``log E[count of j]`` (the
log-Q correction, summed over the sources that propose j), and accidental hits (a candidate
equal to the row's own target) are removed. :data:`LOSSES` names the combinations and
:func:`build_task` builds one by name.
"""

from retrieval.training.losses.samplers import CandidateSampler
from retrieval.training.losses.task import RetrievalTask, build_task

__all__ = [
    "CandidateSampler",
    "RetrievalTask",
    "build_task",
]
