"""A serving group's failures (``python -m bench.robustness --group``).

``tools/serve.py --processes 2 --engine ENGINE`` serves the soak's first version in a child process, and one
case per failure of a worker:

* kill -9 of one worker under load (4 client threads, one connection each, and a health check
  on a new connection every 50 ms, as a load balancer probes): the calls that failed and the
  health checks that did not answer SERVING are counted while the worker is replaced;
* SIGSTOP of one worker (hung): how long until the supervisor logs it and kills it, and until
  its replacement is up; new connections all answer afterwards;
* SIGTERM of the supervisor while one worker is stopped (a stuck step of the stop), once and
  twice: the time to exit against ``--grace`` plus the documented margin.

:class:`Availability` (the load and the probes) is shared with ``tests/serving/test_workers.py``.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.data import REPO
from bench.robustness.deploys import Case, report_cases
from bench.robustness.processes import tool_command, tool_env
from bench.robustness.soak import Version, soak_versions
from retrieval.api import SERVICE_NAME, RetrievalClient
from retrieval.serving import Engine

log = logging.getLogger("bench.robustness")

UP = "serving group of 2 workers on"
"""What the supervisor logs once every worker is up (again)."""

START_SECONDS = 300.0
"""How long a group may take to report SERVING (two TensorFlow loads on a busy machine)."""


def probe(address: str, timeout: float = 10.0) -> str:
    """The health status a new plain connection to ``address`` reads, as a load balancer's
    probe does: ``SERVING``, ``NOT_SERVING``, or the call's status code when it failed."""
    with grpc.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
        try:
            status = health_pb2_grpc.HealthStub(channel).Check(request, timeout=timeout).status
        except grpc.RpcError as e:
            return str(e.code().name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(status))


