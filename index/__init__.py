"""Vector indexes behind one interface (needs only numpy and FAISS; Milvus optionally).

* :class:`VectorIndex`: the interface (build/add, search with a :class:`SearchFilter`,
  remove, upsert, save, load, ``is_exact``, ``describe``).
* :class:`FaissIndex`: any FAISS factory string over inner product, ids through ``IDMap2``.
* :class:`index.milvus_index.MilvusIndex`: the same interface over a Milvus collection (import
  it from its module: it needs ``pymilvus``).
* :func:`tune`: the cheapest index / search parameters reaching a recall target.
* :func:`estimate_memory`: the size of a factory string before building it.
"""

from index.base import METRIC, SearchFilter, VectorIndex
from index.faiss_index import FaissIndex, parse_search_params, recall_at_k, recall_of
from index.memory import MemoryEstimate, estimate_memory
from index.tuning import OperatingPoint, TuningResult, candidate_factories, exact_neighbours, tune

__all__ = [
    "METRIC",
    "FaissIndex",
    "MemoryEstimate",
    "OperatingPoint",
    "SearchFilter",
    "TuningResult",
    "VectorIndex",
    "candidate_factories",
    "estimate_memory",
    "exact_neighbours",
    "parse_search_params",
    "recall_at_k",
    "recall_of",
    "tune",
]
