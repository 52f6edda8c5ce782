"""The retrieval API as a caller sees it: request and response types, errors, proto conversion, client.

* :mod:`~retrieval.api.types`: :class:`Query`, :class:`Rerank`, :class:`Retrieved`,
  :class:`ModelInfo`, :class:`MergeStrategy` and the API's limits (``MAX_K``, ...).
* :mod:`~retrieval.api.errors`: one exception class per gRPC status the server returns.
* :mod:`~retrieval.api.convert`: those types to and from the messages of ``proto/retrieval.proto``.
* :mod:`~retrieval.api.client`: :class:`RetrievalClient`, over one server or several replicas.

Light by design: it needs grpcio, protobuf and numpy, never TensorFlow, FAISS or pandas (a test
checks), so that a service calling the retriever installs only this.

Example:
    >>> from retrieval.api import RetrievalClient
    >>> with RetrievalClient("localhost:50051") as client:
    ...     client.retrieve(["B0001", "B0042"], k=10).items[0]
"""

from retrieval.api.client import RetrievalClient, channel_target, service_config
from retrieval.api.convert import (
    DEFAULT_MAX_MESSAGE_BYTES,
    SERVICE_NAME,
    model_info_message,
    query_from_request,
    request_from_query,
    response_from_result,
    result_from_response,
)
from retrieval.api.errors import (
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    RetrievalError,
    Unavailable,
)
from retrieval.api.types import (
    DEFAULT_RERANK_CANDIDATES,
    MAX_BATCH,
    MAX_FILTER_IDS,
    MAX_HISTORY,
    MAX_K,
    MAX_PER_INTEREST_K,
    MAX_USER_ID,
    MergeStrategy,
    ModelInfo,
    Query,
    Rerank,
    Retrieved,
)

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_RERANK_CANDIDATES",
    "MAX_BATCH",
    "MAX_FILTER_IDS",
    "MAX_HISTORY",
    "MAX_K",
    "MAX_PER_INTEREST_K",
    "MAX_USER_ID",
    "SERVICE_NAME",
    "DeadlineExceeded",
    "InvalidArgument",
    "MergeStrategy",
    "ModelInfo",
    "NotFound",
    "Query",
    "Rerank",
    "ResourceExhausted",
    "RetrievalClient",
    "RetrievalError",
    "Retrieved",
    "Unavailable",
    "channel_target",
    "model_info_message",
    "query_from_request",
    "request_from_query",
    "response_from_result",
    "result_from_response",
    "service_config",
]
