"""Abuse of a serving process's cost bounds (``python -m bench.robustness --abuse``).

One ``tools/serve.py --engine ENGINE`` child per case, on the soak's first version, its resident
memory read from ``/proc``: a burst of oversized requests (memory after it vs idle), a flood of
heavy batches with a cheap ``Retrieve`` probe (the probe's p99 under the flood vs idle, its
failures, the server's peak memory vs its ``--max-memory-mb`` ceiling), 200 medium batches at
once and a cheap call after them, and calls whose deadline passes mid-work (the server's CPU
after the client gave up, and how the metrics count them). Issue 43's cases: floods of single
calls that are costly for what they ask (a DIVERSITY merge of k = 1,000 over 2,000 candidates
per interest; 10,000-id histories with 4,000 exclusions) beside ordinary calls (their p50 vs
idle), invalid calls mixed into micro-batches (the valid calls' throughput vs without them), and
one refusal of each kind (each counted in ``/metrics`` with its code and reason).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.robustness.deploys import Case, report_cases
from bench.robustness.processes import rss_kb
from bench.robustness.soak import Version, soak_versions
from bench.serving import Started, cpu_seconds, free_port, requests, start
from retrieval.api.v1 import retrieval_pb2, retrieval_pb2_grpc
from retrieval.serving import Engine

log = logging.getLogger("bench.robustness")

CHEAP_P99_LIMIT = 10.0
"""A cheap call's p99 under the heavy flood may be at most this many times its idle p99."""

RSS_AFTER_BURST_LIMIT = 1.10
"""Resident memory after the oversized burst, at most this times the idle one."""

ORDINARY_P50_LIMIT = 5.0
"""An ordinary call's p50 beside a flood of costly single calls, at most this times its idle p50
(issue 43 measured 62x for the DIVERSITY flood, 20x for the long histories)."""

MIXED_THROUGHPUT_LIMIT = 0.75
"""Valid calls' throughput beside 200 invalid calls a second, at least this share of it without
them (issue 43 measured 0.42: each invalid call made its micro-batch re-run query by query; the
invalid calls, refused at once, still take their share of the two cores: ~0.6 ms each)."""


def _serve(version: Version, engine: Engine, *flags: str) -> tuple[Started, int]:
    metrics_port = free_port()
    args = ["tools/serve.py", "--model", str(version.model), "--index", str(version.index)]
    args += ["--engine", engine, "--processes", "1"]  # one process: its resident memory is read
    return start("server", [*args, "--metrics-port", str(metrics_port), *flags]), metrics_port


def _statuses(
    address: str, calls: Sequence[tuple[str, bytes, float]], token: str = "", one_by_one: bool = False
) -> list[str]:
    """Sends each ``(method, request bytes, timeout)`` at once from its own thread (or one after
    the other), with ``token`` if given; the codes."""
    codes: list[str] = []
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 1 << 30)]) as channel:

        def send(method: str, payload: bytes, timeout: float) -> None:
            call = channel.unary_unary(f"/retrieval.v1.RetrievalService/{method}", None, None)
            try:
                call(payload, timeout=timeout, metadata=metadata)
                codes.append("OK")
            except grpc.RpcError as e:
                codes.append(e.code().name)

        if one_by_one:
            for c in calls:
                send(*c)
            return codes
        threads = [threading.Thread(target=send, args=c) for c in calls]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return codes


def excluding(n: int) -> retrieval_pb2.RetrieveRequest:
    """A one-item history excluding ``n`` ids of 8 characters (``n`` = 200,000: 2 MiB)."""
    return retrieval_pb2.RetrieveRequest(history=["1"], k=5, exclude_ids=[f"x{i:07d}" for i in range(n)])


