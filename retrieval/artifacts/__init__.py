"""The folders training writes and serving reads: a model, its index, rankers, and deployments of them.

* :mod:`~retrieval.artifacts.model`: the trained model (:func:`load_model` ->
  :class:`ModelArtifact`: vocabulary, item embeddings, the exported user tower).
* :mod:`~retrieval.artifacts.index`: the index of a model's item embeddings, built, tuned to a
  recall target and measured against exact search.
* :mod:`~retrieval.artifacts.ranker`: a pre-ranking model tied to a model's vocabulary
  (TensorFlow is imported only when one is loaded).
* :mod:`~retrieval.artifacts.deployment`: a model, its index and rankers published together as
  one version of a root that servers watch.

Every artifact is written atomically, carries a manifest with checksums and the version it came
from, and is verified on load (:mod:`retrieval.storage`).
"""

from retrieval.artifacts.deployment import (
    INDEX_DIR,
    MODEL_DIR,
    RANKERS_DIR,
    deployment_dirs,
    deployment_rankers,
    publish_deployment,
)
from retrieval.artifacts.index import (
    build_index_from_model,
    item_queries,
    load_index,
    measure_index,
    publish_index,
    recall_against_exact,
    save_index,
    tune_index_for_model,
    user_interest_queries,
)
from retrieval.artifacts.model import (
    Features,
    ModelArtifact,
    dense_categories,
    encode_histories,
    load_model,
    pad_left,
    read_item_attributes,
    read_model_vocab,
)
from retrieval.artifacts.ranker import (
    AttributeTable,
    LoadedRanker,
    check_same_vocab,
    load_ranker,
    save_ranker,
)

__all__ = [
    "INDEX_DIR",
    "MODEL_DIR",
    "RANKERS_DIR",
    "AttributeTable",
    "Features",
    "LoadedRanker",
    "ModelArtifact",
    "build_index_from_model",
    "check_same_vocab",
    "dense_categories",
    "deployment_dirs",
    "deployment_rankers",
    "encode_histories",
    "item_queries",
    "load_index",
    "load_model",
    "load_ranker",
    "measure_index",
    "pad_left",
    "publish_deployment",
    "publish_index",
    "read_item_attributes",
    "read_model_vocab",
    "recall_against_exact",
    "save_index",
    "save_ranker",
    "tune_index_for_model",
    "user_interest_queries",
]
