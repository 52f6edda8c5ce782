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

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