def oversized_burst(version: Version, engine: Engine) -> Case:
    """8 requests of 30 MiB (3.3M excluded ids) and 8 of 4 MiB (450k: over the list limit, within
    the size limit) at once; resident memory idle, at the peak and 2 s after."""
    server, _ = _serve(version, engine)
    try:
        pid = server.process.pid
        time.sleep(1.0)
        idle = rss_kb(pid) / 1024
        huge, many = (excluding(n) for n in (3_300_000, 450_000))
        peak = [idle]
        done = threading.Event()
        sampler = threading.Thread(target=_sample, args=(lambda: rss_kb(pid) / 1024, peak, done))
        sampler.start()
        calls = [("Retrieve", r.SerializeToString(), 60.0) for r in [huge] * 8 + [many] * 8]
        codes = _statuses(server.address, calls)
        done.set()
        sampler.join()
        time.sleep(2.0)
        after = rss_kb(pid) / 1024
    finally:
        server.stop()
    refused = sorted(codes) == ["INVALID_ARGUMENT"] * 8 + ["RESOURCE_EXHAUSTED"] * 8
    figures = (
        f"codes {_counts(codes)}; RSS idle {idle:.0f} MiB, peak {max(peak):.0f}, after {after:.0f} "
        f"({after / idle:.2f}x, limit {RSS_AFTER_BURST_LIMIT}x)"
    )
    return Case("oversized repeated fields", figures, refused and after <= RSS_AFTER_BURST_LIMIT * idle)


def _counts(codes: Sequence[str]) -> dict[str, int]:
    return {code: codes.count(code) for code in sorted(set(codes))}


def _sample(read: Callable[[], float], into: list[float], done: threading.Event) -> None:
    while not done.wait(0.05):
        into.append(read())


def heavy_flood(
    version: Version,
    engine: Engine,
    cheap: Sequence[retrieval_pb2.RetrieveRequest],
    seconds: float,
    ceiling: float,
) -> Case:
    """A cheap Retrieve every 10 ms, idle and then while 8 threads send heavy batches (256
    histories of 1,500 ids) back to back, each waiting the server's pushback when refused; the
    server's ``--max-memory-mb`` is ``ceiling``."""
    server, _ = _serve(version, engine, "--max-memory-mb", f"{ceiling:g}")
    try:
        pid = server.process.pid
        idle_rss = rss_kb(pid) / 1024
        idle = _probe(server.address, cheap, seconds / 2)
        history = [h for r in cheap for h in r.history][:1500]
        heavy = retrieval_pb2.BatchRetrieveRequest(
            requests=[retrieval_pb2.RetrieveRequest(history=history, k=50)] * 256
        ).SerializeToString()
        stop = threading.Event()
        heavy_codes: list[str] = []
        flooders = _flooders(server.address, heavy, stop, heavy_codes, "BatchRetrieve")
        peak = [idle_rss]
        sampler = threading.Thread(target=_sample, args=(lambda: rss_kb(pid) / 1024, peak, stop))
        loaded = _probe_under(server.address, cheap, seconds, [*flooders, sampler], stop)
    finally:
        server.stop()
    ratio = loaded["p99"] / idle["p99"]
    figures = (
        _compared("cheap", idle, loaded, "under the flood", f"{ratio:.1f}x, limit {CHEAP_P99_LIMIT:g}x")
        + f"; heavy {_counts(heavy_codes)}; "
        f"RSS idle {idle_rss:.0f} MiB, peak {max(peak):.0f}, ceiling {ceiling:.0f}"
    )
    passed = ratio <= CHEAP_P99_LIMIT and loaded["failed"] == 0 and max(peak) <= ceiling * 1.1
    return Case("heavy-batch flood, cheap probe", figures, passed)


