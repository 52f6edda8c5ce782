"""Cost-based admission and bounded cost per request: heavy calls wait or are refused with a retry
hint while cheap ones keep flowing, deadlines stop work between stages, refused requests cost
no kept memory, client strings stay out of long messages, and a busy metrics port fails the start."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import numpy as np
import pytest

from bench.serving import free_port
from retrieval.api import (
    DEFAULT_MAX_REQUEST_BYTES,
    MAX_NAME,
    InvalidArgument,
    Query,
    Rerank,
    Retrieved,
    check_sizes,
    query_from_request,
)
from retrieval.api.convert import largest_request_bytes, request_from_query
from retrieval.api.errors import DeadlineExceeded, ResourceExhausted
from retrieval.api.types import MergeStrategy
from retrieval.api.v1 import retrieval_pb2
from retrieval.api.v1.retrieval_pb2_grpc import RetrievalServiceStub
from retrieval.artifacts.index import build_index_from_model
from retrieval.serving import Admission, LimitsConfig, Metrics, ModelSize, Retriever, call_cost, query_cost
from retrieval.serving.run import serve_forever
from retrieval.serving.server import create_server
from tests.helpers import (
    ITEMS,
    NUM_ITEMS,
    REPO_ROOT,
    GatedRetriever,
    K,
    connected,
    local,
    make_model,
    scrape,
    serving,
)

SIZE = ModelSize(K, NUM_ITEMS)
"""The size of the tests' model (:func:`make_model`)."""
CHEAP = Query(["item01", "item02"], 5)
HEAVY = Query(["item01"] * 5000, 5)  # cost 6.1: heavy under the limits below


def limits(**changes: float) -> LimitsConfig:
    values: dict[str, float] = {"cheap_cost": 4.0, "max_cost": 10.0, "max_waiting": 1}
    return LimitsConfig(**{**values, **changes})  # type: ignore[arg-type]


# --- the admission on its own ----------------------------------------------------------------------


WIDE = ModelSize(num_interests=4, num_items=100_000)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # 1 + 20 ids / 1000 + 4 interests × (depth 10 + 20 excluded) / 1000
        (Query(["a"] * 20, 10), 1 + 0.02 + 0.12),
        # DIVERSITY, k 1000, 2000 per interest: 4 × 2020 = 8080 candidates, and 1000 greedy
        # picks over them at (1 + 8080 / 10,000) / 16 each
        (
            Query(["a"] * 20, 1000, merge=MergeStrategy.DIVERSITY, per_interest_k=2000),
            1 + 0.02 + 8.08 + 1000 * 1.808 / 16,
        ),
        # ROUND_ROBIN: k / 200 more than max-score
        (Query(["a"] * 20, 1000, merge=MergeStrategy.ROUND_ROBIN), 1 + 0.02 + 4 * 1020 / 1000 + 5),
        # a rerank of the default 200 candidates (+ 200 / 40), the unclicked ids looked up
        (
            Query(["a"] * 20, 10, rerank=Rerank("", 0, ["d"] * 980)),
            1 + 1.0 + 4 * 220 / 1000 + 5,
        ),
        # explain: + 3; exclude and allow ids looked up, the excluded ones over-fetched
        (
            Query(["a"] * 20, 10, exclude=["b"] * 480, allow=["c"] * 500, explain=True),
            1 + 1.0 + 4 * 510 / 1000 + 3,
        ),
    ],
)
def test_the_cost_formula_by_hand(query: Query, expected: float) -> None:
    assert query_cost(query, WIDE) == pytest.approx(expected)
    assert call_cost([request_from_query(query)], WIDE) == pytest.approx(expected)


def test_no_search_goes_deeper_than_the_catalogue() -> None:
    long = Query(["a"] * 10_000, 10, exclude=["b"] * 4000)  # 14,000 ids, over-fetched by 14,000
    assert query_cost(long, ModelSize(4, 1000)) == pytest.approx(1 + 14 + 4 * 1000 / 1000)
    assert call_cost([CHEAP, HEAVY], SIZE) == pytest.approx(query_cost(CHEAP, SIZE) + query_cost(HEAVY, SIZE))


