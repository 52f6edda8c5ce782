"""``mitt serve --engine native`` (issue 44, stage 3): the options it refuses at start and the line
it prints without the engine built (exit code 2, no build needed), then, with ``make native``,
the served engine in a child process as users start it: its answers equal the Python engine's,
SIGTERM drains and exits 0, hot reload under load fails no call, and a native serving group
replaces a killed worker while the other keeps SERVING."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest

from bench.robustness.workers import UP, Availability, alive, probe
from bench.robustness.workers import ServedGroup as Group
from bench.serving import free_port
from retrieval.api.client import RetrievalClient
from retrieval.api.types import MergeStrategy, Query
from retrieval.api.v1 import retrieval_pb2, retrieval_pb2_grpc
from retrieval.artifacts.deployment import publish_deployment
from retrieval.artifacts.model import read_model_vocab
from retrieval.cli import serve
from retrieval.serving import native
from retrieval.serving.native_metrics import SYNC_INTERVAL
from retrieval.serving.retriever import Retriever
from retrieval.serving.stopping import STOP_MARGIN
from tests.helpers import REPO_ROOT, connected, scrape, serving
from tests.serving.helpers import built, refusal, wait_until_started

SLACK = 30.0
"""Seconds a loaded 2-core machine may add to a bound (process start-up aside)."""


@pytest.fixture
def folders(tmp_path: Path) -> list[str]:
    """``--model M --index I`` naming folders that exist (the refusals come before any load)."""
    for name in ("model", "index"):
        (tmp_path / name).mkdir()
    return ["--model", str(tmp_path / "model"), "--index", str(tmp_path / "index")]


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (["--threads", "8"], "--threads (threads)"),
        (["--set", "threads=8"], "--threads (threads)"),
    ],
)
def test_options_the_native_engine_lacks_are_refused_at_start_in_one_line(
    given: list[str], named: str, folders: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit code 2 and one line naming the option and ``--engine python``, before any load
    (the folders are empty), whether the engine is built or not."""
    file = tmp_path / "file"
    file.write_text("")
    argv = [*folders, "--engine", "native", *(a.replace("{file}", str(file)) for a in given)]
    assert serve.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"error: the native engine does not implement {named} yet: serve with --engine python"]
    # The same options with the Python engine go on to load the (empty) model folder.
    assert "does not implement" not in _python_engine_error(folders, given, file, capsys)


def _python_engine_error(
    folders: list[str], given: list[str], file: Path, capsys: pytest.CaptureFixture[str]
) -> str:
    argv = [*folders, "--engine", "python", *(a.replace("{file}", str(file)) for a in given)]
    assert serve.main(argv) == 2  # the empty model folder
    return capsys.readouterr().err


