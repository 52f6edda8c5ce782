"""Domain errors of the retrieval service, one class per gRPC status the server can return.

The classes stay free of gRPC so that plain-Python callers (tests, batch jobs) can use the
:class:`~retrieval.serving.Retriever` directly; :func:`retrieval.serving.status_for` is the one
place that turns them into status codes.
"""

from __future__ import annotations


class RetrievalError(Exception):
    """Base class; the message is sent to the client, so it must say what to fix."""


class InvalidArgument(RetrievalError):
    """The request itself is wrong (k out of range, empty or unusable history).

    Attributes:
        reason: what is wrong.
        request: in a batch, the index of the request that is wrong (the message then starts
            with ``requests[i]: ``); ``None`` otherwise.
    """

    def __init__(self, reason: str, request: int | None = None) -> None:
        super().__init__(reason if request is None else f"requests[{request}]: {reason}")
        self.reason = reason
        self.request = request


class NotFound(RetrievalError):
    """Something the request names does not exist."""


class ResourceExhausted(RetrievalError):
    """The server is out of a resource (capacity, quota) for this request.

    Attributes:
        retry_after: seconds after which a retry may succeed (sent to gRPC clients as the
            ``grpc-retry-pushback-ms`` trailer, which their retry policy honours); ``None``
            when unknown.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Unavailable(RetrievalError):
    """The service cannot answer right now (e.g. still loading); retrying later may work."""


class DeadlineExceeded(RetrievalError):
    """The request's deadline passed before the answer was ready."""


def shorten(text: str, limit: int = 64) -> str:
    """``repr(text)`` cut to ``limit`` characters (ending ``...``): how a client's string appears
    in an error message, so that the message stays short whatever the client sent."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."
