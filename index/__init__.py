"""Vector indexes behind one interface (needs only numpy and FAISS; Milvus optionally).

* :class:`VectorIndex`: the interface (build/add, search with a :class:`SearchFilter`,
  remove, upsert, save, load, ``is_exact``, ``describe``).
* :class:`FaissIndex`: any FAISS factory string over inner product, ids through ``IDMap2``.
* :class:`index.milvus_index.MilvusIndex`: the same interface over a Milvus collection (import
  it from its module: it needs ``pymilvus``).
* :func:`tune`: the cheapest index / search parameters reaching a recall target.
* :func:`estimate_memory`: the size of a factory string before building it.
* :func:`search_interests`: K interest vectors per user, one batched search, the per-interest
  lists merged (:mod:`index.merge`: max-score, round-robin, ComiRec's diversity) into a top-k.
"""

from index.base import METRIC, SearchFilter, VectorIndex, members, sorted_update
from index.faiss_index import FaissIndex, check_mips_norm, parse_search_params, recall_at_k, recall_of
from index.memory import MemoryEstimate, estimate_memory
from index.merge import MERGES, Merged, MergeFn, best_per_item, diversity, max_score, round_robin, strategy
from index.multi_interest import ItemCategories, SearchResult, search_interests
from index.tuning import OperatingPoint, TuningResult, candidate_factories, exact_neighbours, tune

__all__ = [
    "MERGES",
    "METRIC",
    "FaissIndex",
    "ItemCategories",
    "MemoryEstimate",
    "MergeFn",
    "Merged",
    "OperatingPoint",
    "SearchFilter",
    "SearchResult",
    "TuningResult",
    "VectorIndex",
    "best_per_item",
    "candidate_factories",
    "check_mips_norm",
    "diversity",
    "estimate_memory",
    "exact_neighbours",
    "max_score",
    "members",
    "parse_search_params",
    "recall_at_k",
    "recall_of",
    "round_robin",
    "search_interests",
    "sorted_update",
    "strategy",
    "tune",
]
