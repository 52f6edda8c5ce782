"""Dynamic micro-batching: each caller gets its own answer, errors stay with their query."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from retrieval.api.client import RetrievalClient
from retrieval.api.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted, Unavailable
from retrieval.api.types import MergeStrategy, Query, Retrieved
from retrieval.api.v1 import retrieval_pb2
from retrieval.artifacts.index import build_index_from_model
from retrieval.serving.batching import MicroBatcher
from retrieval.serving.server import create_server
from tests.helpers import ITEMS, GatedRetriever, assert_same, brute_force, make_model


@pytest.fixture
def retriever() -> GatedRetriever:
    model = make_model()
    return GatedRetriever(model, build_index_from_model(model, "Flat"))


def queries(n: int) -> list[Query]:
    """``n`` different users, with different k and merges."""
    merges = [MergeStrategy.MAX_SCORE, MergeStrategy.ROUND_ROBIN, MergeStrategy.MAX_SCORE]
    return [
        Query([ITEMS[(3 * i + j) % len(ITEMS)] for j in range(1 + i % 5)], k=2 + i % 7, merge=merges[i % 3])
        for i in range(n)
    ]


def submit_held(batcher: MicroBatcher, retriever: GatedRetriever, batch: Sequence[Query]) -> list[Any]:
    """Submits ``batch`` from one thread each while the first call is held, so the rest queue up
    and form a batch; returns each thread's answer or exception."""
    retriever.gate.clear()
    retriever.entered.clear()
    with ThreadPoolExecutor(len(batch)) as pool:
        first = pool.submit(batcher.submit, batch[0])
        assert retriever.entered.wait(5)
        rest = [pool.submit(batcher.submit, q) for q in batch[1:]]
        while batcher.queued < len(rest):  # every other query is waiting
            time.sleep(0.005)
        retriever.gate.set()
        futures = [first, *rest]
        return [f.exception() or f.result() for f in futures]


def test_batched_answers_equal_unbatched_ones(retriever: GatedRetriever) -> None:
    batch = queries(12)
    alone = [retriever.retrieve_many([q])[0] for q in batch]
    retriever.sizes.clear()
    batcher = MicroBatcher(lambda: retriever, max_batch=32)
    try:
        answers = submit_held(batcher, retriever, batch)
    finally:
        batcher.close()
    assert retriever.sizes == [1, 11]  # the held call, then everything that queued behind it
    for got, expected in zip(answers, alone, strict=True):
        assert got == expected
    # ... and equal to brute force for the max-score ones.
    for q, got in zip(batch, answers, strict=True):
        if q.merge is MergeStrategy.MAX_SCORE:
            assert_same(got.items, brute_force(retriever.model, list(q.history), q.k))


def test_batches_are_bounded(retriever: GatedRetriever) -> None:
    batcher = MicroBatcher(lambda: retriever, max_batch=4)
    try:
        answers = submit_held(batcher, retriever, queries(11))
    finally:
        batcher.close()
    assert all(isinstance(a, Retrieved) for a in answers)
    assert retriever.sizes == [1, 4, 4, 2]


def test_a_bad_query_fails_alone(retriever: GatedRetriever) -> None:
    batch = queries(6)
    batch[3] = Query(["item01"], k=0)  # k out of range
    batcher = MicroBatcher(lambda: retriever)
    try:
        answers = submit_held(batcher, retriever, batch)
    finally:
        batcher.close()
    assert isinstance(answers[3], InvalidArgument) and str(answers[3]).startswith("k must be")
    for i, answer in enumerate(answers):
        if i != 3:
            assert answer == retriever.retrieve_many([batch[i]])[0]


def test_a_query_whose_deadline_passes_in_the_queue_is_not_computed(retriever: GatedRetriever) -> None:
    batcher = MicroBatcher(lambda: retriever)
    retriever.gate.clear()
    retriever.entered.clear()
    try:
        with ThreadPoolExecutor(2) as pool:
            held = pool.submit(batcher.submit, Query(["item01"], k=3))
            assert retriever.entered.wait(5)
            with pytest.raises(DeadlineExceeded):
                batcher.submit(Query(["item02"], k=3), timeout=0.05)
            time.sleep(0.05)
            retriever.gate.set()
            assert len(held.result().items) == 3
            assert len(batcher.submit(Query(["item03"], k=2)).items) == 2
    finally:
        batcher.close()
    assert retriever.sizes == [1, 1]  # the held query and the last one: the late one was dropped


def test_a_full_queue_refuses_and_a_closed_batcher_is_unavailable(retriever: GatedRetriever) -> None:
    batcher = MicroBatcher(lambda: retriever, max_queue=2)
    retriever.gate.clear()
    retriever.entered.clear()
    with ThreadPoolExecutor(3) as pool:
        held = [pool.submit(batcher.submit, Query(["item01"], k=3))]
        assert retriever.entered.wait(5)
        held += [pool.submit(batcher.submit, Query([f"item0{i}"], k=3)) for i in (2, 3)]
        while batcher.queued < 2:
            time.sleep(0.005)
        with pytest.raises(ResourceExhausted, match="2 requests queued"):
            batcher.submit(Query(["item04"], k=3))
        retriever.gate.set()
        assert [len(f.result().items) for f in held] == [3, 3, 3]
    batcher.close()
    with pytest.raises(Unavailable):
        batcher.submit(Query(["item01"], k=3))


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        MicroBatcher(lambda: None, max_batch=0)  # type: ignore[arg-type,return-value]


def test_server_batches_concurrent_calls_and_reports_not_serving_on_stop(
    retriever: GatedRetriever,
) -> None:
    server, port = create_server(retriever, port=0, max_batch=16)
    batch = queries(24)
    try:
        with RetrievalClient(f"127.0.0.1:{port}") as client:
            client.wait_until_serving(timeout=10)
            retriever.sizes.clear()
            with ThreadPoolExecutor(12) as pool:
                answers = list(pool.map(lambda q: client.batch_retrieve([q])[0], batch))
            for q, got in zip(batch, answers, strict=True):
                assert got == retriever.retrieve_many([q])[0]
            assert sum(retriever.sizes[: len(retriever.sizes) - len(batch)]) == len(batch)

            retriever.gate.clear()
            retriever.entered.clear()
            held = client._stub.Retrieve.future(
                retrieval_pb2.RetrieveRequest(history=["item01"], k=3), timeout=10
            )
            assert retriever.entered.wait(5)
            stopped = server.stop(grace=5)
            # Load balancers see NOT_SERVING at once; the call in flight still finishes.
            status = server._health.Check(health_pb2.HealthCheckRequest(service=""), None)
            assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.RpcError) as error:
                client.retrieve(["item02"], 3)
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE
            retriever.gate.set()
            assert len(held.result().items) == 3
            assert stopped.wait(10)
    finally:
        retriever.gate.set()
        server.stop(None)
