"""FAISS inner-product index with ids (needs only numpy and FAISS)."""

from index.faiss_index import METRIC, FaissIndex, recall_at_k

__all__ = ["METRIC", "FaissIndex", "recall_at_k"]
