"""Evaluation: full-ranking metrics under the three protocols, exact or through an index.

* :mod:`~retrieval.evaluation.metrics`: Recall, NDCG, HitRate (full ranking, the headline),
  sampled metrics (labelled as such), ComiRec's metrics and diversity, paired differences.
* :mod:`~retrieval.evaluation.evaluate`: top-k of a model (exact search is the oracle, or the
  index's multi-interest search) and the metrics of each protocol.
* :mod:`~retrieval.evaluation.protocols`: a saved model on a dataset under one protocol.
* :mod:`~retrieval.evaluation.prepared`: the same, streamed from a prepared folder.
* :mod:`~retrieval.evaluation.runs`: runs side by side as a table.
* :mod:`~retrieval.evaluation.paired`: per-user results of a run, and two runs compared on the
  same users (difference, standard error, 95% interval, relative change).

Names load on first use (``lazy_loader``, from ``__init__.pyi``): ``mitt evaluate --help``
reads :data:`METRICS_FILE` and the run tables here, and an eager import would load FAISS,
pandas and pyarrow into it.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
