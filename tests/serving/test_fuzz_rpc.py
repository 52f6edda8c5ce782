"""Property-based fuzzing of every RPC against a real server bound to port 0.

The generator and the checks live in ``bench.robustness`` (which sends 10,000 of the same
requests to a server in its own process); here a few hundred, derandomized, so the suite is
deterministic and bounded.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.robustness import (
    FUZZ_MAX_MESSAGE_BYTES,
    SYNTHETIC_ATTRIBUTES,
    SYNTHETIC_ITEMS,
    Call,
    FuzzClient,
    RequestStrategies,
    Served,
    check_call,
    make_call,
    served_by,
    synthetic_retriever,
)
from retrieval.api.v1 import retrieval_pb2
from retrieval.serving.config import LimitsConfig
from retrieval.serving.server import create_server
from tests.helpers import local

STRATEGIES = RequestStrategies(SYNTHETIC_ITEMS, sorted({a for v in SYNTHETIC_ATTRIBUTES.values() for a in v}))
FUZZ_SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


@pytest.fixture(scope="module")
def target() -> Iterator[tuple[FuzzClient, Served]]:
    retriever = synthetic_retriever()
    mib = FUZZ_MAX_MESSAGE_BYTES / 2**20
    server, port = create_server(
        retriever, local(limits=LimitsConfig(max_request_mb=mib, max_response_mb=mib))
    )
    client = FuzzClient(f"127.0.0.1:{port}")
    client.wait_ready(30)
    yield client, served_by(retriever, SYNTHETIC_ATTRIBUTES)
    client.close()
    server.stop(None)


def answer(client: FuzzClient, served: Served, call: Call) -> list[str]:
    code, details, response = client.send(call)
    return check_call(call, code, details, response, served)


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
@settings(FUZZ_SETTINGS, max_examples=300)
@given(call=STRATEGIES.calls())
def test_every_rpc_answers_a_valid_result_or_a_documented_status(
    target: tuple[FuzzClient, Served], call: Call
) -> None:
    client, served = target
    problems = answer(client, served, call)
    assert not problems, f"{call.describe()}: {problems}"
    assert client.good_request_works(served), f"a good request failed after {call.describe()}"


@settings(FUZZ_SETTINGS, max_examples=40)
@given(requests=st.lists(STRATEGIES.good_retrieve, min_size=1, max_size=8))
def test_a_batch_answers_each_request_as_if_sent_alone(
    target: tuple[FuzzClient, Served], requests: list[retrieval_pb2.RetrieveRequest]
) -> None:
    client, served = target
    batch = retrieval_pb2.BatchRetrieveRequest(requests=requests)
    call = make_call("BatchRetrieve", batch.SerializeToString(), "typed")
    code, details, payload = client.send(call)
    assert not check_call(call, code, details, payload, served)
    assert payload is not None
    for request, in_batch in zip(
        requests, retrieval_pb2.BatchRetrieveResponse.FromString(payload).responses, strict=True
    ):
        alone_call = make_call("Retrieve", request.SerializeToString(), "typed")
        code, _, alone = client.send(alone_call)
        assert code is grpc.StatusCode.OK and alone is not None
        expected = retrieval_pb2.RetrieveResponse.FromString(alone)
        assert [(i.item_id, i.interest) for i in in_batch.items] == [
            (i.item_id, i.interest) for i in expected.items
        ]
        np.testing.assert_allclose(
            [i.score for i in in_batch.items], [i.score for i in expected.items], rtol=1e-5
        )


@settings(FUZZ_SETTINGS, max_examples=8)
@given(calls=st.lists(STRATEGIES.calls(), min_size=12, max_size=12))
def test_concurrent_generated_calls_are_each_answered_correctly(
    target: tuple[FuzzClient, Served], calls: list[Call]
) -> None:
    client, served = target
    problems: list[str] = []

    def send(part: list[Call]) -> None:
        for call in part:
            problems.extend(f"{call.describe()}: {p}" for p in answer(client, served, call))

    threads = [threading.Thread(target=send, args=(calls[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not problems
    assert client.good_request_works(served)


# Minimal payloads that are not a valid request message (hand-encoded protobuf wire bytes).
UNDECODABLE = [
    ("Retrieve", b"\x0a\x01\xff\x10\x03"),  # history = [b"\xff"] (invalid UTF-8), k = 3
    ("Retrieve", b"\x52\x02\xc3\x28\x10\x03"),  # user_id = b"\xc3\x28" (invalid UTF-8), k = 3
    ("Retrieve", b"\x0a\x06item"),  # history[0] says 6 bytes, 4 follow (truncated)
    ("BatchRetrieve", b"\x0a\x05\x0a\x01\xff\x10\x03"),  # requests[0].history = [b"\xff"]
    ("GetModelInfo", b"\xff\xff\xff"),  # not a protobuf message at all
]


def test_undecodable_requests_never_take_the_server_down(target: tuple[FuzzClient, Served]) -> None:
    client, served = target
    for method, payload in UNDECODABLE:
        call = make_call(method, payload, "undecodable")
        assert call.request is None  # the payloads really are invalid
        code, _, _ = client.send(call)
        assert code not in (grpc.StatusCode.OK, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE)
        assert client.good_request_works(served)


def test_undecodable_requests_are_invalid_argument(target: tuple[FuzzClient, Served]) -> None:
    client, _ = target
    for method, payload in UNDECODABLE:
        code, details, _ = client.send(make_call(method, payload, "undecodable"))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and details, (method, payload, code, details)


# --- the checks themselves: wrong answers must be caught -----------------------------------


def test_the_checks_catch_wrong_answers(target: tuple[FuzzClient, Served]) -> None:
    client, served = target
    request = retrieval_pb2.RetrieveRequest(history=["item01", "item02"], k=5, exclude_ids=["item03"])
    call = make_call("Retrieve", request.SerializeToString(), "typed")
    code, details, payload = client.send(call)
    assert code is grpc.StatusCode.OK and not check_call(call, code, details, payload, served)
    assert payload is not None
    good = retrieval_pb2.RetrieveResponse.FromString(payload)

    def wrong(change: str) -> list[str]:
        response = retrieval_pb2.RetrieveResponse()
        response.CopyFrom(good)
        if change == "history item":
            response.items[0].item_id = "item01"
        elif change == "excluded item":
            response.items[0].item_id = "item03"
        elif change == "unsorted":
            response.items[0].score, response.items[1].score = (
                response.items[1].score,
                response.items[0].score,
            )
        elif change == "nan":
            response.items[2].score = float("nan")
        elif change == "short":
            del response.items[-1]
        elif change == "duplicate":
            response.items[1].item_id = response.items[0].item_id
        elif change == "score":
            response.items[4].score += 1.0
        elif change == "interest":
            response.items[0].interest = 7
        return check_call(call, grpc.StatusCode.OK, "", response.SerializeToString(), served)

    for change in (
        "history item",
        "excluded item",
        "unsorted",
        "nan",
        "short",
        "duplicate",
        "score",
        "interest",
    ):
        assert wrong(change), change
    # Statuses: INTERNAL is never allowed, an error needs a message, a bad request must be refused.
    assert check_call(call, grpc.StatusCode.INTERNAL, "internal error", None, served)
    bad = make_call(
        "Retrieve", retrieval_pb2.RetrieveRequest(history=["item01"], k=0).SerializeToString(), "typed"
    )
    assert check_call(bad, grpc.StatusCode.INVALID_ARGUMENT, "", None, served)  # no message
    assert check_call(bad, grpc.StatusCode.OK, "", payload, served)  # answered although invalid
    assert not check_call(bad, grpc.StatusCode.INVALID_ARGUMENT, "k must be ...", None, served)