@dataclass
class Availability:
    """Load and probes against ``address`` while a test or a case breaks something.

    ``clients`` threads each call ``Retrieve`` back to back on a client of their own
    (:class:`RetrievalClient` with its default retries: one connection each, health-checked);
    one thread probes health on a new connection every ``probe_every`` seconds. Counts every
    answer; a ``with`` block runs them.

    Example:
        >>> with Availability("127.0.0.1:50051", ["50", "172"]) as load:
        ...     load.wait_for(ok=20)
        ...     break_something()
        >>> load.failed, load.probes["NOT_SERVING"]
    """

    address: str
    history: list[str]
    clients: int = 4
    probe_every: float = 0.05
    ok: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    """Failed calls by status code."""
    probes: Counter[str] = field(default_factory=Counter)
    """Health probes by answer (``SERVING``, ``NOT_SERVING``, or a failed probe's code)."""

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._call, daemon=True) for _ in range(self.clients)]
        self._threads.append(threading.Thread(target=self._probe, daemon=True))

    def __enter__(self) -> Self:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def wait_for(self, ok: int, timeout: float = 120.0) -> None:
        """Waits until ``ok`` calls in all have been answered.

        Raises:
            TimeoutError: fewer after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while self.ok < ok:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.ok} calls answered after {timeout:.0f} s, waiting for {ok}")
            time.sleep(0.02)

    @property
    def not_serving(self) -> int:
        """Probes that reached a worker and read NOT_SERVING."""
        return self.probes["NOT_SERVING"]

    @property
    def unreachable(self) -> int:
        """Probes that failed (no worker answered the new connection)."""
        return sum(self.probes.values()) - self.probes["SERVING"] - self.probes["NOT_SERVING"]

    def _call(self) -> None:
        with RetrievalClient(self.address, timeout=10) as client:
            while not self._stop.is_set():
                try:
                    client.retrieve(self.history, 5)
                except grpc.RpcError as e:
                    with self._lock:
                        self.failed[e.code().name] += 1
                else:
                    with self._lock:
                        self.ok += 1

    def _probe(self) -> None:
        while not self._stop.wait(self.probe_every):
            answer = probe(self.address)
            with self._lock:
                self.probes[answer] += 1


def descendants(pid: int) -> list[int]:
    """The child processes of ``pid``, their children, and so on (Linux)."""
    children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return [*children, *(d for c in children for d in descendants(c))]


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class ServedGroup:
    """``tools/serve.py --processes 2 --port P ARGS`` in a child process, its log in ``log``;
    entered once it logged SERVING (the port is free unless given)."""

    def __init__(self, folder: Path, *args: str, port: int | None = None, env: dict[str, str] | None = None):
        from bench.serving import free_port

        self.port = free_port() if port is None else port
        self.address = f"127.0.0.1:{self.port}"
        self.log = folder / f"group-{self.port}.log"
        self.command = tool_command("serve", "--processes", "2", "--port", str(self.port), *args)
        self.env = {**tool_env(), **(env or {})}

    def __enter__(self) -> Self:
        with self.log.open("w") as out:
            self.process = subprocess.Popen(self.command, cwd=REPO, stdout=out, stderr=out, env=self.env)
        self.wait_for_log(UP)
        return self

    def wait_for_log(self, text: str, count: int = 1, timeout: float = START_SECONDS) -> None:
        """Waits until ``text`` is ``count`` times in the log.

        Raises:
            AssertionError: the group exited, or ``timeout`` seconds passed (the log in the message).
        """
        deadline = time.monotonic() + timeout
        while self.log.read_text().count(text) < count:
            assert self.process.poll() is None, f"the group exited: {self.log.read_text()}"
            assert time.monotonic() < deadline, f"no {text!r} in the log: {self.log.read_text()}"
            time.sleep(0.05)

    @property
    def workers(self) -> list[int]:
        """The pids of the running workers, as the supervisor logged them, by worker number."""
        started = dict(re.findall(r"worker (\d+) started \(pid (\d+)\)", self.log.read_text()))
        pids = [int(started[n]) for n in sorted(started)]
        assert set(pids) <= set(descendants(self.process.pid)), "a logged worker is not the group's"
        return pids

    def stop(self, signals: int = 1, timeout: float = 120.0) -> tuple[int, float]:
        """Sends SIGTERM ``signals`` times (0.5 s apart); returns the exit code and the seconds
        from the first one to the exit."""
        started = time.monotonic()
        for n in range(signals):
            if n:
                time.sleep(0.5)
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout)
        return code, time.monotonic() - started

    def __exit__(self, *exc: object) -> None:
        started = [int(pid) for pid in re.findall(r"started \(pid (\d+)\)", self.log.read_text())]
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for pid in started:  # a worker a failed case left stopped would never see its supervisor go
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def killed_worker(version: Version, work: Path, engine: Engine) -> Case:
    """kill -9 of worker 0 two seconds into the load; the load goes on until its replacement
    has been up for 50 more calls. Passes with no failed call and no probe reading NOT_SERVING."""
    from bench.serving import free_port

    history = _history(version)
    metrics_port = free_port()
    args = [*_served(version, engine), "--metrics-port", str(metrics_port)]
    with ServedGroup(work, *args) as group:
        with Availability(group.address, history) as load:
            time.sleep(2.0)
            victim = group.workers[0]
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            group.wait_for_log(UP, count=2)
            replaced = time.monotonic() - killed
            load.wait_for(load.ok + 50)
        code, _ = group.stop()
    failed = sum(load.failed.values())
    figures = (
        f"{load.ok} calls answered, {failed} failed{f' {dict(load.failed)}' if failed else ''}; "
        f"{sum(load.probes.values())} "
        f"health probes on new connections: {load.not_serving} NOT_SERVING, {load.unreachable} unreachable; "
        f"the replacement SERVING {replaced:.1f} s after the kill; exit code {code}"
    )
    return Case(
        "kill -9 of one worker of 2 under load", figures, not failed and not load.not_serving and code == 0
    )


def stopped_worker(version: Version, work: Path, engine: Engine) -> Case:
    """SIGSTOP of worker 1: the supervisor must log it and kill it within the heartbeat's
    timeout (and a second), and its replacement must answer every new connection."""
    from retrieval.serving import HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT

    history = _history(version)
    with ServedGroup(work, *_served(version, engine)) as group:
        victim = group.workers[1]
        os.kill(victim, signal.SIGSTOP)
        stopped = time.monotonic()
        group.wait_for_log(f"worker 1 (pid {victim}) exited with code -9: killed", timeout=120)
        detected = time.monotonic() - stopped
        group.wait_for_log(UP, count=2)
        up = time.monotonic() - stopped
        answered = 0
        for _ in range(20):  # new connections, spread over both workers
            with RetrievalClient(group.address, timeout=5, retries=0) as client:
                answered += bool(client.retrieve(history, 5).items)
        code, _ = group.stop()
    bound = HEARTBEAT_TIMEOUT + HEARTBEAT_INTERVAL + 1.0
    figures = (
        f"killed and logged {detected:.1f} s after SIGSTOP (bound {bound:.1f} s), the replacement SERVING "
        f"after {up:.1f} s; {answered}/20 new connections answered; exit code {code}"
    )
    return Case("SIGSTOP of one worker of 2", figures, detected <= bound and answered == 20 and code == 0)


def stuck_stop(version: Version, work: Path, engine: Engine, signals: int) -> Case:
    """SIGTERM (``signals`` times, 0.5 s apart) to a supervisor one of whose workers is stopped:
    once, it must exit 0 within ``--grace`` + :data:`STOP_MARGIN` (+1 s), the stopped worker
    killed; twice, it must exit 1 within 2 s of the second signal, no worker left."""
    from retrieval.serving import STOP_MARGIN

    grace = 2.0
    args = [*_served(version, engine), "--grace", str(grace)]
    with ServedGroup(work, *args) as group:
        workers = group.workers
        os.kill(workers[0], signal.SIGSTOP)
        code, took = group.stop(signals)
        left = [pid for pid in workers if alive(pid)]
    bound, expected = (grace + STOP_MARGIN + 1.0, 0) if signals == 1 else (0.5 + 2.0, 1)
    figures = f"exit code {code} {took:.1f} s after the first SIGTERM (bound {bound:.1f} s)"
    figures += f"; workers left: {len(left)}"
    what = "SIGTERM" if signals == 1 else "SIGTERM twice"
    return Case(
        f"{what} with one worker stopped, --grace {grace:g}",
        figures,
        took <= bound and not left and code == expected,
    )


def _served(version: Version, engine: Engine) -> list[str]:
    """The flags that serve ``version`` with ``engine``."""
    return ["--model", str(version.model), "--index", str(version.index), "--engine", engine]


def _history(version: Version) -> list[str]:
    from retrieval.artifacts import read_model_vocab

    return list(read_model_vocab(version.model).ids[:3])


def run_group_cases(version: Version, out: Path, engine: Engine = "python") -> list[Case]:
    """Every case on ``version`` served by ``engine``, their logs under ``out``/group."""
    work = out / "group"
    work.mkdir(parents=True, exist_ok=True)
    return [
        killed_worker(version, work, engine),
        stopped_worker(version, work, engine),
        stuck_stop(version, work, engine, signals=1),
        stuck_stop(version, work, engine, signals=2),
    ]


def group_main(args: argparse.Namespace) -> int:
    """``--group``: builds (or reuses) the soak's first version, runs every case, prints a row
    per case; exits 1 if one fails."""
    version = soak_versions(args)[2][0]
    started = time.monotonic()
    return report_cases(run_group_cases(version, args.out, args.engine), started)
