"""The native engine's data plane (issue 44, ``native/``) with a toy kernel: the servable handover,
the per-batch kernel call, the C++ merges against index.merge's, errors, micro-batching, health,
reflection, the stop path and the hot swap. Every test but the first three needs ``make native``
and skips without it (tests/serving/test_native_parity.py compares it with the Python engine)."""

from __future__ import annotations

import contextlib
import gc
import inspect
import re
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import grpc
import numpy as np
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from index.merge import max_score
from retrieval.api import RetrievalClient
from retrieval.api.convert import result_from_response
from retrieval.api.types import MAX_K, Query
from retrieval.api.v1 import retrieval_pb2, retrieval_pb2_grpc
from retrieval.serving import native
from retrieval.serving.batching import MicroBatcher
from retrieval.serving.config import BatchingConfig, LimitsConfig
from retrieval.serving.memory import LARGE_REQUEST
from tests.helpers import REPO_ROOT, connected
from tests.serving.helpers import (
    DIM,
    MAX_LEN,
    NUM_ITEMS,
    VOCAB,
    Held,
    Search,
    ToyKernel,
    brute_force,
    built,
    code_of,
    toy_servable,
)


def reference(
    history: Sequence[str], k: int, exclude: Sequence[str] = (), per_interest_k: int = 0
) -> list[tuple[str, float, int]]:
    """The answer computed without the engine: the known history left-padded to MAX_LEN, the
    kernel on that one row with this query's fetch, excluded ids dropped, index.merge.max_score."""
    known = [VOCAB.index(h) + 1 for h in history if h in VOCAB]
    excluded = set(known) | {VOCAB.index(e) + 1 for e in exclude if e in VOCAB}
    row = np.zeros((1, MAX_LEN), np.int32)
    tail = known[-MAX_LEN:]
    row[0, MAX_LEN - len(tail) :] = tail
    fetch = min(max(k, per_interest_k) + len(excluded), NUM_ITEMS)
    ids, scores = brute_force(row, np.array([fetch], np.int32))
    ids = np.where(np.isin(ids, list(excluded)), -1, ids)
    merged = max_score(ids[0], scores[0], k)
    return [
        (VOCAB[i - 1], float(s), int(n))
        for i, s, n in zip(merged.ids, merged.scores, merged.interests, strict=True)
    ]


def assert_answers(got: list[tuple[str, float, int]], expected: list[tuple[str, float, int]]) -> None:
    """Ids and interests exactly, scores to float32 rounding."""
    assert [(i, n) for i, _, n in got] == [(i, n) for i, _, n in expected]
    np.testing.assert_allclose([s for _, s, _ in got], [s for _, s, _ in expected], rtol=2e-7, atol=0)


@pytest.fixture
def serve() -> Iterator[Callable[..., native.NativeServer]]:
    """Starts native servers on port 0 (``serve(search or kernel, batching=..., limits=...)``);
    stops them at the end."""
    built()
    servers: list[native.NativeServer] = []

    def start(kernel: Search | ToyKernel = brute_force, **options: Any) -> native.NativeServer:
        toy = kernel if isinstance(kernel, ToyKernel) else ToyKernel(kernel)
        server = native.NativeServer(toy_servable(toy), **options)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop(0)


def address(server: native.NativeServer) -> str:
    return f"127.0.0.1:{server.port}"


# --- without the build ---------------------------------------------------------------------------------


def test_without_the_build_the_error_says_what_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "retrieval.serving._native", None)  # its import fails
    with pytest.raises(native.NativeEngineMissing) as raised:
        native.NativeServer(toy_servable())
    message = str(raised.value)
    assert "\n" not in message and "`make native`" in message
    assert all(package in message for package in native.PACKAGES)


def test_the_batch_queue_bound_is_the_python_engines() -> None:
    default = inspect.signature(MicroBatcher).parameters["max_queue"].default
    assert default == native.MAX_QUEUE


