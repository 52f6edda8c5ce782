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
from tests.helpers import ITEMS, GatedRetriever, assert_same, brute_force, local, make_model


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
    retriever.hold()
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


def test_a_bad_query_fails_alone_and_the_others_are_answered_together(retriever: GatedRetriever) -> None:
    batch = queries(7)
    batch[3] = Query(["item01"], k=0)  # k out of range
    batch[5] = Query(["item01"], k=3, category="no such category")
    batcher = MicroBatcher(lambda: retriever)
    try:
        answers = submit_held(batcher, retriever, batch)
    finally:
        batcher.close()
    calls = list(retriever.sizes)
    assert isinstance(answers[3], InvalidArgument) and str(answers[3]).startswith("k must be")
    assert isinstance(answers[5], InvalidArgument) and str(answers[5]).startswith("unknown category")
    for i, answer in enumerate(answers):
        if i not in (3, 5):
            assert answer == retriever.retrieve_many([batch[i]])[0]
    # The held query, then the batch of six, refused (before any tower call) and answered by one
    # more call (retrieve_each, not recorded), never each query alone.
    assert calls == [1, 6]


def test_a_batch_holds_as_many_queries_as_fit_its_cost(retriever: GatedRetriever) -> None:
    """``max_cost`` 8, counted as queries times the costliest: after the held query, four of
    cost 1 (4 units; a fifth of cost 4 would make 20), the one of cost 4 with one of cost 1
    (8), then the last three (3)."""
    costs = [1.0] * 5 + [4.0] + [1.0] * 4
    batch = queries(len(costs))
    batcher = MicroBatcher(lambda: retriever, max_cost=8.0)
    retriever.hold()
    try:
        with ThreadPoolExecutor(len(batch)) as pool:
            first = pool.submit(batcher.submit, batch[0], None, costs[0])
            assert retriever.entered.wait(5)
            rest = []
            for query, cost in zip(batch[1:], costs[1:], strict=True):  # queued in this order
                rest.append(pool.submit(batcher.submit, query, None, cost))
                while batcher.queued < len(rest):
                    time.sleep(0.002)
            retriever.gate.set()
            answers = [f.result() for f in [first, *rest]]
    finally:
        batcher.close()
    assert retriever.sizes == [1, 4, 2, 3]
    assert answers == [retriever.retrieve_many([q])[0] for q in batch]


def test_a_query_whose_deadline_passes_in_the_queue_is_not_computed(retriever: GatedRetriever) -> None:
    batcher = MicroBatcher(lambda: retriever)
    retriever.hold()
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
    retriever.hold()
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
    server, port = create_server(retriever, local("batching.max_batch=16"))
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

            retriever.hold()
            held = client._stub.Retrieve.future(
                retrieval_pb2.RetrieveRequest(history=["item01"], k=3), timeout=10
            )
            assert retriever.entered.wait(5)
            stopped = server.stop(grace=5)
            # Load balancers see NOT_SERVING at once; the call in flight still finishes.
            status = server._health.Check(health_pb2.HealthCheckRequest(service=""), None)
            assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.RpcError) as error:  # the stub: RetrievalClient would retry
                client._stub.Retrieve(retrieval_pb2.RetrieveRequest(history=["item02"], k=3), timeout=10)
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE
            retriever.gate.set()
            assert len(held.result().items) == 3
            assert stopped.wait(10)
    finally:
        retriever.gate.set()
        server.stop(None)


def test_invalid_calls_are_refused_alone_and_never_rerun_a_micro_batch(retriever: GatedRetriever) -> None:
    """Issue 43, item 9: one invalid call made its micro-batch re-run query by query. Rounds of
    six valid and four invalid calls at once while a batch is held: the three whose arguments
    are wrong are refused before the held batch ends (on their own threads); the one whose
    history has no known id (found by the batch's lookup) joins the valid ones' batch, which
    refuses it alone and answers the others."""
    server, port = create_server(retriever, local("batching.max_batch=32"))
    valid = [retrieval_pb2.RetrieveRequest(history=[ITEMS[i], ITEMS[i + 1]], k=3) for i in range(6)]
    unknown = retrieval_pb2.RetrieveRequest(history=["never-seen"], k=3)
    invalid = [
        retrieval_pb2.RetrieveRequest(history=["item01"], k=3, category="no such category"),
        retrieval_pb2.RetrieveRequest(history=["item01"], k=0),
        retrieval_pb2.RetrieveRequest(history=["item01"], k=3, rerank=retrieval_pb2.Rerank(ranker="none")),
    ]
    expected = [retriever.retrieve_many([Query(list(r.history), 3)])[0] for r in valid]
    try:
        with RetrievalClient(f"127.0.0.1:{port}", retries=0) as client:
            client.wait_until_serving(timeout=10)
            for _ in range(10):
                retriever.sizes.clear()
                retriever.hold()
                held = client._stub.Retrieve.future(valid[0], timeout=30)
                assert retriever.entered.wait(10)
                calls = [client._stub.Retrieve.future(r, timeout=30) for r in [*valid, unknown, *invalid]]
                for call in calls[len(valid) + 1 :]:  # refused while the batch is still held
                    error = call.exception(timeout=10)
                    assert isinstance(error, grpc.RpcError)
                    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
                while server._batcher is not None and server._batcher.queued < len(valid) + 1:
                    time.sleep(0.002)
                retriever.gate.set()
                answers = [held.result(), *(call.result() for call in calls[: len(valid)])]
                refused = calls[len(valid)].exception(timeout=10)
                assert isinstance(refused, grpc.RpcError)
                assert (refused.details() or "").startswith("none of the 1 history ids")
                assert retriever.sizes == [1, len(valid) + 1]  # the held call, then one batch
                for got, want in zip(answers, [expected[0], *expected], strict=True):
                    assert [i.item_id for i in got.items] == [item for item, _, _ in want.items]
    finally:
        retriever.gate.set()
        server.stop(None)
