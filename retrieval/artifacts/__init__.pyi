"""The public API of :mod:`retrieval.artifacts` (loaded on first use by ``__init__.py``)."""

from .catalogue import CatalogueChange, CatalogueItem, change_catalogue, cold_vectors, read_ids, read_items
from .categories import Categories
from .deployment import (
    INDEX_DIR,
    MODEL_DIR,
    RANKERS_DIR,
    deployment_dirs,
    deployment_rankers,
    publish_deployment,
)
from .index import (
    build_index_from_model,
    build_milvus_index_from_model,
    item_queries,
    load_index,
    measure_index,
    publish_index,
    save_index,
    tune_index_for_model,
    user_interest_queries,
)
from .index_config import (
    AUTO_FACTORY,
    AUTO_TARGET_RECALL,
    BACKENDS,
    IndexConfig,
    MilvusConfig,
    resolve_index_config,
)
from .model import (
    Features,
    ModelArtifact,
    encode_histories,
    load_catalogue,
    load_model,
    pad_left,
    read_item_attributes,
    read_model_vocab,
)
from .ranker import LoadedRanker, check_same_vocab, load_ranker, save_ranker
from .ranker_inputs import AttributeTable

__all__ = [
    "AUTO_FACTORY",
    "AUTO_TARGET_RECALL",
    "BACKENDS",
    "INDEX_DIR",
    "MODEL_DIR",
    "RANKERS_DIR",
    "AttributeTable",
    "CatalogueChange",
    "CatalogueItem",
    "Categories",
    "Features",
    "IndexConfig",
    "LoadedRanker",
    "MilvusConfig",
    "ModelArtifact",
    "build_index_from_model",
    "build_milvus_index_from_model",
    "change_catalogue",
    "check_same_vocab",
    "cold_vectors",
    "deployment_dirs",
    "deployment_rankers",
    "encode_histories",
    "item_queries",
    "load_catalogue",
    "load_index",
    "load_model",
    "load_ranker",
    "measure_index",
    "pad_left",
    "publish_deployment",
    "publish_index",
    "read_ids",
    "read_item_attributes",
    "read_items",
    "read_model_vocab",
    "resolve_index_config",
    "save_index",
    "save_ranker",
    "tune_index_for_model",
    "user_interest_queries",
]
