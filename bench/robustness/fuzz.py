"""Fuzzing: generated calls sent as raw bytes to a server, every answer checked, a report."""

from __future__ import annotations

import argparse
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from hypothesis import HealthCheck, Phase, given, seed, settings

from bench.robustness.calls import REQUEST_TYPES, SERVICE, Call, make_call
from bench.robustness.oracle import Served, check_call
from bench.robustness.server import (
    SYNTHETIC_ATTRIBUTES,
    serve,
    served_by,
    served_from_dirs,
    synthetic_retriever,
)
from bench.robustness.strategies import calls
from retrieval.api.v1 import retrieval_pb2


class FuzzClient:
    """Sends raw request bytes to every RPC of a server (so undecodable payloads can be sent too)."""

    def __init__(self, address: str, timeout: float = 30.0) -> None:
        size = 64 << 20  # the client never limits: the server's limit is what is tested
        options = [("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", size)]
        self.channel = grpc.insecure_channel(address, options=options)
        self.timeout = timeout
        self._methods = {m: self.channel.unary_unary(SERVICE + m, None, None) for m in REQUEST_TYPES}

    def wait_ready(self, timeout: float = 30.0) -> None:
        grpc.channel_ready_future(self.channel).result(timeout=timeout)

    def send(self, call: Call) -> tuple[grpc.StatusCode, str, bytes | None]:
        """``(status code, details, response bytes or None)`` of one call."""
        try:
            response = self._methods[call.method](call.payload, timeout=self.timeout)
        except grpc.RpcError as error:
            return error.code(), error.details() or "", None
        return grpc.StatusCode.OK, "", response

    def good_request_works(self, served: Served) -> bool:
        """A plain valid request gets a full, correct answer."""
        request = retrieval_pb2.RetrieveRequest(history=list(served.vocab[:2]), k=3)
        call = make_call("Retrieve", request.SerializeToString(), "probe")
        code, details, response = self.send(call)
        return code is grpc.StatusCode.OK and not check_call(call, code, details, response, served)

    def close(self) -> None:
        self.channel.close()


@dataclass
class FuzzReport:
    """What a fuzzing run saw.

    Attributes:
        counts: calls per ``(method, status code name)``.
        violations: ``"<call> => <what is wrong>"`` per call answered against the API.
        payloads: the request bytes of each violation (to replay it).
        probe_failures: good requests (sent every 100 calls) that failed.
    """

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    probe_failures: int = 0


def run_fuzz(
    client: FuzzClient,
    served: Served,
    n: int,
    seed_value: int = 0,
    undecodable: bool = True,
    on_progress: Callable[[int], None] | None = None,
) -> FuzzReport:
    """Sends ``n`` generated calls and checks every answer; every 100 calls it also checks that a
    good request still works."""
    report = FuzzReport()
    known = served.vocab[: min(len(served.vocab), 64)]

    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @seed(seed_value)
    @given(calls(known, sorted(served.categories)[:64], undecodable, served.max_message_bytes))
    def fuzz_one(call: Call) -> None:
        code, details, response = client.send(call)
        report.counts[(call.method, code.name)] += 1
        problems = check_call(call, code, details, response, served)
        if problems:
            report.violations.append(f"{call.describe()} => {'; '.join(problems)}")
            report.payloads.append(call.payload)
        done = sum(report.counts.values())
        if done % 100 == 0:
            report.probe_failures += not client.good_request_works(served)
            if on_progress is not None:
                on_progress(done)

    fuzz_one()
    return report


def _violation_kind(violation: str) -> str:
    """``INTERNAL on undecodable requests``, ``INTERNAL``, ... or the first wrong property."""
    description, _, problems = violation.partition(" => ")
    if problems.startswith("status "):
        code = problems.split()[1]
        return f"{code} on undecodable requests" if "undecodable" in description else code
    return problems.split(";")[0].split(",")[0][:80]