def test_make_native_installs_the_packages_the_message_names() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    listed = re.search(r"^NATIVE_PACKAGES := (.*)$", makefile, re.MULTILINE)
    assert listed is not None and tuple(listed.group(1).split()) == native.PACKAGES


# --- answers ---------------------------------------------------------------------------------------------


def queries(count: int, seed: int) -> list[dict[str, Any]]:
    """Random requests: histories of 1..12 ids (some unknown), k, per_interest_k, exclude lists."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        history = [VOCAB[i] for i in rng.integers(0, NUM_ITEMS, int(rng.integers(1, 13)))]
        if rng.random() < 0.3:
            history.insert(int(rng.integers(0, len(history) + 1)), "unknown-id")
        k = int(rng.integers(1, 11))
        out.append(
            {
                "history": history,
                "k": k,
                "per_interest_k": int(rng.choice([0, k, k + 5])),
                "exclude": [VOCAB[i] for i in rng.integers(0, NUM_ITEMS, int(rng.integers(0, 4)))] + ["nope"],
            }
        )
    return out


def test_answers_equal_the_numpy_reference(serve: Callable[..., native.NativeServer]) -> None:
    server = serve()
    asked = queries(40, seed=1)
    with connected(address(server), retries=0) as client:
        for query in asked:
            got = client.retrieve(**query)
            assert_answers(got.items, reference(**query))
            assert got.model_version == "v-native"
            assert got.unknown_items == query["history"].count("unknown-id")
        answers = client.batch_retrieve([Query(**query) for query in asked])
    assert len(answers) == len(asked)
    for answer, query in zip(answers, asked, strict=True):
        assert_answers(answer.items, reference(**query))


def test_the_kernel_gets_padded_histories_and_each_querys_fetch(
    serve: Callable[..., native.NativeServer],
) -> None:
    seen: list[tuple[np.ndarray, np.ndarray]] = []

    def recording(histories: np.ndarray, fetch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        seen.append((histories.copy(), fetch.copy()))
        return brute_force(histories, fetch)

    server = serve(recording)
    history = ["item3", "gone", *[f"item{i}" for i in range(10, 20)]]  # 11 known ids, MAX_LEN 8
    with connected(address(server), retries=0) as client:
        client.retrieve(history, 5, exclude=["item40", "item3", "gone"])
        client.retrieve(["item7"], 2, per_interest_k=9)
    (first, fetch_first), (second, fetch_second) = seen
    assert first.dtype == np.int32 and first.tolist() == [list(range(13, 21))]  # the last 8, dense ids
    assert fetch_first.tolist() == [5 + 12]  # k + the 11 history ids and item40 (item3 is one of them)
    assert second.tolist() == [[0] * 7 + [8]] and fetch_second.tolist() == [9 + 1]


def test_the_merge_keeps_each_items_best_score_and_breaks_ties_by_id(
    serve: Callable[..., native.NativeServer],
) -> None:
    # Worked out by hand: 5 (0.9, interest 0); 3 at its best, 0.8 (interest 1, its 0.5 under
    # interest 0 dropped); 7 and 9 tie at 0.5: the smaller id first; 2 is the history.
    ids = np.array([[[5, 3, 7, 2]], [[3, 9, -1, 2]]], np.int64).reshape(1, 2, 4)
    scores = np.array([[0.9, 0.5, 0.5, 2.0], [0.8, 0.5, 0.1, 3.0]], np.float32).reshape(1, 2, 4)
    server = serve(lambda histories, fetch: (ids, scores))
    with connected(address(server), retries=0) as client:
        got = client.retrieve(["item1"], 10).items
    expected = [("item4", 0.9, 0), ("item2", 0.8, 1), ("item6", 0.5, 0), ("item8", 0.5, 1)]
    assert_answers(got, expected)
    merged = max_score(np.where(ids[0] == 2, -1, ids[0]), scores[0], 10)  # the Python engine's merge
    assert [VOCAB[i - 1] for i in merged.ids] == [i for i, _, _ in expected]


def test_the_merge_equals_the_python_merge_on_ties_repeats_and_empty_slots(
    serve: Callable[..., native.NativeServer],
) -> None:
    """Kernel answers drawn at random from few ids and few score values (so most candidates tie
    or repeat across interests, some slots are empty): the answers equal index.merge.max_score's
    over the same arrays with the history and exclude ids dropped."""
    rng = np.random.default_rng(7)
    answers: list[tuple[np.ndarray, np.ndarray]] = []

    def drawn(histories: np.ndarray, fetch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = rng.integers(-1, 12, (len(histories), 4, 9)).astype(np.int64)
        ids[ids == 0] = -1
        scores = rng.integers(0, 4, ids.shape).astype(np.float32) / 4
        answers.append((ids, scores))
        return ids, scores

    server = serve(drawn)
    with connected(address(server), retries=0) as client:
        for _ in range(100):
            history = [VOCAB[i] for i in rng.integers(0, 12, 2)]
            exclude = [VOCAB[int(rng.integers(0, 12))]]
            k = int(rng.integers(1, 13))
            got = client.retrieve(history, k, exclude=exclude).items
            ids, scores = answers[-1]
            dropped = [VOCAB.index(i) + 1 for i in [*history, *exclude]]
            merged = max_score(np.where(np.isin(ids[0], dropped), -1, ids[0]), scores[0], k)
            expected = [
                (VOCAB[i - 1], float(v), int(n))
                for i, v, n in zip(merged.ids, merged.scores, merged.interests, strict=True)
            ]
            assert_answers(got, expected)


def test_the_kernel_runs_on_one_thread_that_keeps_its_thread_locals(
    serve: Callable[..., native.NativeServer],
) -> None:
    local = threading.local()
    seen: list[tuple[int, int]] = []

    def counting(histories: np.ndarray, fetch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        local.batches = getattr(local, "batches", 0) + 1
        seen.append((threading.get_ident(), local.batches))
        return brute_force(histories, fetch)

    server = serve(counting)
    with connected(address(server), retries=0) as client:
        for i in range(5):
            client.retrieve([f"item{i}"], 2)
    assert len({ident for ident, _ in seen}) == 1 and threading.get_ident() not in {i for i, _ in seen}
    assert [batches for _, batches in seen] == [1, 2, 3, 4, 5]


# --- errors ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        ({"history": ["item1"], "k": 0}, "INVALID_ARGUMENT", f"k must be between 1 and {MAX_K}, got 0"),
        ({"history": [], "k": 3}, "INVALID_ARGUMENT", "history is empty: send at least one item id"),
        (
            {"history": ["a", "b"], "k": 3},
            "INVALID_ARGUMENT",
            "none of the 2 history ids is in the model's vocabulary",
        ),
        (
            {"history": ["item1"], "k": 5, "per_interest_k": 3},
            "INVALID_ARGUMENT",
            "per_interest_k must be 0 (= k) or between k (5) and 2000, got 3",
        ),
        (
            {"history": ["item1"], "k": 5, "category": "genre"},
            "INVALID_ARGUMENT",
            "unknown category 'genre': no item of the model has it",
        ),
        (
            {"history": ["item1"], "k": 5, "rerank": retrieval_pb2.Rerank()},
            "INVALID_ARGUMENT",
            "rerank asked for, but the server has no ranker (tools/serve.py --ranker DIR)",
        ),
        (
            {"history": ["item1"], "k": 5, "diversity_lambda": 0.5},
            "INVALID_ARGUMENT",
            "diversity_lambda is only used by the DIVERSITY merge, not MAX_SCORE",
        ),
        (
            {"history": ["item1"], "k": 5, "diversity_lambda": -0.1, "merge": retrieval_pb2.DIVERSITY},
            "INVALID_ARGUMENT",
            "diversity_lambda must be a finite number >= 0, got -0.10000000149011612",
        ),
        (
            {"history": ["item1"], "events": [retrieval_pb2.Event(item_id="item1")], "k": 5},
            "INVALID_ARGUMENT",
            "send the history either as history or as events, not both",
        ),
        (
            {"history": ["item1"], "k": 5, "merge": 9},  # type: ignore[dict-item]
            "INVALID_ARGUMENT",
            "unknown merge strategy 9; use one of [0, 1, 2, 3]",
        ),
    ],
)
def test_bad_requests_are_refused_naming_why(
    serve: Callable[..., native.NativeServer], request_: dict[str, Any], code: str, message: str
) -> None:
    server = serve()
    with grpc.insecure_channel(address(server)) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as raised:
            stub.Retrieve(retrieval_pb2.RetrieveRequest(**request_), timeout=10)
        assert (raised.value.code().name, raised.value.details()) == (code, message)
        good = retrieval_pb2.RetrieveRequest(history=["item1"], k=2)
        bad = retrieval_pb2.RetrieveRequest(**request_)
        with pytest.raises(grpc.RpcError) as raised:
            stub.BatchRetrieve(retrieval_pb2.BatchRetrieveRequest(requests=[good, bad]), timeout=10)
        assert (raised.value.code().name, raised.value.details()) == (code, f"requests[1]: {message}")
    assert server.counters()["rows"] == 0  # nothing reached the kernel


def five(ids: np.ndarray, scores: np.ndarray) -> tuple[Any, ...]:
    """A search answer of ``ids`` and ``scores`` for one row (its interests all ones)."""
    return ids, scores, np.zeros(1, np.int32), np.ones((1, ids.shape[1], DIM), np.float32), None


class FirstAnswer(ToyKernel):
    """Answers its first search with ``answer`` (raises it when it is an exception), then as a
    :class:`ToyKernel`."""

    def __init__(self, answer: Any) -> None:
        super().__init__()
        self.answer, self.calls = answer, 0

    def search(self, *args: Any) -> Any:
        self.calls += 1
        if self.calls > 1:
            return super().search(*args)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (ValueError("boom"), "the kernel raised ValueError: boom"),
        (five(np.ones((1, 2, 3), np.int64), np.ones((1, 2, 4), np.float32)), "must both be [1, K, n]"),
        (
            five(np.full((1, 1, 1), NUM_ITEMS + 1, np.int64), np.ones((1, 1, 1), np.float32)),
            "outside the vocabulary",
        ),
        (five(np.ones((1, 1, 1), np.int64), np.full((1, 1, 1), np.nan, np.float32)), "a NaN score for id 1"),
        ("not arrays", "the kernel's search must return (ids, scores, fetched, interests, weights)"),
        (
            five(np.ones((1, 1, 1), np.int64), np.ones((1, 1), np.float32)),
            "the kernel's scores must be a 3-d array",
        ),
    ],
)
def test_a_failing_kernel_fails_its_batch_internal_and_the_next_batch_is_served(
    serve: Callable[..., native.NativeServer], answer: Any, message: str
) -> None:
    server = serve(FirstAnswer(answer))
    with connected(address(server), retries=0) as client:
        with pytest.raises(grpc.RpcError) as raised:
            client.retrieve(["item1"], 3)
        assert raised.value.code() == grpc.StatusCode.INTERNAL and message in str(raised.value.details())
        assert_answers(client.retrieve(["item1"], 3).items, reference(["item1"], 3))
    server.stop(0)
    # An id outside the vocabulary or a NaN fails the calls that read it; the others the batch.
    answered = "vocabulary" in message or "NaN" in message
    assert server.counters()["kernel_errors"] == (0 if answered else 1)


def test_the_vocabulary_handover_refuses_a_repeated_id() -> None:
    built()
    with pytest.raises(ValueError, match="the vocabulary repeats the id 'item3'"):
        native.NativeServer(toy_servable(vocabulary=[*VOCAB, "item3"]))


# --- serving ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_request_mb", "refused_with"),
    [(5.0, grpc.StatusCode.INVALID_ARGUMENT), (1.0, grpc.StatusCode.RESOURCE_EXHAUSTED)],
)
def test_the_heap_is_trimmed_once_after_a_burst_of_large_requests(
    serve: Callable[..., native.NativeServer], max_request_mb: float, refused_with: grpc.StatusCode
) -> None:
    """As the Python engine's MemoryTrimmer: small requests never trim; a burst of requests of
    LARGE_REQUEST bytes or more trims once, after the burst: refused once parsed (too many
    exclusions) or, over a 1 MiB ``--max-request-mb``, unparsed (gRPC read them all the same)."""
    server = serve(limits=LimitsConfig(max_request_mb=max_request_mb))
    with grpc.insecure_channel(address(server)) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)  # type: ignore[no-untyped-call]
        for _ in range(20):
            stub.Retrieve(retrieval_pb2.RetrieveRequest(history=["item1"], k=3), timeout=10)
        time.sleep(0.5)
        assert server.counters()["trims"] == 0
        large = retrieval_pb2.RetrieveRequest(
            history=["item1"], k=3, exclude_ids=[f"x{i:07d}" for i in range(120_000)]
        )
        assert large.ByteSize() >= LARGE_REQUEST
        for _ in range(3):  # refused by a limit after it was read: noted all the same
            assert code_of(lambda: stub.Retrieve(large, timeout=10)) == refused_with
    deadline = time.monotonic() + 10
    while server.counters()["trims"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert server.counters()["trims"] == 1


def test_port_zero_health_and_reflection(serve: Callable[..., native.NativeServer]) -> None:
    server = serve()
    assert server.port > 0
    with pytest.raises(RuntimeError, match="already started"):
        server.start()
    with socket.socket() as taken:  # bound without SO_REUSEPORT: gRPC cannot share the port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(RuntimeError, match=f"cannot serve on {re.escape(busy)}"):
            native.NativeServer(toy_servable()).start(busy)
    with connected(address(server), retries=0) as client:
        assert client.health() == "SERVING"
    with grpc.insecure_channel(address(server)) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        (answer,) = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
    services = {s.name for s in answer.list_services_response.service}
    assert {"retrieval.v1.RetrievalService", "grpc.health.v1.Health"} <= services


@pytest.mark.parametrize("round_", range(20))
def test_concurrent_calls_are_answered_in_batches(
    serve: Callable[..., native.NativeServer], round_: int
) -> None:
    sizes: list[int] = []

    def slow(histories: np.ndarray, fetch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        sizes.append(len(histories))
        time.sleep(0.005)  # calls pile up meanwhile: the next batch is bigger
        return brute_force(histories, fetch)

    server = serve(slow, batching=BatchingConfig(max_batch=8))
    asked = queries(64, seed=round_)
    with connected(address(server), retries=0) as client, ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda query: client.retrieve(**query), asked))
    for got, query in zip(answers, asked, strict=True):
        assert_answers(got.items, reference(**query))
    counters = server.counters()
    assert sum(sizes) == counters["rows"] == 64 and counters["batches"] == len(sizes)
    assert max(sizes) <= 8 and counters["max_batch_rows"] == max(sizes)
    assert len(sizes) < 64  # 16 callers, a kernel call of 5 ms: some calls shared a batch


@pytest.mark.parametrize("round_", range(20))
def test_stop_lets_the_calls_in_flight_finish_then_refuses_new_ones(
    serve: Callable[..., native.NativeServer], round_: int
) -> None:
    entered, release = threading.Event(), threading.Event()
    held_rows = []

    def held(histories: np.ndarray, fetch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        held_rows.append(len(histories))
        entered.set()
        assert release.wait(10)
        return brute_force(histories, fetch)

    server = serve(held)
    with connected(address(server), retries=0) as client, ThreadPoolExecutor(4) as pool:
        calls = [pool.submit(client.retrieve, [f"item{i}"], 3) for i in range(4)]
        assert entered.wait(10)
        wait_for_queued(server, 4 - held_rows[0])  # every call is in: gRPC cancels those not yet started
        stopping = pool.submit(server.stop, 10.0)
        time.sleep(0.01 * (round_ % 5))  # the stop begins while the kernel holds the batch
        release.set()
        stopping.result(timeout=20)
        for i, call in enumerate(calls):
            assert_answers(call.result(timeout=10).items, reference([f"item{i}"], 3))
    with (
        RetrievalClient(address(server), retries=0, timeout=2) as client,
        pytest.raises(grpc.RpcError) as raised,
    ):
        client.retrieve(["item1"], 3)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    server.stop(0)  # idempotent


def test_stop_without_grace_returns_and_ends_every_call(serve: Callable[..., native.NativeServer]) -> None:
    kernel = Held()
    server = serve(kernel, batching=BatchingConfig(max_batch=1))
    with RetrievalClient(address(server), retries=0, timeout=20) as client, ThreadPoolExecutor(6) as pool:
        calls = [pool.submit(client.retrieve, ["item1"], 3) for _ in range(6)]
        assert kernel.entered.wait(10)
        wait_for_queued(server, 5)  # one batch held by the kernel, five behind it
        stopping = pool.submit(server.stop, 0.0)
        time.sleep(0.2)  # the grace is over: gRPC cancels the calls; the kernel still holds a batch
        kernel.release.set()
        stopping.result(timeout=20)
        ended = []
        for call in calls:
            try:
                assert_answers(call.result(timeout=20).items, reference(["item1"], 3))
                ended.append("OK")
            except grpc.RpcError as e:
                ended.append(e.code().name)
    # A call gRPC had not cancelled yet when its batch came is answered; none is left hanging.
    assert set(ended) <= {"OK", "CANCELLED", "UNAVAILABLE"}
    counters = server.counters()
    assert counters["calls"] == 6 and counters["rows"] + counters["cancelled"] == 6


def test_a_call_whose_deadline_passed_while_queued_costs_the_kernel_nothing(
    serve: Callable[..., native.NativeServer],
) -> None:
    kernel = Held()
    server = serve(kernel, batching=BatchingConfig(max_batch=1))
    hasty = RetrievalClient(address(server), retries=0, timeout=0.3)
    with (
        ThreadPoolExecutor(1) as pool,
        hasty,
        RetrievalClient(address(server), retries=0, timeout=20) as client,
    ):
        first = pool.submit(client.retrieve, ["item1"], 3)
        assert kernel.entered.wait(10)
        with pytest.raises(grpc.RpcError) as raised:
            hasty.retrieve(["item2"], 3)
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        time.sleep(1.0)  # the server's own deadline timer (the same deadline) has fired too
        kernel.release.set()
        assert_answers(first.result(timeout=10).items, reference(["item1"], 3))
    counters = server.counters()
    assert (counters["calls"], counters["rows"], counters["batches"], counters["cancelled"]) == (2, 1, 1, 1)


@pytest.mark.parametrize("round_", range(10))
def test_a_swap_serves_the_next_calls_while_the_calls_in_flight_finish_on_the_old_version(
    round_: int,
) -> None:
    """Hot reload: the new version (another model version, a catalogue grown by one item) answers
    the calls that arrive after the swap; the call held in the old version's kernel is answered by
    it; the old version is released once its last call is answered."""
    built()
    old_kernel = Held()
    server = native.NativeServer(toy_servable(old_kernel, version="v1"))
    server.start()
    grown = [*VOCAB, "item-new"]
    try:
        with connected(address(server), retries=0) as client, ThreadPoolExecutor(2) as pool:
            held = pool.submit(client.retrieve, ["item1"], 3)
            assert old_kernel.entered.wait(10)
            with pytest.raises(grpc.RpcError) as raised:  # refused at once: not in v1's vocabulary
                client.retrieve(["item-new"], 3)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            server.swap(toy_servable(vocabulary=grown, version="v2"))
            after = pool.submit(client.retrieve, ["item-new", "item2"], 3)
            time.sleep(0.01 * (round_ % 5))
            old_kernel.release.set()
            answer = held.result(timeout=10)
            assert answer.model_version == "v1"
            assert_answers(answer.items, reference(["item1"], 3))
            answer = after.result(timeout=10)
            # The new item is known (excluded, not refused) but not read as history: unknown to the tower.
            assert answer.model_version == "v2" and answer.unknown_items == 1
            assert_answers(answer.items, reference(["item2"], 3))
        gone = weakref.ref(old_kernel)
        del old_kernel
        gc.collect()
        assert gone() is None  # the engine let the old version go
    finally:
        server.stop(0)


def test_set_model_info_changes_what_get_model_info_answers(
    serve: Callable[..., native.NativeServer],
) -> None:
    server = serve()
    with grpc.insecure_channel(address(server)) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)  # type: ignore[no-untyped-call]
        info = stub.GetModelInfo(retrieval_pb2.GetModelInfoRequest(), timeout=10)
        assert info.model_version == "v-native" and info.reload_refusals == 0
        refused = retrieval_pb2.ModelInfo(model_version="v-native", reload_refusals=1, last_refusal="bad")
        server.set_model_info(refused.SerializeToString())
        assert stub.GetModelInfo(retrieval_pb2.GetModelInfoRequest(), timeout=10) == refused


def test_a_deadline_passing_while_the_kernel_computes_stops_the_call_after_the_search(
    serve: Callable[..., native.NativeServer],
) -> None:
    def slow(histories: np.ndarray, fetch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        time.sleep(0.6)  # the call's deadline (0.3 s) passes meanwhile
        return brute_force(histories, fetch)

    server = serve(slow)
    with (
        RetrievalClient(address(server), retries=0, timeout=0.3) as client,
        pytest.raises(grpc.RpcError) as raised,
    ):
        client.retrieve(["item1"], 3)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + 10
    while server.counters()["deadline_exceeded"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    counters = server.counters()
    assert (counters["batches"], counters["deadline_exceeded"], counters["cancelled"]) == (1, 1, 0)


HEAVY = retrieval_pb2.RetrieveRequest(history=["item1"], k=3)
"""A heavy call under :func:`a_heavy_call_held`'s limits: cost 1.013 over cheap_cost 1 (1 + 1 id
/ 1000 + 3 interests x 4 candidates / 1000)."""


class HeldCall(NamedTuple):
    server: native.NativeServer
    kernel: Held
    stub: Any
    pool: ThreadPoolExecutor
    first: Future[Any]


@contextlib.contextmanager
def a_heavy_call_held(serve: Callable[..., native.NativeServer], heavy_wait: float) -> Iterator[HeldCall]:
    """A server whose heavy budget (1.5 cost units) holds one :data:`HEAVY` call and lets one
    more wait up to ``heavy_wait`` seconds, its first call computing (held in the kernel)."""
    kernel = Held()
    limits = LimitsConfig(cheap_cost=1.0, max_cost=1.5, max_waiting=1, heavy_wait=heavy_wait)
    server = serve(kernel, limits=limits)
    with grpc.insecure_channel(address(server)) as channel, ThreadPoolExecutor(2) as pool:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)  # type: ignore[no-untyped-call]
        first = pool.submit(stub.Retrieve, HEAVY, timeout=20)
        assert kernel.entered.wait(10)
        yield HeldCall(server, kernel, stub, pool, first)


@pytest.mark.parametrize("round_", range(5))
def test_heavy_calls_beyond_the_budget_wait_or_are_refused_with_a_pushback(
    serve: Callable[..., native.NativeServer], round_: int
) -> None:
    """The first heavy call computes, the second waits (max_waiting 1), the third is refused at
    once with the Python engine's message and a retry pushback; released, the first two are
    answered."""
    with a_heavy_call_held(serve, heavy_wait=10.0) as held:
        second = held.pool.submit(held.stub.Retrieve, HEAVY, timeout=20)
        time.sleep(0.05 * (1 + round_ % 3))  # the second is waiting for room by now
        with pytest.raises(grpc.RpcError) as raised:
            held.stub.Retrieve(HEAVY, timeout=20)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert re.fullmatch(
            r"server busy: heavy calls hold 1 of 2 cost units and this call costs 1 \(no room to wait\); "
            r"retry in about \d+ ms",
            raised.value.details(),
        ), raised.value.details()
        trailers = dict(raised.value.trailing_metadata())
        assert int(trailers["grpc-retry-pushback-ms"]) >= 10
        held.kernel.release.set()
        for call in (held.first, second):
            assert_answers(result_from_response(call.result(timeout=20)).items, reference(["item1"], 3))
    held.server.stop(0)
    assert held.server.counters()["calls"] == 2


def test_a_heavy_call_that_waited_its_time_for_room_is_refused(
    serve: Callable[..., native.NativeServer],
) -> None:
    with a_heavy_call_held(serve, heavy_wait=0.2) as held:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as raised:
            held.stub.Retrieve(HEAVY, timeout=20)
        assert time.monotonic() - started >= 0.2
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "and this call costs 1 (waited 0.20 s); retry in about" in str(raised.value.details())
        held.kernel.release.set()
        assert held.first.result(timeout=20).items


def wait_for_queued(server: native.NativeServer, rows: int) -> None:
    """Waits (10 s at most) until ``rows`` queries wait for a batch."""
    deadline = time.monotonic() + 10
    while server.counters()["queued"] < rows and time.monotonic() < deadline:
        time.sleep(0.005)
    assert server.counters()["queued"] == rows


EXIT_WITHOUT_STOP = """
import threading, time
import grpc
import numpy as np
from retrieval.api import RetrievalClient
from retrieval.api.convert import result_from_response
from retrieval.serving.native import NativeServer
from retrieval.serving.native_kernel import NativeServable

