"""The client's typed errors: one class per status the server returns, each with the status, the
message, the retry pushback and the request id, all caught by ``except grpc.RpcError``."""

from __future__ import annotations

import socket
from collections.abc import Sequence

import grpc
import pytest

from retrieval.api import RetrievalClient, request_id
from retrieval.api.errors import (
    ERRORS,
    DeadlineExceeded,
    InvalidArgument,
    ResourceExhausted,
    RetrievalError,
    Unavailable,
    error_from_call,
)
from retrieval.serving import AccessControl, AccessLog, RateLimiter, Retriever
from tests.helpers import GatedRetriever, serving

SERVER_STATUSES = {
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "RESOURCE_EXHAUSTED",
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
    "UNAUTHENTICATED",
    "PERMISSION_DENIED",
    "UNIMPLEMENTED",
    "INTERNAL",
}
"""The statuses a server of ours answers with (docs/serving.md, "Errors")."""


class FailedCall(grpc.RpcError):
    """A failed call as grpcio raises it: the error is also the call."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: Sequence[tuple[str, str]]) -> None:
        self._code, self._details, self._trailing = code, details, tuple(trailing)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:  # type: ignore[override]
        return self._trailing


def test_each_status_the_server_returns_has_its_own_class() -> None:
    assert {code.name for code in ERRORS} == SERVER_STATUSES
    assert len(set(ERRORS.values())) == len(SERVER_STATUSES)
    for code, cls in ERRORS.items():
        assert cls.__name__ == code.name.title().replace("_", "")  # INVALID_ARGUMENT: InvalidArgument


@pytest.mark.parametrize("code", sorted(ERRORS, key=lambda c: c.name))
def test_a_failed_call_becomes_its_class_with_what_the_server_sent(code: grpc.StatusCode) -> None:
    trailing = [("grpc-retry-pushback-ms", "250"), ("x-request-id", "req-7")]
    error = error_from_call(FailedCall(code, "what to fix", trailing))
    assert type(error) is ERRORS[code]
    assert isinstance(error, RetrievalError) and isinstance(error, grpc.RpcError)
    assert (error.code(), error.message, error.details(), str(error)) == (code, *["what to fix"] * 3)
    assert (error.request_id, request_id(error), error.trailing_metadata()) == (
        "req-7",
        "req-7",
        tuple(trailing),
    )
    # A request that is wrong stays wrong: no retry hint, whatever the trailer says.
    assert error.retry_after == (None if code is grpc.StatusCode.INVALID_ARGUMENT else 0.25)


def test_a_status_without_a_class_is_the_base_class_with_its_code() -> None:
    error = error_from_call(FailedCall(grpc.StatusCode.CANCELLED, "cancelled", []))
    assert type(error) is RetrievalError and error.code() is grpc.StatusCode.CANCELLED
    assert (error.retry_after, error.request_id) == (None, None)
    assert (
        error_from_call(
            FailedCall(grpc.StatusCode.ABORTED, "", [("grpc-retry-pushback-ms", "x")])
        ).retry_after
        is None
    )


def test_a_server_answers_with_typed_errors_that_old_except_clauses_still_catch(retriever: Retriever) -> None:
    access = AccessControl(access_log=AccessLog(sample=0.01), rate_limit=RateLimiter(rate=0.5, burst=1))
    with (
        serving(retriever, access=access) as address,
        RetrievalClient(address, retries=0, metadata=[("x-request-id", "mine")]) as client,
    ):
        with pytest.raises(grpc.RpcError) as caught:  # an except clause written before the classes
            client.retrieve(["item01"], 0)
        wrong = caught.value
        assert isinstance(wrong, InvalidArgument) and wrong.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert wrong.message.startswith("k must be") and (wrong.request_id, wrong.retry_after) == (
            "mine",
            None,
        )
        with pytest.raises(ResourceExhausted) as refused:  # the retrieve took the one token
            client.model_info()
        pushback = dict(refused.value.trailing_metadata())["grpc-retry-pushback-ms"]
        assert refused.value.retry_after == int(pushback) / 1000 and 0 < refused.value.retry_after <= 2.0
        assert "rate limit of 0.5 requests/s" in refused.value.message and refused.value.request_id == "mine"


def test_a_call_past_its_deadline_is_deadline_exceeded(retriever: Retriever) -> None:
    gated = GatedRetriever(retriever.model, retriever.index)
    with serving(gated) as address, RetrievalClient(address, timeout=0.5, retries=0) as client:
        gated.gate.clear()
        try:
            with pytest.raises(DeadlineExceeded) as late:
                client.retrieve(["item01"], 3)
        finally:
            gated.gate.set()
    assert late.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED


def test_no_server_is_unavailable() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with RetrievalClient(f"127.0.0.1:{port}", timeout=2, retries=0) as client, pytest.raises(Unavailable):
        client.model_info()