@pytest.mark.parametrize("how", ["flag", "set", "config"])
def test_without_the_engine_built_native_exits_2_naming_make_native_and_the_packages(
    how: str,
    folders: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The compiled module made unimportable: ``--engine native``, ``--set engine=native`` and a
    config file's ``engine: native`` all end with one line saying what to run."""
    monkeypatch.setitem(sys.modules, "retrieval.serving._native", None)  # as if never built
    config = tmp_path / "server.yaml"
    config.write_text("engine: native\n")
    chosen = {
        "flag": ["--engine", "native"],
        "set": ["--set", "engine=native"],
        "config": ["--config", str(config)],
    }
    assert serve.main([*folders, *chosen[how]]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: the native engine is not built (")
    assert "run `make native`" in line and " ".join(native.PACKAGES) in line


def test_auto_is_native_where_built_and_python_otherwise_saying_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``auto`` (the default) falls back to the Python engine, with a log line naming the reason,
    when an option the native engine lacks is set or the engine is not built; ``python`` and
    ``native`` are kept as asked."""
    from retrieval.serving.config import ServerConfig

    assert ServerConfig().engine == "auto"
    with caplog.at_level("INFO", logger=native.__name__):
        assert native.choose_engine(ServerConfig(threads=8)).engine == "python"
    assert "the native engine does not implement --threads (threads)" in caplog.text
    assert native.choose_engine(ServerConfig(engine="python")).engine == "python"
    with pytest.raises(ValueError, match="--threads"):
        native.choose_engine(ServerConfig(engine="native", threads=8))
    monkeypatch.setitem(sys.modules, "retrieval.serving._native", None)  # as if never built
    caplog.clear()
    with caplog.at_level("INFO", logger=native.__name__):
        assert native.choose_engine(ServerConfig()).engine == "python"
    assert "the native engine is not built" in caplog.text and "make native" in caplog.text
    with pytest.raises(native.NativeEngineMissing):
        native.choose_engine(ServerConfig(engine="native"))


def test_auto_is_native_where_built() -> None:
    from retrieval.serving.config import ServerConfig

    built()
    assert native.choose_engine(ServerConfig()).engine == "native"
    assert native.choose_engine(ServerConfig(engine="native")).engine == "native"


def test_mitt_serve_without_the_build_goes_on_with_the_python_engine(
    folders: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No ``--engine``, no build: not the native engine's refusal but the Python engine's start,
    which then finds the (empty) model folder."""
    monkeypatch.setitem(sys.modules, "retrieval.serving._native", None)
    assert serve.main([*folders, "--processes", "1"]) == 2
    err = capsys.readouterr().err
    assert "the Python engine serves (--engine auto): the native engine is not built" in err
    assert "error: " in err and "make native" not in err.split("error: ", 1)[1]


def test_every_refused_option_is_a_flag_of_mitt_serve(capsys: pytest.CaptureFixture[str]) -> None:
    """The refusals name flags that exist (one per field the engine lacks)."""
    from retrieval.serving.config import ServerConfig

    with pytest.raises(SystemExit):
        serve.parse_args(["--help"])
    text = capsys.readouterr().out
    for option in native._not_native(ServerConfig()):
        assert option.split()[0] in text, option


# --- the engine served, in child processes -----------------------------------------------------------


@contextmanager
def served(tmp_path: Path, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """``tools/serve.py --engine native --processes 1 ARGS`` on a free port, once SERVING:
    the process, its address and its log; killed if still running at the end."""
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    command = [
        sys.executable,
        str(REPO_ROOT / "tools" / "serve.py"),
        "--engine",
        "native",
        "--processes",
        "1",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, "--port", str(port), *args],
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
    address = f"127.0.0.1:{port}"
    try:
        wait_until_started(process, address, log)
        yield process, address, log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def stop(process: subprocess.Popen[bytes], bound: float) -> float:
    """SIGTERM, then the seconds until ``process`` exited (within ``bound``)."""
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    process.wait(bound)
    return time.monotonic() - started


@pytest.mark.slow  # a TensorFlow process started and stopped: ~15 s
def test_mitt_serve_engine_native_answers_as_the_python_engine_and_stops_on_sigterm(
    model_versions: list[tuple[Path, Path, str]], tmp_path: Path
) -> None:
    """Plain, filtered and batched requests, unknown ids and a bad one answer as the Python engine
    (in this process, same folders) answers them; GetModelInfo names the version; SIGTERM with a
    drain: NOT_SERVING while calls are still answered, then exit 0 within drain + grace."""
    built()
    (model_dir, index_dir, version), _ = model_versions
    ids = list(read_model_vocab(model_dir).ids)
    merges = list(MergeStrategy)
    queries = [
        Query(
            ids[i : i + 1 + i % 5] + (["unknown"] if i % 4 == 0 else []),
            k=1 + i % 9,
            merge=merges[i % 3],
            diversity_lambda=0.5 if i % 3 == 2 else 0.0,
            exclude=ids[-3:] if i % 5 == 0 else (),
            allow=ids[10:30] if i % 7 == 0 else (),
        )
        for i in range(40)
    ]
    python = Retriever.from_dirs(model_dir, index_dir)
    with serving(python) as address, RetrievalClient(address) as client:
        expected = [client.retrieve(query) for query in queries]
        expected_batch = client.batch_retrieve(queries[:8])
    drain, grace, metrics_port = 2.0, 3.0, free_port()
    args = ["--model", str(model_dir), "--index", str(index_dir), "--metrics-port", str(metrics_port)]
    args += ["--drain", str(drain), "--grace", str(grace)]
    with served(tmp_path, *args) as (process, address, log), connected(address, retries=0) as client:
        for query, want in zip(queries, expected, strict=True):
            got = client.retrieve(query)
            assert [(i, n) for i, _, n in got.items] == [(i, n) for i, _, n in want.items]
            np.testing.assert_allclose([s for _, s, _ in got.items], [s for _, s, _ in want.items], rtol=1e-5)
            assert got.unknown_items == want.unknown_items and got.model_version == version
        batch = client.batch_retrieve(queries[:8])
        assert [[i for i, _, _ in r.items] for r in batch] == [
            [i for i, _, _ in r.items] for r in expected_batch
        ]
        assert client.model_info().model_version == version
        with pytest.raises(Exception, match="k must be"):
            client.retrieve(ids[:2], k=0)
        samples = scrape(metrics_port)
        for method, code, calls in [
            ("Retrieve", "OK", 40),
            ("BatchRetrieve", "OK", 1),
            ("GetModelInfo", "OK", 1),
            ("Retrieve", "INVALID_ARGUMENT", 1),
        ]:
            assert samples[("retrieval_requests_total", (("code", code), ("method", method)))] == calls
        assert samples[("retrieval_model_info", (("model_version", version),))] == 1
        assert f"(model {version}) on 127.0.0.1" in log.read_text() and "(native engine)" in log.read_text()
        # A plain channel (RetrievalClient's checks health: it would stop sending once NOT_SERVING).
        with grpc.insecure_channel(address) as channel:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)  # type: ignore[no-untyped-call]
            request = retrieval_pb2.RetrieveRequest(history=ids[:3], k=5)
            assert stub.Retrieve(request, timeout=10).items
            process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + SLACK
            while probe(address) != "NOT_SERVING":  # the drain: NOT_SERVING at once...
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert len(stub.Retrieve(request, timeout=10).items) == 5  # ...and still answering
            assert process.poll() is None
        process.wait(drain + grace + STOP_MARGIN + SLACK)
        assert process.returncode == 0, log.read_text()
    text = log.read_text()
    assert "SIGTERM received, stopping (drain 2.0 s, grace 3.0 s)" in text and "server stopped" in text


@pytest.mark.slow  # a native group of two TensorFlow processes: ~30 s
def test_a_native_group_serves_access_control_from_the_flags(
    model_versions: list[tuple[Path, Path, str]], tmp_path: Path
) -> None:
    """``--processes 2`` with an access file, a rate limit, reflection, the plaintext health port
    and the access log: each worker checks tokens, permissions and its own buckets, the group's
    metrics count the refusals by identity, the health port answers, lines are logged."""
    built()
    (model_dir, index_dir, _), _ = model_versions
    ids = list(read_model_vocab(model_dir).ids)
    access_file = tmp_path / "access.toml"
    access_file.write_text(
        '[identities.reader]\ntokens = ["token-r"]\npermissions = ["info"]\n'
        '[identities.team]\ntokens = ["token-t"]\npermissions = ["retrieve", "info"]\n'
    )
    metrics_port, health_port = free_port(), free_port()
    args = ["--model", str(model_dir), "--index", str(index_dir), "--processes", "2"]
    args += ["--access-file", str(access_file), "--rate-limit", "1000", "--access-log-sample", "1"]
    args += ["--metrics-port", str(metrics_port), "--health-port", str(health_port)]
    with served(tmp_path, *args) as (process, address, log):
        assert probe(f"127.0.0.1:{health_port}") == "SERVING"
        with RetrievalClient(address, retries=0, token="token-t") as team:
            for i in range(10):
                assert len(team.retrieve(ids[i : i + 3], 5).items) == 5
        with RetrievalClient(address, retries=0, token="token-r") as reader:
            assert reader.model_info().model_version
            for _ in range(3):
                with pytest.raises(grpc.RpcError) as denied:
                    reader.retrieve(ids[:3], 5)
                assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with (
            RetrievalClient(address, retries=0, token="nobody") as stranger,
            pytest.raises(grpc.RpcError) as refused,
        ):
            stranger.model_info()
        assert refused.value.details() == "invalid bearer token"
        time.sleep(2 * SYNC_INTERVAL)  # the workers' counts moved to the group's files
        samples = scrape(metrics_port)
        assert samples[refusal("PERMISSION_DENIED", "permission", identity="reader")] == 3
        assert samples[("retrieval_requests_total", (("code", "OK"), ("method", "Retrieve")))] == 10
        stop(process, STOP_MARGIN + SLACK)
    lines = [line for line in log.read_text().splitlines() if "method=Retrieve" in line]
    assert sum("identity=team" in line and "code=OK" in line for line in lines) == 10, lines


class Callers:
    """``count`` threads calling ``Retrieve`` on ``address`` back to back, one connection each and
    no client retries, each answer's model version appended to its list in :attr:`seen`."""

    def __init__(self, address: str, history: list[str], count: int = 4) -> None:
        self.seen: list[list[str]] = [[] for _ in range(count)]
        self.errors: list[Exception] = []
        self._done = threading.Event()
        self._threads = [threading.Thread(target=self._call, args=(a, address, history)) for a in self.seen]

    def __enter__(self) -> Callers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        for thread in self._threads:
            thread.join()

    def _call(self, answers: list[str], address: str, history: list[str]) -> None:
        with RetrievalClient(address, retries=0) as client:
            while not self._done.is_set():
                try:
                    answers.append(client.retrieve(history, 5).model_version)
                except Exception as e:  # any failure fails the test
                    self.errors.append(e)

    @property
    def calls(self) -> int:
        return sum(map(len, self.seen))

    def wait_for(self, calls: int, alive: subprocess.Popen[bytes], log: Path) -> None:
        """Until ``calls`` in all were answered (the server still running)."""
        deadline = time.monotonic() + 120
        while self.calls < calls:
            assert time.monotonic() < deadline and alive.poll() is None, log.read_text()
            time.sleep(0.02)

    def moved(self, old: str, new: str) -> None:
        """No call failed; each caller saw ``old``, then only ``new``."""
        assert not self.errors, self.errors[:3]
        for answers in self.seen:
            assert answers[0] == old and answers[-1] == new, (answers[0], answers[-1])
            assert set(answers[answers.index(new) :]) == {new}


def reload_under_load(
    address: str,
    root: Path,
    process: subprocess.Popen[bytes],
    log: Path,
    versions: list[tuple[Path, Path, str]],
) -> int:
    """Publishes the second version under 4 callers' load until every caller has seen it and
    40 more calls were answered; checks no call failed and each moved once. Returns the calls
    answered."""
    (model_1, _, v1), (model_2, index_2, v2) = versions
    with Callers(address, list(read_model_vocab(model_1).ids[:5])) as callers:
        callers.wait_for(40, process, log)
        publish_deployment(model_2, index_2, root)
        deadline = time.monotonic() + 120
        while not all(answers and answers[-1] == v2 for answers in callers.seen):
            assert time.monotonic() < deadline and process.poll() is None, log.read_text()
            time.sleep(0.05)
        callers.wait_for(callers.calls + 40, process, log)
    callers.moved(v1, v2)
    with RetrievalClient(address) as client:
        assert client.model_info().model_version == v2
    return callers.calls


@pytest.fixture
def live(model_versions: list[tuple[Path, Path, str]], tmp_path: Path) -> Path:
    """The deployment folder a server watches (``tmp_path/live``), the first version published
    (skips without the engine)."""
    built()
    root = tmp_path / "live"
    publish_deployment(*model_versions[0][:2], root)
    return root


@pytest.mark.slow  # a watched deployment, a version published under load: ~20 s
def test_native_hot_reload_under_load_fails_no_call(
    model_versions: list[tuple[Path, Path, str]], live: Path, tmp_path: Path
) -> None:
    """``--watch`` in one process: the engine follows the deployment watcher's swap."""
    with served(tmp_path, "--watch", str(live), "--watch-interval", "0.05") as (process, address, log):
        reload_under_load(address, live, process, log, model_versions)
        stop(process, 5.0 + STOP_MARGIN + SLACK)
        assert process.returncode == 0, log.read_text()


@pytest.fixture(scope="module")
def native_group(
    model_versions: list[tuple[Path, Path, str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Group, Path, int]]:
    """A native group watching a deployment (the first version published) with a metrics port,
    for the next two tests (a group's start is two TensorFlow processes: ~7 s of CPU): the group,
    the deployment folder and the metrics port. Skips without the engine."""
    built()
    folder = tmp_path_factory.mktemp("native-group")
    live = folder / "live"
    publish_deployment(*model_versions[0][:2], live)
    metrics_port = free_port()
    args = ["--engine", "native", "--watch", str(live), "--watch-interval", "0.05"]
    with Group(folder, *args, "--metrics-port", str(metrics_port)) as group:
        yield group, live, metrics_port


@pytest.mark.slow  # a native group on a watched deployment, a version published under load: ~40 s
def test_a_native_group_reloads_in_two_phases_under_load_failing_no_call(
    model_versions: list[tuple[Path, Path, str]], native_group: tuple[Group, Path, int]
) -> None:
    """``--processes 2 --watch``: every worker loads, then all swap (the supervisor's two phases).
    (The next test kills a worker of the same group, then stops it: exit code 0.)"""
    group, live, metrics_port = native_group
    answered = reload_under_load(group.address, live, group.process, group.log, model_versions)
    v2 = model_versions[1][2]
    assert f"the group now serves model {v2}" in group.log.read_text()
    # The workers' counts, summed by the supervisor (each worker moves its own every second).
    ok = ("retrieval_requests_total", (("code", "OK"), ("method", "Retrieve")))
    deadline = time.monotonic() + SLACK
    while (samples := scrape(metrics_port)).get(ok) != answered:
        assert time.monotonic() < deadline, (samples.get(ok), answered)
        time.sleep(0.2)
    assert samples[("retrieval_model_info", (("model_version", v2),))] == 1
    assert samples[("retrieval_workers", ())] == 2


@pytest.mark.slow  # a native group under load, one of whose workers is killed and replaced: ~40 s
def test_a_killed_worker_of_a_native_group_leaves_it_serving_under_load(
    model_versions: list[tuple[Path, Path, str]], native_group: tuple[Group, Path, int]
) -> None:
    """``--processes 2 --engine native``: kill -9 of one worker; the other keeps SERVING (no
    probe reads NOT_SERVING), no call of 4 health-checked clients fails, the replacement
    serves; SIGTERM stops the group (exit 0, no worker left)."""
    group = native_group[0]
    history = list(read_model_vocab(model_versions[0][0]).ids[:5])
    first = group.workers
    ups = group.log.read_text().count(UP)
    with Availability(group.address, history) as load:
        load.wait_for(ok=40)
        os.kill(first[0], signal.SIGKILL)
        group.wait_for_log(UP, count=ups + 1)
        load.wait_for(load.ok + 40)
        deadline = time.monotonic() + 60
        while load.probes["SERVING"] <= 20 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert not load.failed, load.failed
    assert load.not_serving == 0 and load.probes["SERVING"] > 20, load.probes
    assert load.unreachable <= 2, load.probes
    replaced = group.workers
    assert len(replaced) == 2 and first[1] in replaced and first[0] not in replaced
    assert "(native engine)" in group.log.read_text()
    assert group.stop()[0] == 0
    assert not any(alive(pid) for pid in replaced)