def medium_burst(version: Version, engine: Engine, cheap: Sequence[retrieval_pb2.RetrieveRequest]) -> Case:
    """200 medium batches (64 histories each) sent at once, then a cheap Retrieve 0.5 s later (the
    issue's case: it waited 13 s behind them): its latency against the idle p99."""
    server, _ = _serve(version, engine)
    try:
        idle = _probe(server.address, cheap, 3.0)
        medium = retrieval_pb2.BatchRetrieveRequest(requests=list(cheap[:64])).SerializeToString()
        codes: list[str] = []
        calls = [("BatchRetrieve", medium, 30.0)] * 200
        burst = threading.Thread(target=lambda: codes.extend(_statuses(server.address, calls)))
        burst.start()
        time.sleep(0.5)
        after = _probe(server.address, cheap, 0.001)  # one call
        burst.join()
    finally:
        server.stop()
    ratio = after["p50"] / idle["p99"]
    figures = (
        f"medium {_counts(codes)}; a cheap Retrieve 0.5 s later took {after['p50']:.1f} ms "
        f"(idle p99 {idle['p99']:.1f} ms: {ratio:.1f}x, limit {CHEAP_P99_LIMIT:g}x)"
    )
    return Case("200 medium batches at once", figures, after["failed"] == 0 and ratio <= CHEAP_P99_LIMIT)


def _flood(
    address: str, payload: bytes, stop: threading.Event, codes: list[str], method: str = "BatchRetrieve"
) -> None:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(f"/retrieval.v1.RetrievalService/{method}", None, None)
        while not stop.is_set():
            try:
                call(payload, timeout=30)
                codes.append("OK")
            except grpc.RpcError as e:  # wait as gRPC's retry policy would: the server's pushback
                codes.append(e.code().name)
                trailers: dict[str, str] = dict(e.trailing_metadata() or ())  # type: ignore[arg-type]
                stop.wait(int(trailers.get("grpc-retry-pushback-ms", "50")) / 1000)


def _flooders(
    address: str, payload: bytes, stop: threading.Event, codes: list[str], method: str
) -> list[threading.Thread]:
    """8 threads (not started) that each send ``payload`` by ``method`` back to back (:func:`_flood`)."""
    return [threading.Thread(target=_flood, args=(address, payload, stop, codes, method)) for _ in range(8)]


def _compared(what: str, idle: dict[str, float], loaded: dict[str, float], beside: str, ratio: str) -> str:
    """The probe's ``what`` calls' p50/p99 idle and ``beside`` the load (then ``ratio``, the
    figure checked), and how many failed."""
    return (
        f"{what} p50/p99 idle {idle['p50']:.1f}/{idle['p99']:.1f} ms, {beside} "
        f"{loaded['p50']:.1f}/{loaded['p99']:.1f} ms ({ratio}), "
        f"{what} failures {loaded['failed']:.0f} of {loaded['calls']:.0f}"
    )


def _probe_under(
    address: str,
    cheap: Sequence[retrieval_pb2.RetrieveRequest],
    seconds: float,
    load: Sequence[threading.Thread],
    stop: threading.Event,
) -> dict[str, float]:
    """:func:`_probe` half a second into a ``load`` of threads that run until ``stop`` is set
    (started here, stopped and joined once the probe is done)."""
    for thread in load:
        thread.start()
    try:
        time.sleep(0.5)
        return _probe(address, cheap, seconds)
    finally:
        stop.set()
        for thread in load:
            thread.join()


def _probe(address: str, cheap: Sequence[retrieval_pb2.RetrieveRequest], seconds: float) -> dict[str, float]:
    """One cheap Retrieve every 10 ms for ``seconds``: latency percentiles (ms) and failures."""
    latencies: list[float] = []
    failed = 0
    with grpc.insecure_channel(address) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        until, i = time.monotonic() + seconds, 0
        while time.monotonic() < until:
            started = time.perf_counter()
            try:
                stub.Retrieve(cheap[i % len(cheap)], timeout=10)
                latencies.append(1000 * (time.perf_counter() - started))
            except grpc.RpcError:
                failed += 1
            i += 1
            time.sleep(0.01)
    return {
        "p50": float(np.percentile(latencies, 50)),
        "p99": float(np.percentile(latencies, 99)),
        "failed": failed,
        "calls": i,
    }