def test_the_issues_costly_calls_are_heavy_and_an_ordinary_one_costs_about_one() -> None:
    """Issue 43, item 8, on the demo's shape (K = 4, 1,682 items): DIVERSITY k = 1,000 with
    2,000 per interest cost 3.1 and 10,000-id histories with 4,000 exclusions 15.2, both
    cheap (<= 16) and batched with ordinary calls; they measured 30 and 9 ms of CPU alone."""
    demo, cheap = ModelSize(4, 1682), LimitsConfig().cheap_cost
    ordinary = Query(["a"] * 50, 10)
    diverse = Query(["a"] * 20, 1000, merge=MergeStrategy.DIVERSITY, per_interest_k=2000)
    excluding = Query(["a"] * 10_000, 10, exclude=["b"] * 4000)
    assert 1 <= query_cost(ordinary, demo) < 1.5
    assert query_cost(diverse, demo) > 4 * cheap and query_cost(excluding, demo) > cheap


def test_a_lone_heavy_call_runs_whatever_its_cost_and_cheap_calls_never_wait() -> None:
    """100 > max_cost, but alone it is admitted at once; two cheap calls run beside it."""
    admission = Admission(limits(heavy_wait=30.0))
    inside: list[tuple[int, float, int]] = []

    def calls() -> None:
        with admission.admit(100.0), admission.admit(1.0), admission.admit(1.0):
            inside.append((admission._heavy, admission._heavy_cost, admission._cheap))

    started = time.monotonic()
    thread = threading.Thread(target=calls)
    thread.start()
    thread.join(10.0)
    assert not thread.is_alive(), "a lone heavy call (or a cheap one beside it) waited"
    assert time.monotonic() - started < 10.0
    assert inside == [(1, 100.0, 2)]  # all three in at once: one heavy of 100 units, two cheap
    assert (admission._heavy, admission._heavy_cost, admission._cheap) == (0, 0.0, 0)  # all left


def test_heavy_calls_wait_for_room_then_are_refused_with_a_retry_hint() -> None:
    admission = Admission(limits(heavy_wait=5.0))
    released = threading.Event()
    order: list[str] = []

    def second() -> None:
        with admission.admit(6.0):
            order.append("second ran")

    with admission.admit(6.0):
        waiter = threading.Thread(target=second)
        waiter.start()
        deadline = time.monotonic() + 5
        while admission._waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert admission._waiting == 1 and order == []  # 6 + 6 > 10: it waits
        with pytest.raises(ResourceExhausted, match="no room to wait") as refused, admission.admit(6.0):
            pass  # max_waiting = 1 is taken: refused at once
        assert refused.value.retry_after is not None and refused.value.retry_after > 0
        released.set()
    waiter.join(5)
    assert order == ["second ran"]


def test_a_heavy_call_waits_at_most_its_deadline() -> None:
    admission = Admission(limits(heavy_wait=5.0))
    with admission.admit(6.0):
        started = time.monotonic()
        with pytest.raises(ResourceExhausted, match="waited"), admission.admit(6.0, timeout=0.05):
            pass
        assert time.monotonic() - started < 4  # the deadline (0.05 s), not heavy_wait (5 s)


def test_over_the_memory_ceiling_heavy_calls_are_refused_and_cheap_ones_pass() -> None:
    admission = Admission(limits(max_memory_mb=1000 / 2**20), memory=lambda: 2000)
    with admission.admit(1.0):
        pass
    with pytest.raises(ResourceExhausted, match="over its"), admission.admit(6.0):
        pass


def test_chunks_cover_the_queries_in_order_within_the_chunk_cost() -> None:
    admission = Admission(limits(chunk_cost=5.0))
    queries = [Query(["x"] * n, 5) for n in (10, 3000, 10, 10, 9000, 10)]
    chunks = admission.chunks(queries, [query_cost(q, SIZE) for q in queries])
    assert [q for chunk in chunks for q in chunk] == queries
    assert all(len(c) == 1 or call_cost(c, SIZE) <= 5.0 for c in chunks)
    assert [len(c) for c in chunks] == [1, 1, 2, 1, 1]  # costs 1.0, 4.1, 1.0 + 1.0, 10.1, 1.0


def test_bad_limits_are_refused() -> None:
    for bad in ({"max_cost": 0}, {"max_waiting": -1}, {"max_memory_mb": -1}):
        with pytest.raises(ValueError):
            limits(**bad)


# --- on a server ------------------------------------------------------------------------------------


