"""Errors of the retrieval service, one class per gRPC status the server returns, under one base
(:class:`RetrievalError`).

Both sides use them. The server's code raises them (the :class:`~retrieval.serving.Retriever`,
admission, plain-Python callers too); :func:`retrieval.serving.status_for` is the one place that
answers one with its status, its message as the details. The client raises them for a failed
call (:func:`error_from_call`), with what the server sent beside the status: the retry pushback
and the request id. A :class:`RetrievalError` is a ``grpc.RpcError`` with ``grpc.Call``'s
``code()``, ``details()`` and ``trailing_metadata()``, so ``except grpc.RpcError as e:
e.code()`` keeps catching what the client raises.

Example:
    >>> try:
    ...     client.retrieve(["B0001"], k=5000)
    ... except InvalidArgument as e:
    ...     print(e.message)  # k must be between 1 and 1000, got 5000
    ... except ResourceExhausted as e:
    ...     time.sleep(e.retry_after or 1.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, cast

import grpc

PUSHBACK = "grpc-retry-pushback-ms"
"""The trailer of a refusal that may clear: milliseconds to wait before a retry (gRPC retry
policies, and :class:`~retrieval.api.RetrievalClient`'s, honour it)."""

REQUEST_ID = "x-request-id"
"""The metadata key of a call's request id: sent by the caller (optional), returned by a server
that keeps an access log in the call's trailing metadata."""

Metadata = Sequence[tuple[str, str | bytes]]
"""A call's metadata as gRPC gives it: ``(key, value)`` pairs."""


class RetrievalError(grpc.RpcError):
    """A call that failed with a status; the message says what to fix (the server sends it).

    Attributes:
        message: the status's details.
        retry_after: seconds after which a retry may succeed (the ``grpc-retry-pushback-ms``
            trailer), for refusals that may clear; ``None`` when unknown.
        request_id: the id the server gave the call (``x-request-id``: the line of its access
            log), when it sent one.
    """

    status: ClassVar[grpc.StatusCode] = grpc.StatusCode.UNKNOWN
    """The status of the class's errors."""

    def __init__(
        self,
        message: str,
        retry_after: float | None = None,
        *,
        request_id: str | None = None,
        trailing_metadata: Metadata = (),
        code: grpc.StatusCode | None = None,
    ) -> None:
        """``trailing_metadata``: the call's, as received; ``code``: the status when no class
        has it (the base class only: CANCELLED, UNKNOWN... from gRPC itself)."""
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.request_id = request_id
        self._trailing = tuple(trailing_metadata)
        self._code = code or self.status

    def code(self) -> grpc.StatusCode:
        """The status code, as ``grpc.Call.code()``."""
        return self._code

    def details(self) -> str:
        """The message, as ``grpc.Call.details()``."""
        return self.message

    def trailing_metadata(self) -> tuple[Any, ...]:  # (key, value) pairs; the stubs' _Metadatum
        """The call's trailing metadata, as ``grpc.Call.trailing_metadata()`` (empty for an error
        raised by the server's own code)."""
        return self._trailing


class InvalidArgument(RetrievalError):
    """The request itself is wrong (k out of range, empty or unusable history).

    Attributes:
        reason: what is wrong.
        request: in a batch, the index of the request that is wrong (the message then starts
            with ``requests[i]: ``); ``None`` otherwise (and on the client's side).
    """

    status = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(
        self,
        reason: str,
        request: int | None = None,
        *,
        request_id: str | None = None,
        trailing_metadata: Metadata = (),
    ) -> None:
        message = reason if request is None else f"requests[{request}]: {reason}"
        super().__init__(message, request_id=request_id, trailing_metadata=trailing_metadata)
        self.reason = reason
        self.request = request


class NotFound(RetrievalError):
    """Something the request names does not exist."""

    status = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(RetrievalError):
    """The server is out of a resource (capacity, quota, the caller's rate) for this request;
    ``retry_after`` says when a retry may succeed."""

    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(RetrievalError):
    """The service cannot answer right now (still loading, stopping, unreachable); retrying later
    may work."""

    status = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(RetrievalError):
    """The request's deadline passed before the answer was ready."""

    status = grpc.StatusCode.DEADLINE_EXCEEDED


class Unauthenticated(RetrievalError):
    """The call carried no credentials the server knows (a bearer token, a client certificate)."""

    status = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(RetrievalError):
    """The caller may not call this method."""

    status = grpc.StatusCode.PERMISSION_DENIED


class Unimplemented(RetrievalError):
    """The server does not implement the method, or a field of the request (the native engine's
    message names the field)."""

    status = grpc.StatusCode.UNIMPLEMENTED


class Internal(RetrievalError):
    """A bug on the server's side; its log holds the traceback."""

    status = grpc.StatusCode.INTERNAL


ERRORS: dict[grpc.StatusCode, type[RetrievalError]] = {
    cls.status: cls
    for cls in (
        InvalidArgument,
        NotFound,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
        Unauthenticated,
        PermissionDenied,
        Unimplemented,
        Internal,
    )
}
"""The class of each status the server returns."""


def error_from_call(error: grpc.RpcError) -> RetrievalError:
    """The typed error of a failed call as grpcio raised it: the class of its status (the base
    class for another status), its details, pushback and request id."""
    message, code = error.details() or "", error.code()
    trailing = cast(Metadata, tuple(error.trailing_metadata() or ()))
    request_id = trailer(trailing, REQUEST_ID)
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgument(message, request_id=request_id, trailing_metadata=trailing)
    pushback = trailer(trailing, PUSHBACK)
    retry_after = int(pushback) / 1000 if pushback is not None and pushback.isdigit() else None
    cls = ERRORS.get(code, RetrievalError)
    return cls(message, retry_after, request_id=request_id, trailing_metadata=trailing, code=code)


def trailer(metadata: Metadata, key: str) -> str | None:
    """The first value of ``key`` in a call's metadata, as text; ``None`` when absent."""
    for name, value in metadata:
        if name == key:
            return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return None


def shorten(text: str, limit: int = 64) -> str:
    """``repr(text)`` cut to ``limit`` characters (ending ``...``): how a client's string appears
    in an error message, so that the message stays short whatever the client sent."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."
