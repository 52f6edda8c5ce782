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

from retrieval.api.client import RetrievalClient, request_id
from retrieval.api.convert import (
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_RESPONSE_BYTES,
    SERVICE_NAME,
    check_sizes,
    model_info_message,
    query_from_request,
    response_from_result,
)
from retrieval.api.errors import (
    PUSHBACK,
    REQUEST_ID,
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    RetrievalError,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    shorten,
)
from retrieval.api.types import (
    DEFAULT_RERANK_CANDIDATES,
    EXPLAIN_TOP,
    MAX_BATCH,
    MAX_FILTER_IDS,
    MAX_HISTORY,
    MAX_K,
    MAX_NAME,
    MAX_PER_INTEREST_K,
    MAX_USER_ID,
    ExplanationKind,
    Explanations,
    MergeStrategy,
    ModelInfo,
    Query,
    Rerank,
    Retrieved,
    as_query,
)

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_RERANK_CANDIDATES",
    "EXPLAIN_TOP",
    "MAX_BATCH",
    "MAX_FILTER_IDS",
    "MAX_HISTORY",
    "MAX_K",
    "MAX_NAME",
    "MAX_PER_INTEREST_K",
    "MAX_USER_ID",
    "PUSHBACK",
    "REQUEST_ID",
    "SERVICE_NAME",
    "DeadlineExceeded",
    "ExplanationKind",
    "Explanations",
    "Internal",
    "InvalidArgument",
    "MergeStrategy",
    "ModelInfo",
    "NotFound",
    "PermissionDenied",
    "Query",
    "Rerank",
    "ResourceExhausted",
    "RetrievalClient",
    "RetrievalError",
    "Retrieved",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "as_query",
    "check_sizes",
    "model_info_message",
    "query_from_request",
    "request_id",
    "response_from_result",
    "shorten",
]