class HeldRetriever(Retriever):
    """Holds every call with more than one query or a long history until ``gate`` opens."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.gate, self.held = threading.Event(), threading.Semaphore(0)
        self.sizes: list[int] = []

    def retrieve_many(self, queries: Sequence[Query], deadline: float | None = None) -> list[Retrieved]:
        self.sizes.append(len(queries))
        if len(queries) > 1 or len(queries[0].history) > 100:
            self.held.release()
            assert self.gate.wait(20)
        return super().retrieve_many(queries, deadline)


@pytest.fixture
def held() -> HeldRetriever:
    model = make_model()
    return HeldRetriever(model, build_index_from_model(model, "Flat"))


def test_heavy_calls_cannot_lock_out_cheap_ones(held: HeldRetriever) -> None:
    heavy = retrieval_pb2.RetrieveRequest(history=["item01"] * 5000, k=3)
    with (
        serving(held, local(limits=limits(max_waiting=0))) as address,
        connected(address, retries=0) as client,
    ):
        first = client._stub.Retrieve.future(heavy, timeout=30)
        assert held.held.acquire(timeout=10)  # the first heavy call computes (held)
        refused = [client._stub.Retrieve.future(heavy, timeout=30) for _ in range(4)]
        for call in refused:  # no room to wait: refused at once, with the retry hint
            with pytest.raises(grpc.RpcError) as error:
                call.result()
            assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "retry in about" in (error.value.details() or "")
            trailers = dict(error.value.trailing_metadata() or ())
            assert int(trailers["grpc-retry-pushback-ms"]) >= 10
        for i in range(20):  # cheap calls are answered meanwhile
            assert len(client.retrieve([ITEMS[i], ITEMS[i + 1]], 3).items) == 3
        held.gate.set()
        assert len(first.result().items) == 3


def test_a_heavy_batch_is_answered_in_chunks_like_one_call(held: HeldRetriever) -> None:
    held.gate.set()
    queries = [Query([ITEMS[i % 40], ITEMS[(i * 7) % 40]] * 300, 5) for i in range(40)]  # cost ~1.7 each
    each = query_cost(queries[0], SIZE)
    with serving(held, local(limits=limits(chunk_cost=3.5 * each))) as address, connected(address) as client:
        got = client.batch_retrieve(queries)
    chunks = list(held.sizes)
    assert sum(chunks) == 40 and len(chunks) == 40 // 3 + 1  # three queries a chunk
    assert got == held.retrieve_many(queries)


def test_a_bad_request_in_a_chunked_batch_is_named_by_its_place_in_the_whole_batch(
    held: HeldRetriever,
) -> None:
    held.gate.set()
    queries = [Query(["item01"] * 600, 5)] * 10 + [Query(["unknown"] * 600, 5)]
    with (
        serving(held, local(limits=limits(chunk_cost=5.0))) as address,
        connected(address) as client,
        pytest.raises(grpc.RpcError) as error,
    ):
        client.batch_retrieve(queries)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (error.value.details() or "").startswith("requests[10]: none of the 600 history ids")


def slow_retriever(seconds: float = 0.3) -> tuple[Retriever, list[int]]:
    """A retriever whose user tower takes ``seconds`` a call, and the list its calls go in."""
    model = make_model()
    calls: list[int] = []

    def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:
        calls.append(len(inputs["items"]))
        time.sleep(seconds)
        return model.user_vectors(inputs)

    slow = dataclasses.replace(model, user_vectors=user_vectors)
    return Retriever(slow, build_index_from_model(slow, "Flat")), calls


@pytest.mark.slow  # waits for the server to stop: ~4 s (the fast tier checks the retriever's own check)
def test_a_call_past_its_deadline_stops_between_stages_and_counts_as_deadline_exceeded() -> None:
    slow, tower_calls = slow_retriever()
    metrics = Metrics()
    port = metrics.serve(0)
    queries = [Query(["item01"] * 600, 5)] * 40  # cost 1.72 each: 40 chunks of one at chunk_cost 1.7
    try:
        with serving(slow, local(limits=limits(chunk_cost=1.7)), metrics=metrics) as address:
            with connected(address, timeout=1.0, retries=0) as client:
                with pytest.raises(grpc.RpcError) as error:
                    client.batch_retrieve(queries)
                assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                time.sleep(1.0)  # the server notices at its next stage
                calls = len(tower_calls)
                time.sleep(1.0)
                assert len(tower_calls) == calls < 40 // 2  # it stopped, long before the 40 chunks
            values = scrape(port)
    finally:
        metrics.close()
    exceeded = values[
        ("retrieval_requests_total", (("code", "DEADLINE_EXCEEDED"), ("method", "BatchRetrieve")))
    ]
    assert exceeded == 1
    assert ("retrieval_requests_total", (("code", "OK"), ("method", "BatchRetrieve"))) not in values


def test_the_retriever_checks_the_deadline_after_the_tower_call() -> None:
    slow, _ = slow_retriever()
    with pytest.raises(DeadlineExceeded, match="after the user tower call"):
        slow.retrieve_many([CHEAP], deadline=time.monotonic() + 0.1)


# --- sizes and strings -----------------------------------------------------------------------------


def test_lists_over_the_limits_are_refused_by_their_length_alone() -> None:
    for field in ("exclude_ids", "allow_ids", "history"):
        request = retrieval_pb2.RetrieveRequest(k=3, **{field: ["x"] * 10_001})
        with pytest.raises(InvalidArgument, match=f"{field} has 10001 ids"):
            check_sizes(request)
    request = retrieval_pb2.RetrieveRequest(k=3, category="c" * (MAX_NAME + 1))
    with pytest.raises(InvalidArgument, match="category has 257 characters") as error:
        check_sizes(request)
    assert "ccc" not in str(error.value)


def test_the_request_limit_holds_the_largest_valid_request_and_little_more() -> None:
    longest = "i" * 64
    query = Query(
        [longest] * 10_000, 1000, timestamps=[-1] * 10_000, actions=[longest] * 10_000,
        per_interest_k=2000, exclude=[longest] * 10_000, allow=[longest] * 10_000,
        user_id="u" * 256, category="c" * 256, rerank=Rerank("r" * 256, 1000, [longest] * 10_000),
    )  # fmt: skip
    size = request_from_query(query).ByteSize()
    assert size <= largest_request_bytes() <= DEFAULT_MAX_REQUEST_BYTES
    assert 2 * size > DEFAULT_MAX_REQUEST_BYTES  # headroom, not the old 32 MiB


def test_a_long_category_is_refused_once_as_invalid_with_a_short_message(retriever: Retriever) -> None:
    metrics = Metrics()
    port = metrics.serve(0)
    try:
        with serving(retriever, metrics=metrics) as address, connected(address, retries=4) as client:
            for category in ("c" * 8192, "d" * 200):  # over the limit; within it but unknown
                with pytest.raises(grpc.RpcError) as error:
                    client.retrieve(["item01"], 3, category=category)
                assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert len(error.value.details() or "") < 200
            with pytest.raises(ValueError, match="over the"):  # too big to send: never sent
                client.retrieve(["item01"], 3, exclude=["x" * 64] * 100_000)
            values = scrape(port)
    finally:
        metrics.close()
    invalid = values[("retrieval_requests_total", (("code", "INVALID_ARGUMENT"), ("method", "Retrieve")))]
    assert invalid == 2  # each sent once: an invalid request is not retried, the oversized one not sent


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_a_busy_metrics_port_fails_the_start_before_grpc_serves(retriever: Retriever, busy_port: int) -> None:
    grpc_port = free_port()
    with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{busy_port}"):
        serve_forever(retriever, local(f"metrics.port={busy_port}", port=grpc_port))
    with socket.socket() as probe:  # nothing was left listening on the gRPC port
        assert probe.connect_ex(("127.0.0.1", grpc_port)) != 0


def test_create_server_bounds_the_queue(retriever: Retriever) -> None:
    with pytest.raises(ValueError, match="max_queued"):
        local("limits.max_queued=-1")


# --- memory after a burst of refused requests (a server in its own process) ------------------------

SERVER = """
from retrieval.artifacts.index import build_index_from_model
from retrieval.serving import Retriever, create_server
from tests.helpers import local, make_model
model = make_model()
server, port = create_server(Retriever(model, build_index_from_model(model, "Flat")), local())
print(port, flush=True)
server.wait_for_termination()
"""


def resident_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def excluding(n: int) -> retrieval_pb2.RetrieveRequest:
    """A request excluding ``n`` ids of 8 characters."""
    return retrieval_pb2.RetrieveRequest(history=["item01"], k=5, exclude_ids=[f"x{i:07d}" for i in range(n)])


@pytest.mark.slow  # a server process and 16 requests of 5-30 MiB: ~10 s
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads resident memory from /proc (Linux)")
def test_a_burst_of_oversized_requests_is_refused_and_leaves_no_memory_behind() -> None:
    child = subprocess.Popen([sys.executable, "-c", SERVER], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        options = [("grpc.max_send_message_length", 64 << 20)]
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            stub = RetrievalServiceStub(channel)  # type: ignore[no-untyped-call]
            # Idle means after 16 concurrent calls: their request threads (stacks, arenas) are the
            # server's from then on, whatever the calls carried.
            small = retrieval_pb2.RetrieveRequest(history=["item01"], k=5)
            warm = [
                threading.Thread(target=stub.Retrieve, args=(small,), kwargs={"timeout": 10})
                for _ in range(16)
            ]
            for thread in warm:
                thread.start()
            for thread in warm:
                thread.join()
            time.sleep(0.5)
            idle = resident_mib(child.pid)
            huge, many = (excluding(n) for n in (3_300_000, 450_000))  # over the size limit; within it
            assert huge.ByteSize() > 30 << 20 and DEFAULT_MAX_REQUEST_BYTES > many.ByteSize() > 4 << 20
            codes: list[grpc.StatusCode] = []

            def send(request: retrieval_pb2.RetrieveRequest) -> None:
                try:
                    stub.Retrieve(request, timeout=60)
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as e:
                    codes.append(e.code())

            threads = [threading.Thread(target=send, args=(r,)) for r in [huge] * 8 + [many] * 8]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
            time.sleep(1.0)
            after = resident_mib(child.pid)
    finally:
        child.kill()
        child.wait()
    assert sorted(c.name for c in codes) == ["INVALID_ARGUMENT"] * 8 + ["RESOURCE_EXHAUSTED"] * 8
    assert after <= 1.10 * idle, f"resident memory {idle:.0f} MiB idle, {after:.0f} MiB after the burst"


def test_a_large_request_is_refused_unread_while_heavy_calls_leave_no_room() -> None:
    admission = Admission(limits(max_waiting=0, cheap_bytes=1000))
    admission.screen(10_000)  # nothing heavy runs: it may be read
    with admission.admit(6.0):
        admission.screen(1000)  # small: read, its cost decides
        with pytest.raises(ResourceExhausted, match="was not read"):
            admission.screen(10_000)


@pytest.mark.slow  # starts tools/serve.py on a trained model: ~5 s
def test_serve_with_a_busy_metrics_port_exits_2_with_one_line(
    model_versions: list[tuple[Path, Path, str]], busy_port: int
) -> None:
    model_dir, index_dir, _ = model_versions[0]
    grpc_port = free_port()
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "serve.py"), "--model", str(model_dir),
         "--index", str(index_dir), "--port", str(grpc_port), "--metrics-port", str(busy_port)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: cannot serve metrics on 127.0.0.1:{busy_port}")
    )
    with socket.socket() as probe:  # it never served gRPC
        assert probe.connect_ex(("127.0.0.1", grpc_port)) != 0


class MergeRecorder(GatedRetriever):
    """Records the merges of each retriever call's queries."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.merges: list[set[MergeStrategy]] = []

    def retrieve_many(self, queries: Sequence[Query], deadline: float | None = None) -> list[Retrieved]:
        self.merges.append({q.merge for q in queries})
        return super().retrieve_many(queries, deadline)