def deadline_expiry(version: Version, engine: Engine, cheap: Sequence[retrieval_pb2.RetrieveRequest]) -> Case:
    """Five heavy batches (160 histories of 5,000 ids) with a 0.2 s deadline, one after the other:
    the server's CPU once the last client gave up, and the calls the metrics count per status."""
    server, metrics_port = _serve(version, engine)
    try:
        history = [h for r in cheap for h in r.history][:5000]
        heavy = retrieval_pb2.BatchRetrieveRequest(
            requests=[retrieval_pb2.RetrieveRequest(history=history, k=50)] * 160
        ).SerializeToString()
        full = time.perf_counter()
        _statuses(server.address, [("BatchRetrieve", heavy, 120.0)])
        full = time.perf_counter() - full
        codes = []
        for _ in range(5):
            codes += _statuses(server.address, [("BatchRetrieve", heavy, 0.2)])
        cpu = cpu_seconds(server.process.pid) or 0.0
        time.sleep(max(2.0, full))
        after = (cpu_seconds(server.process.pid) or 0.0) - cpu
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        server.stop()
    counted = {code: _counted(text, "BatchRetrieve", code) for code in ("OK", "DEADLINE_EXCEEDED")}
    figures = (
        f"a whole call takes {full:.2f} s; 5 calls with a 0.2 s deadline: client saw {_counts(codes)}, "
        f"server CPU after them {after:.2f} s, metrics count {counted}"
    )
    # A call whose deadline passed while it waited for a thread is dropped by gRPC uncounted.
    counted_right = counted["OK"] == 1 and 1 <= counted["DEADLINE_EXCEEDED"] <= 5
    stopped = set(codes) == {"DEADLINE_EXCEEDED"} and counted_right
    passed = stopped and after < 0.5 * full
    return Case("deadline expiry mid-work", figures, passed)


def _counted(metrics: str, method: str, code: str) -> float:
    """``retrieval_requests_total{method, code}`` in a ``/metrics`` text."""
    labels = (f'method="{method}"', f'code="{code}"')
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("retrieval_requests_total{") and all(label in line for label in labels)
    )


def costly_flood(
    version: Version,
    engine: Engine,
    cheap: Sequence[retrieval_pb2.RetrieveRequest],
    seconds: float,
    costly: str,
) -> Case:
    """Ordinary calls (one every 10 ms) idle, then while 8 threads send single ``Retrieve`` calls
    that are costly for what they ask, back to back, each waiting the server's pushback when
    refused: ``costly`` is ``"diversity"`` (DIVERSITY, k 1,000, 2,000 candidates per interest)
    or ``"exclusions"`` (10,000-id histories excluding 4,000 more ids). Their ordinary p50 vs
    idle (issue 43: 2.8 -> 174 ms and 20x)."""
    pool = [h for r in cheap for h in r.history]
    if costly == "diversity":
        request = retrieval_pb2.RetrieveRequest(
            history=cheap[0].history,
            k=1000,
            per_interest_k=2000,
            merge=retrieval_pb2.DIVERSITY,
            diversity_lambda=0.5,
        )
    else:
        request = retrieval_pb2.RetrieveRequest(history=pool[:10_000], k=10, exclude_ids=pool[10_000:14_000])
    server, _ = _serve(version, engine)
    try:
        idle = _probe(server.address, cheap, seconds / 2)
        stop = threading.Event()
        codes: list[str] = []
        payload = request.SerializeToString()
        flooders = _flooders(server.address, payload, stop, codes, "Retrieve")
        loaded = _probe_under(server.address, cheap, seconds, flooders, stop)
    finally:
        server.stop()
    ratio = loaded["p50"] / idle["p50"]
    limit = f"p50 {ratio:.1f}x, limit {ORDINARY_P50_LIMIT:g}x"
    figures = _compared("ordinary", idle, loaded, "beside the flood", limit)
    figures += f"; costly calls {_counts(codes)}"
    name = "DIVERSITY k 1,000 flood" if costly == "diversity" else "10,000-id histories, 4,000 exclusions"
    return Case(f"{name}, ordinary probe", figures, ratio <= ORDINARY_P50_LIMIT and loaded["failed"] == 0)


