"""Domain errors of the retrieval service, one class per gRPC status the server can return.

The classes stay free of gRPC so that plain-Python callers (tests, batch jobs) can use the
:class:`~retrieval.serving.Retriever` directly; :func:`retrieval.serving.status_for` is the one
place that turns them into status codes.
"""

from __future__ import annotations


class RetrievalError(Exception):
    """Base class; the message is sent to the client, so it must say what to fix."""


class InvalidArgument(RetrievalError):
    """The request itself is wrong (k out of range, empty or unusable history)."""


class NotFound(RetrievalError):
    """Something the request names does not exist."""


class ResourceExhausted(RetrievalError):
    """The server is out of a resource (capacity, quota) for this request."""


class Unavailable(RetrievalError):
    """The service cannot answer right now (e.g. still loading); retrying later may work."""


class DeadlineExceeded(RetrievalError):
    """The request's deadline passed before the answer was ready."""