entered = threading.Event()

class Kernel:
    def search(self, histories, fetch, *rest):
        entered.set()
        time.sleep(0.01)  # wakes while the interpreter exits
        ids = np.arange(1, 4, dtype=np.int64).reshape(1, 1, 3).repeat(len(histories), axis=0)
        fetched = np.full(len(histories), 3, np.int32)
        return ids, -ids.astype(np.float32), fetched, np.ones((len(histories), 1, 2), np.float32), None

def call():
    try:
        client.retrieve(["a"], 2)
    except grpc.RpcError:
        pass  # the server stops under it

servable = NativeServable(
    Kernel(), ["a", "b", "c", "d"], 4, "v", 2, 1, 4, {}, np.arange(5), "unavailable", {}, False, b"",
)
server = NativeServer(servable)
client = RetrievalClient(f"127.0.0.1:{server.start()}", retries=0)
threading.Thread(target=call, daemon=True).start()
print(entered.wait(10))
"""


@pytest.mark.parametrize("round_", range(3))
def test_an_interpreter_exiting_with_a_batch_in_the_kernel_stops_the_server_first(round_: int) -> None:
    """Without the stop at exit, the batcher's thread woke in a finalizing interpreter and the
    process crashed (SIGSEGV or SIGABRT: 12 exits in 12 here)."""
    built()
    done = subprocess.run(
        [sys.executable, "-c", EXIT_WITHOUT_STOP], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout.strip()) == (0, "True"), done.stderr[-2000:]