def _streams(
    address: str, payloads: Sequence[bytes], seconds: float, pace: Sequence[float] = ()
) -> list[tuple[int, int]]:
    """One thread per payload, each on its own connection, sending it as a ``Retrieve`` for
    ``seconds``: back to back, or one every ``pace[i]`` seconds (when given); ``(OK, refused)``
    per thread."""
    stop = threading.Event()
    counts = [(0, 0)] * len(payloads)

    def send(i: int) -> None:
        ok = refused = 0
        with grpc.insecure_channel(address) as channel:
            call = channel.unary_unary("/retrieval.v1.RetrievalService/Retrieve", None, None)
            while not stop.is_set():
                try:
                    call(payloads[i], timeout=10)
                    ok += 1
                except grpc.RpcError:
                    refused += 1
                if pace:
                    stop.wait(pace[i])
        counts[i] = (ok, refused)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(payloads))]
    for thread in threads:
        thread.start()
    stop.wait(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return counts


INVALID_RATE = 50.0
"""Calls a second each of the four invalid streams of :func:`invalid_mixed` sends."""


def invalid_mixed(
    version: Version, engine: Engine, cheap: Sequence[retrieval_pb2.RetrieveRequest], seconds: float
) -> Case:
    """Throughput of 8 streams of valid ``Retrieve`` calls back to back, alone and beside 4
    streams sending ``INVALID_RATE`` calls a second each for an unknown category, twice in turn
    (issue 43: ~1,000 -> ~420 ok/s, every invalid call made its micro-batch re-run query by
    query)."""
    valid = [r.SerializeToString() for r in cheap[:8]]
    invalid = [
        retrieval_pb2.RetrieveRequest(
            history=r.history, k=r.k, category="no such category"
        ).SerializeToString()
        for r in cheap[8:12]
    ]
    pace = [0.0] * len(valid) + [1 / INVALID_RATE] * len(invalid)
    server, _ = _serve(version, engine)
    alone: list[tuple[int, int]] = []
    mixed: list[tuple[int, int]] = []
    try:
        _streams(server.address, valid, 1.0)  # warm
        for _ in range(2):
            alone += _streams(server.address, valid, seconds / 2)
            mixed += _streams(server.address, valid + invalid, seconds / 2, pace)
    finally:
        server.stop()
    mixed_valid = mixed[:8] + mixed[12:20]
    mixed_invalid = mixed[8:12] + mixed[20:]
    alone_rate = sum(ok for ok, _ in alone) / seconds
    mixed_rate = sum(ok for ok, _ in mixed_valid) / seconds
    refused = sum(refused for _, refused in mixed_invalid)
    wrong = sum(refused for _, refused in alone + mixed_valid) + sum(ok for ok, _ in mixed_invalid)
    ratio = mixed_rate / alone_rate
    figures = (
        f"valid calls {alone_rate:.0f} ok/s alone, {mixed_rate:.0f} ok/s beside {refused / seconds:.0f} "
        f"invalid calls/s ({ratio:.2f}x, limit {MIXED_THROUGHPUT_LIMIT:g}x); wrong answers {wrong}"
    )
    return Case(
        "invalid calls mixed into micro-batches", figures, ratio >= MIXED_THROUGHPUT_LIMIT and not wrong
    )


ACCESS_FILE = """
[identities.reader]
tokens = ["reader-token"]
permissions = ["info"]

[identities.team]
tokens = ["team-token"]
permissions = ["retrieve", "info"]
rate = 5
burst = 5

[identities.ops]
tokens = ["ops-token"]
permissions = ["admin"]
rate = 0
"""

REFUSALS = (
    ("UNAUTHENTICATED", "missing_credentials"),
    ("UNAUTHENTICATED", "invalid_token"),
    ("PERMISSION_DENIED", "permission"),
    ("RESOURCE_EXHAUSTED", "rate_limit"),
    ("RESOURCE_EXHAUSTED", "message_size"),
    ("RESOURCE_EXHAUSTED", "queue_full"),
    ("RESOURCE_EXHAUSTED", "heavy_capacity"),
    ("INVALID_ARGUMENT", "invalid_argument"),
)
"""The refusals (code, reason) :func:`refusals_visible` provokes."""


def refusals_visible(
    version: Version, engine: Engine, cheap: Sequence[retrieval_pb2.RetrieveRequest]
) -> Case:
    """Refusals of each kind against a server with an access file, a rate limit, ``--max-queued
    4``, ``--max-waiting 0`` and a 1 MiB request limit; each must show in ``/metrics``
    (``retrieval_refusals_total``) with its code and reason (issue 43: only ``code="OK"``)."""
    # Heavy for its 256 queries, yet small enough (~30 KB) to be read whatever runs.
    heavy = retrieval_pb2.BatchRetrieveRequest(requests=list(cheap[:256])).SerializeToString()
    small = cheap[0].SerializeToString()
    invalid = retrieval_pb2.RetrieveRequest(history=["1"], k=0).SerializeToString()
    large = excluding(200_000).SerializeToString()  # 2 MiB
    with tempfile.TemporaryDirectory(prefix="mitt-abuse-") as folder:
        access = Path(folder) / "access.toml"
        access.write_text(ACCESS_FILE)
        flags = [
            "--access-file",
            str(access),
            "--rate-limit",
            "1000",
            "--max-queued",
            "4",
            "--max-waiting",
            "0",
        ]
        server, metrics_port = _serve(version, engine, *flags, "--max-request-mb", "1")
        try:
            codes = []
            for token, method, payload, times in (
                ("", "GetModelInfo", b"", 3),
                ("wrong", "GetModelInfo", b"", 3),
                ("reader-token", "Retrieve", small, 3),
                ("team-token", "Retrieve", small, 20),
                ("ops-token", "Retrieve", invalid, 3),
                ("ops-token", "Retrieve", large, 3),
            ):
                codes += _statuses(server.address, [(method, payload, 10.0)] * times, token, one_by_one=True)
            # Heavy batches beside many small calls at once: no room for a second heavy one
            # (--max-waiting 0), nor for more than 4 calls (--max-queued 4).
            calls = [("BatchRetrieve", heavy, 60.0)] * 3 + [("Retrieve", small, 60.0)] * 32
            codes += _statuses(server.address, calls, "ops-token")
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
                text = response.read().decode()
        finally:
            server.stop()
    counted = _refusals(text)
    shown = ", ".join(f"{code}/{reason} {n:.0f}" for (code, reason), n in sorted(counted.items()))
    figures = f"client saw {_counts(codes)}; retrieval_refusals_total by code/reason: {shown}"
    return Case("a refusal of each kind, in /metrics", figures, all(counted.get(r, 0) > 0 for r in REFUSALS))


def _refusals(metrics: str) -> dict[tuple[str, str], float]:
    """``retrieval_refusals_total`` by ``(code, reason)`` in a ``/metrics`` text, summed over
    methods and identities."""
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "retrieval_refusals_total":
                key = (sample.labels["code"], sample.labels["reason"])
                counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def abuse_main(args: argparse.Namespace) -> int:
    """``--abuse``: builds (or reuses) the soak's first version, runs every case, prints a row per
    case; exits 1 if one fails."""
    data, _, versions = soak_versions(args)
    version, engine = versions[0], args.engine
    cheap = requests(data, 50)
    started = time.monotonic()
    cases = [
        oversized_burst(version, engine),
        heavy_flood(version, engine, cheap, args.abuse, args.abuse_ceiling_mb),
        medium_burst(version, engine, cheap),
        deadline_expiry(version, engine, cheap),
        costly_flood(version, engine, cheap, args.abuse, "diversity"),
        costly_flood(version, engine, cheap, args.abuse, "exclusions"),
        invalid_mixed(version, engine, cheap, args.abuse / 2),
        refusals_visible(version, engine, cheap),
    ]
    return report_cases(cases, started)
