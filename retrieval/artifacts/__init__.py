"""The folders training writes and serving reads: a model, its index, rankers, and deployments of them.

* :mod:`~retrieval.artifacts.model`: the trained model (:func:`load_model` ->
  :class:`ModelArtifact`: vocabulary, item embeddings, the exported user tower).
* :mod:`~retrieval.artifacts.index`: the index of a model's item embeddings, built, tuned to a
  recall target and measured against exact search.
* :mod:`~retrieval.artifacts.index_config`: :class:`IndexConfig`, the settings of an index build
  (``mitt build-index``), checked before FAISS is loaded.
* :mod:`~retrieval.artifacts.ranker`: a pre-ranking model tied to a model's vocabulary
  (TensorFlow is imported only when one is loaded).
* :mod:`~retrieval.artifacts.deployment`: a model, its index and rankers published together as
  one version of a root that servers watch.
* :mod:`~retrieval.artifacts.catalogue`: items added (cold-start vectors from their attributes),
  updated and removed after training, published as a new version of a deployment.

Every artifact is written atomically, carries a manifest with checksums and the version it came
from, and is verified on load (:mod:`retrieval.storage`).

Names load on first use (``lazy_loader``, from ``__init__.pyi``): ``mitt build-index --help``
reads :class:`IndexConfig` here and ``mitt train-ranker --help`` the ranker's inputs, and an
eager import would load FAISS, pandas and pyarrow into both.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
