"""The native engine's metrics (issue 44, stage 3 step 2): the same calls to both engines give the
same ``/metrics`` (counts by method and code, refusals by reason, batch sizes, the model version,
the same series and buckets); a capacity refusal is counted by its reason and the queue depths
show the calls held. Needs ``make native`` (skips without it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import grpc
import pytest

from retrieval.api.client import RetrievalClient
from retrieval.api.types import Query
from retrieval.api.v1 import retrieval_pb2, retrieval_pb2_grpc
from retrieval.serving import native
from retrieval.serving.config import LimitsConfig
from retrieval.serving.metrics import Metrics
from retrieval.serving.native_metrics import NativeMetrics
from retrieval.serving.native_server import create_native_server
from retrieval.serving.retriever import Retriever
from retrieval.serving.server import StartedServer, create_server
from tests.helpers import ITEMS, connected, local, scrape
from tests.serving.helpers import Held, ToyKernel, built, refusal, toy_servable

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

COUNTED = (
    "retrieval_requests_total",
    "retrieval_request_seconds_count",
    "retrieval_refusals_total",
    "retrieval_batch_size_count",
    "retrieval_batch_size_sum",
    "retrieval_model_info",
    "retrieval_reload_refusals_total",
)
"""The samples whose values depend on the calls alone (not on their timing)."""


@pytest.fixture(autouse=True)
def needs_the_engine() -> None:
    built()


@contextmanager
def metered(engine: str, retriever: Retriever, **fields: Any) -> Iterator[tuple[str, int]]:
    """A server of ``engine`` on port 0 (:func:`~tests.helpers.local`'s config with ``fields``)
    with its metrics served on another: (address, metrics port)."""
    metrics = Metrics()
    port = metrics.serve(0)
    server: StartedServer
    if engine == "native":
        server, bound = create_native_server(retriever, local(engine="native", **fields), metrics=metrics)
    else:
        server, bound = create_server(retriever, local(**fields), metrics=metrics)
    try:
        yield f"127.0.0.1:{bound}", port
    finally:
        server.stop(None).wait(30)
        metrics.close()


def calls(client: RetrievalClient) -> None:
    """One of each kind of call, one after another: answered, refused, batched, info."""
    for i in range(5):
        client.retrieve(ITEMS[i : i + 3], k=1 + i)
    with pytest.raises(Exception, match="k must be"):
        client.retrieve(ITEMS[:2], k=0)
    client.batch_retrieve(
        [Query(ITEMS[:2], k=3), Query(ITEMS[5:9], k=4), Query([*ITEMS[9:11], "unknown"], k=2)]
    )
    with pytest.raises(Exception, match=r"requests\[1\]"):
        client.batch_retrieve([Query(ITEMS[:2], k=3), Query(ITEMS[:2], k=0)])
    client.model_info()
    client.model_info()


def exported(port: int) -> Samples:
    """The samples of ``/metrics`` at ``port`` whose values the calls alone decide."""
    return {key: value for key, value in scrape(port).items() if key[0] in COUNTED}


def series(port: int) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every request and batch sample's name and labels (buckets included)."""
    return {key for key in scrape(port) if key[0].startswith(("retrieval_request", "retrieval_batch_size"))}


def test_the_same_calls_give_the_same_metrics_on_both_engines(retriever: Retriever) -> None:
    found = {}
    for engine in ("python", "native"):
        with metered(engine, retriever) as (address, port), connected(address, retries=0) as client:
            calls(client)
            found[engine] = (exported(port), series(port), scrape(port))
    (python, python_series, python_all), (ours, our_series, our_all) = found["python"], found["native"]
    # Batch sizes: the native engine counts its kernel calls, the 5 Retrieves and the good batch
    # of 3; the Python engine also counts the refused batch of 2, observed before its check.
    batches = ("retrieval_batch_size_count", ()), ("retrieval_batch_size_sum", ())
    assert [ours.pop(key) for key in batches] == [6, 5 + 3]
    assert [python.pop(key) for key in batches] == [7, 5 + 3 + 2]
    assert ours == python
    assert python[("retrieval_requests_total", (("code", "OK"), ("method", "Retrieve")))] == 5
    assert python[refusal("INVALID_ARGUMENT", "invalid_argument")] == 1
    assert our_series == python_series  # the same buckets, for the same methods and codes
    for sample in ("retrieval_index_search_seconds_count",):  # timed in both
        assert our_all[(sample, ())] == python_all[(sample, ())] > 0
    depths = {
        dict(labels)["queue"]: value
        for (name, labels), value in our_all.items()
        if name == "retrieval_queue_depth"
    }
    assert depths == {"calls": 0, "batch": 0, "heavy": 0}


SMALL_LIMIT = 4096
"""The request limit of the oversized-request test, in bytes (``--max-request-mb`` 1/256)."""


def oversized(times: float) -> bytes:
    """A ``Retrieve`` of about ``times`` :data:`SMALL_LIMIT` bytes (excluded ids of 8 characters)."""
    excluded = [f"x{i:07d}" for i in range(int(times * SMALL_LIMIT / 10))]
    return retrieval_pb2.RetrieveRequest(history=ITEMS[:3], k=3, exclude_ids=excluded).SerializeToString()


def refused(channel: grpc.Channel, request: bytes) -> tuple[grpc.StatusCode, str]:
    """The code and message ``request`` to ``Retrieve`` is refused with (sent as bytes: past the
    client's own size check)."""
    with pytest.raises(grpc.RpcError) as error:
        channel.unary_unary("/retrieval.v1.RetrievalService/Retrieve", None, None)(request, timeout=10)
    return error.value.code(), str(error.value.details())


def test_a_request_over_the_size_limit_is_refused_and_counted_as_the_python_engine_does(
    retriever: Retriever,
) -> None:
    """A 4 KiB limit; three requests of about twice that: on both engines the same code and
    message, counted ``message_size`` three times (the native engine's own check: gRPC's limit is
    set 4x higher), and the server answers the next call. One past the 4x ceiling is refused by
    gRPC itself on the native engine, uncounted (server.cc's ReceiveCeiling)."""
    limits = LimitsConfig(max_request_mb=SMALL_LIMIT / 2**20)
    request = oversized(2)
    found = {}
    for engine in ("python", "native"):
        with (
            metered(engine, retriever, limits=limits) as (address, port),
            connected(address, retries=0) as client,
            grpc.insecure_channel(address) as channel,
        ):
            answers = [refused(channel, request) for _ in range(3)]
            assert len(client.retrieve(ITEMS[:3], k=3).items) == 3
            found[engine] = (answers, exported(port))
            if engine == "native":
                past = refused(channel, oversized(4.5))
                assert past[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert f"vs. {4 * SMALL_LIMIT})" in past[1], past[1]
                assert exported(port) == found[engine][1]  # not counted
    (python, python_metrics), (ours, our_metrics) = found["python"], found["native"]
    assert ours == python
    code, message = python[0]
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert message.endswith(f"Received message larger than max ({len(request)} vs. {SMALL_LIMIT})"), message
    assert our_metrics == python_metrics
    assert python_metrics[refusal("RESOURCE_EXHAUSTED", "message_size")] == 3
    ok = ("retrieval_requests_total", (("code", "OK"), ("method", "Retrieve")))
    assert python_metrics[ok] == 1


@pytest.mark.parametrize("round_", range(5))
def test_a_capacity_refusal_counts_by_its_reason_and_the_queues_show_the_held_call(round_: int) -> None:
    """``max_queued=1``: with one call held in the kernel the next is refused ``queue_full``; the
    queue depths say one call held, none waiting; once released, one batch of one."""
    kernel = Held()
    server = native.NativeServer(toy_servable(kernel), limits=LimitsConfig(max_queued=1))
    metrics = Metrics()
    moved = NativeMetrics(server, metrics)
    port, address = metrics.serve(0), f"127.0.0.1:{server.start()}"
    try:
        with RetrievalClient(address, retries=0) as client, ThreadPoolExecutor(1) as pool:
            held = pool.submit(client.retrieve, ["item1"], 3)
            assert kernel.entered.wait(10)
            with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as refused:
                stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)  # type: ignore[no-untyped-call]
                stub.Retrieve(retrieval_pb2.RetrieveRequest(history=["item2"], k=3), timeout=10)
            # Answered at once (gRPC's default reactor was once reset after the refusal's Finish,
            # so that the refused call was never answered).
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "it holds 1 calls already (--max-queued)" in str(refused.value.details())
            assert ("grpc-retry-pushback-ms", "10") in refused.value.trailing_metadata()
            during = scrape(port)
            kernel.release.set()
            assert held.result(timeout=10).items
        assert during[refusal("RESOURCE_EXHAUSTED", "queue_full")] == 1
        ok = ("retrieval_requests_total", (("code", "OK"), ("method", "Retrieve")))
        calls = ("retrieval_queue_depth", (("queue", "calls"),))
        assert during[calls] == 1
        assert during[("retrieval_queue_depth", (("queue", "batch"),))] == 0
        assert ok not in during
        # The client has its answer before the server's handler has counted it done: wait for that.
        deadline = time.monotonic() + 10
        while ((after := scrape(port)).get(ok), after.get(calls)) != (1, 0) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (after[ok], after[calls]) == (1, 0)
        assert (after[("retrieval_batch_size_count", ())], after[("retrieval_batch_size_sum", ())]) == (1, 1)
    finally:
        server.stop(0)
        moved.stop()
        metrics.close()


class Slow(ToyKernel):
    """A toy kernel whose searches take at least 5 ms."""

    def search(self, *args: Any) -> Any:
        time.sleep(0.005)
        return super().search(*args)


def test_the_stage_timers_count_each_stage_of_every_call() -> None:
    """10 calls one after another through a kernel taking 5 ms: the kernel stage holds at least
    the 50 ms slept and at most the calls' time; every other stage counted something."""
    server = native.NativeServer(toy_servable(Slow()))
    address = f"127.0.0.1:{server.start()}"
    try:
        with connected(address, retries=0) as client:
            started = time.perf_counter()
            for i in range(10):
                client.retrieve([f"item{i}"], 3)
            elapsed_ns = (time.perf_counter() - started) * 1e9
        counters = server.counters()
    finally:
        server.stop(0)
    assert counters["calls"] == counters["batches"] == 10
    assert 50e6 <= counters["kernel_ns"] <= elapsed_ns
    for stage in ("parse_ns", "checks_ns", "merge_ns", "response_ns"):
        assert 0 < counters[stage] < counters["kernel_ns"], stage