def test_heavy_merges_never_share_a_micro_batch_with_ordinary_calls() -> None:
    """Issue 43, item 8: DIVERSITY with k = 1,000 and 2,000 per interest cost 3.1, "cheap",
    and computed in the micro-batches of ordinary calls. Rounds of six ordinary calls and two
    such calls at once, while a batch is held: no retriever call mixes them, and every answer
    is the one it gets alone."""
    model = make_model()
    recorder = MergeRecorder(model, build_index_from_model(model, "Flat"))
    diverse = retrieval_pb2.RetrieveRequest(
        history=["item01", "item02"],
        k=1000,
        per_interest_k=2000,
        merge=retrieval_pb2.DIVERSITY,
        diversity_lambda=0.5,
    )
    ordinary = [retrieval_pb2.RetrieveRequest(history=[ITEMS[i], ITEMS[i + 2]], k=3) for i in range(6)]
    alone = [recorder.retrieve_many([query_from_request(r)])[0] for r in [*ordinary, diverse]]
    server, port = create_server(recorder, local())
    try:
        with connected(f"127.0.0.1:{port}", retries=0) as client:
            for _ in range(10):
                recorder.merges.clear()
                recorder.hold()
                held = client._stub.Retrieve.future(ordinary[0], timeout=30)
                assert recorder.entered.wait(10)
                calls = [client._stub.Retrieve.future(r, timeout=30) for r in [*ordinary, diverse, diverse]]
                while server._batcher is not None and server._batcher.queued < len(ordinary):
                    time.sleep(0.002)
                time.sleep(0.05)  # the heavy calls reach the server too
                recorder.gate.set()
                answers = [call.result() for call in calls]
                held.result()
                assert all(len(merges) == 1 for merges in recorder.merges), recorder.merges
                for got, want in zip(answers, [*alone, alone[-1]], strict=True):
                    assert [i.item_id for i in got.items] == [item for item, _, _ in want.items]
    finally:
        recorder.gate.set()
        server.stop(None)