@dataclass
class FuzzOutcome:
    """A fuzzing run against a server in a child process: the report and how the server ended."""

    report: FuzzReport
    seconds: float
    final_ok: bool
    """A good request after the run got a correct answer."""
    alive: bool
    """The server process was still running after the run."""


def fuzz_main(args: argparse.Namespace) -> int:
    """``--fuzz N``: fuzzes a server in a child process, prints the report (0: no violation)."""
    outcome = fuzz_child_server(args)
    write_fuzz_report(outcome)
    report = outcome.report
    if args.violations is not None:
        lines = [
            f"{v} | payload hex {p.hex()}" for v, p in zip(report.violations, report.payloads, strict=True)
        ]
        args.violations.write_text("".join(line + "\n" for line in lines))
        print(f"all violations written to {args.violations}")
    clean = not report.violations and not report.probe_failures
    return 0 if clean and outcome.final_ok and outcome.alive else 1


def fuzz_child_server(args: argparse.Namespace) -> FuzzOutcome:
    """Starts the server (``--model``/``--index`` or the synthetic model; ``--engine``'s) in a
    spawned process on a free port, sends ``--fuzz`` calls, and stops it."""
    max_bytes = int(args.max_message_mb * 2**20)
    context = multiprocessing.get_context("spawn")
    ports = context.Queue()
    model_dir, index_dir = (str(args.model), str(args.index)) if args.model else (None, None)
    server = context.Process(
        target=serve, args=(model_dir, index_dir, max_bytes, ports, args.engine), daemon=True
    )
    server.start()
    try:
        port = ports.get(timeout=300)
        if args.model:
            served = served_from_dirs(args.model, max_bytes)
        else:
            served = served_by(synthetic_retriever(), SYNTHETIC_ATTRIBUTES, max_bytes)
        client = FuzzClient(f"127.0.0.1:{port}")
        client.wait_ready()
        print(
            f"fuzzing {SERVICE}* on 127.0.0.1:{port} ({args.engine} engine, server pid {server.pid}) "
            f"with {args.fuzz} requests, "
            f"seed {args.seed}, message limit {max_bytes} bytes",
            flush=True,
        )
        started = time.perf_counter()

        def progress(done: int) -> None:
            if done % 1000 == 0:
                rate = done / (time.perf_counter() - started)
                print(f"  {done} requests, {rate:.0f}/s", flush=True)

        report = run_fuzz(client, served, args.fuzz, args.seed, not args.no_undecodable, progress)
        seconds = time.perf_counter() - started
        final_ok = client.good_request_works(served)
        client.close()
        alive = server.is_alive()
    finally:
        if server.is_alive():
            server.terminate()
        server.join(10)
    return FuzzOutcome(report, seconds, final_ok, alive)


def write_fuzz_report(outcome: FuzzOutcome) -> None:
    """Prints the counts per method and status, the violations by kind and one of each in full."""
    counts, violations = outcome.report.counts, outcome.report.violations
    total = sum(counts.values())
    print(f"\n{total} requests in {outcome.seconds:.1f} s ({total / outcome.seconds:.0f}/s)")
    print(f"{'method':<14} {'status':<20} {'count':>7}")
    for (method, code), count in sorted(counts.items()):
        print(f"{method:<14} {code:<20} {count:>7}")
    by_code: Counter[str] = Counter()
    for (_, code), count in counts.items():
        by_code[code] += count
    print("per status: " + ", ".join(f"{code} {count}" for code, count in sorted(by_code.items())))
    print(
        f"violations: {len(violations)}; good-request probes failed: {outcome.report.probe_failures}; "
        f"good request after the run: {'ok' if outcome.final_ok else 'FAILED'}; server process alive: "
        f"{outcome.alive}"
    )
    kinds: Counter[str] = Counter(_violation_kind(v) for v in violations)
    if kinds:
        print("violations by kind: " + "; ".join(f"{k}: {c}" for k, c in kinds.most_common()))
    shown: set[str] = set()
    for violation in violations:  # one example of each kind, in full
        if _violation_kind(violation) not in shown:
            shown.add(_violation_kind(violation))
            print(f"  {violation[:2000]}")
