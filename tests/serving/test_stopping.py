"""Every step of a server's stop is bounded: with a step made to hang (the drain's shut-down, a
health watcher that never takes its message, a deployment watcher's load, a call in flight),
the process still exits within its grace and :data:`STOP_MARGIN`, and a second SIGTERM ends a
stuck stop at once. Each server runs in a child process, signalled as an orchestrator would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.serving import free_port
from retrieval.api.client import RetrievalClient
from retrieval.api.convert import request_from_query
from retrieval.api.types import Query
from retrieval.artifacts.deployment import publish_deployment
from retrieval.artifacts.model import read_model_vocab
from retrieval.serving.stopping import STOP_MARGIN
from tests.helpers import REPO_ROOT
from tests.serving.helpers import wait_until_started

SLACK = 15.0
"""Seconds a loaded 2-core machine may add to a bound (process start-up aside)."""

SERVE_SYNTHETIC = """
import sys, threading
from retrieval.artifacts.index import build_index_from_model
from retrieval.serving import run, server as served
from retrieval.serving.config import ServerConfig
from retrieval.serving.logs import configure_logging
from retrieval.serving.retriever import Retriever
from tests.helpers import make_model

stuck, port, grace = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
never = threading.Event()
configure_logging("text")


def stuck_watcher(server):  # a health watcher that never takes its message
    server._health._watchers.setdefault("", set()).add(lambda response: never.wait())


if stuck == "drain":  # the drain's shut-down never returns
    served.RetrievalServer._shut_down = lambda self, grace: never.wait()
model = make_model()
run.serve_forever(
    Retriever(model, build_index_from_model(model, "Flat")),
    ServerConfig(engine="python", port=port, grace=grace),
    on_start=stuck_watcher if stuck == "health" else None,
)
print("serve_forever returned", flush=True)
"""
"""A child serving the in-memory model (``argv``: the stuck step, the port, the grace)."""


def start(command: list[str], log: Path, address: str) -> subprocess.Popen[bytes]:
    """Runs ``command`` from the repository root (its output to ``log``); returns once
    ``address`` reports SERVING."""
    with log.open("wb") as out:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until_started(process, address, log)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process


def stop_time(process: subprocess.Popen[bytes], bound: float) -> float:
    """Seconds from SIGTERM to the exit of ``process``, which must come within ``bound``."""
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(bound)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"still running {bound:.0f} s after SIGTERM") from None
    return time.monotonic() - started


@pytest.mark.parametrize("stuck", ["health", pytest.param("drain", marks=pytest.mark.slow)])  # drain: ~7 s
def test_a_stuck_step_of_the_stop_cannot_keep_the_server_running(stuck: str, tmp_path: Path) -> None:
    """``health``: the NOT_SERVING that starts the stop meets a watcher whose send never
    completes; the stop does not wait for it (exit 0). ``drain``: the shut-down itself never
    returns; the guard ends the process :data:`STOP_MARGIN` s after the grace (exit 1)."""
    port, grace = free_port(), 1.0
    log = tmp_path / "server.log"
    command = [sys.executable, "-c", SERVE_SYNTHETIC, stuck, str(port), str(grace)]
    process = start(command, log, f"127.0.0.1:{port}")
    took = stop_time(process, grace + STOP_MARGIN + SLACK)
    text = log.read_text()
    if stuck == "health":
        assert process.returncode == 0, text
        assert "server stopped" in text and "serve_forever returned" in text
    else:
        assert process.returncode == 1, text
        assert "the stop did not finish in time: exiting now" in text
        assert took >= grace + STOP_MARGIN - 0.5  # the calls had their grace, and the margin
        assert "serve_forever returned" not in text


def test_a_second_sigterm_ends_a_stuck_stop_at_once(tmp_path: Path) -> None:
    port, grace = free_port(), 600.0  # the guard's deadline is far: only the second signal ends it
    log = tmp_path / "server.log"
    process = start(
        [sys.executable, "-c", SERVE_SYNTHETIC, "drain", str(port), str(grace)], log, f"127.0.0.1:{port}"
    )
    process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    while "SIGTERM received, stopping" not in log.read_text():
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    took = stop_time(process, SLACK)
    assert process.returncode == 1 and took < SLACK
    assert "SIGTERM received while stopping: exiting now" in log.read_text()


SERVE_CLI = """
import sys, threading
import retrieval.serving.reload as reload
from retrieval.serving.retriever import Retriever
from retrieval.cli.serve import main

stuck, argv = sys.argv[1], sys.argv[2:]
never = threading.Event()
loads = []
load_deployment, retrieve_many = reload.load_deployment, Retriever.retrieve_many


def load(*args, **kwargs):  # the watcher's load of a new version never returns
    loads.append(args)
    if len(loads) > 1:
        print("loading a new version, forever", flush=True)
        never.wait()
    return load_deployment(*args, **kwargs)


def retrieve(self, queries, deadline=None):  # a call for 7 items never returns (warm-up asks 10)
    if queries[0].k == 7:
        print("a call that never returns", flush=True)
        never.wait()
    return retrieve_many(self, queries, deadline)


if stuck == "watcher":
    reload.load_deployment = load
else:
    Retriever.retrieve_many = retrieve
sys.exit(main(argv))
"""
"""``mitt serve ARGV`` in a child whose deployment watcher's second load, or whose call for 7
items, never returns."""


@pytest.mark.slow  # a TensorFlow server per case: ~15 s each
@pytest.mark.parametrize("stuck", ["watcher", "call"])
def test_mitt_serve_exits_within_its_grace_and_margin_whatever_is_stuck(
    stuck: str, model_versions: list[tuple[Path, Path, str]], tmp_path: Path
) -> None:
    """The issue's setup (``--watch ROOT --host localhost --processes 1``): a load in progress,
    or a call that ignores its cancellation, would hold the process at its exit (the watcher is
    joined, the interpreter joins the request threads)."""
    (model_1, index_1, _), (model_2, index_2, _) = model_versions
    root = tmp_path / "live"
    publish_deployment(model_1, index_1, root)
    port, grace = free_port(), 1.0
    argv = ["--watch", str(root), "--watch-interval", "0.1", "--host", "localhost", "--port", str(port)]
    argv += ["--processes", "1", "--grace", str(grace), "--engine", "python"]  # its threads and loads
    log = tmp_path / "server.log"
    process = start([sys.executable, "-c", SERVE_CLI, stuck, *argv], log, f"127.0.0.1:{port}")
    history = list(read_model_vocab(model_1).ids[:3])
    with RetrievalClient(f"localhost:{port}", timeout=120, retries=0) as client:
        if stuck == "watcher":
            publish_deployment(model_2, index_2, root)
            marker = "loading a new version, forever"
        else:
            request = request_from_query(Query(history, 7))
            future = client._stub.Retrieve.future(request, timeout=120)  # left in flight
            marker = "a call that never returns"
        deadline = time.monotonic() + 60
        while marker not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        took = stop_time(process, grace + 2 * STOP_MARGIN + SLACK)
        if stuck == "call":
            future.cancel()
    text = log.read_text()
    assert process.returncode == 0, text
    assert "server stopped" in text and took >= grace
