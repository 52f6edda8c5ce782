"""The generated modules of :mod:`retrieval.api.v1` (loaded on first use by ``__init__.py``)."""

from . import retrieval_pb2, retrieval_pb2_grpc

__all__ = ["retrieval_pb2", "retrieval_pb2_grpc"]
