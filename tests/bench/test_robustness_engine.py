"""``python -m bench.robustness --engine``: every server a case starts is started with the engine
asked for (fuzz, soak, deploys, abuse, group), and a short fuzz of the native engine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import bench.robustness.abuse as abuse
import bench.robustness.deploys as deploys
import bench.robustness.processes as processes
import bench.robustness.soak as soak
import bench.robustness.workers as workers
from bench.robustness import (
    FUZZ_MAX_MESSAGE_BYTES,
    SYNTHETIC_ATTRIBUTES,
    FuzzClient,
    Version,
    parse_args,
    run_fuzz,
    served_by,
    synthetic_retriever,
)
from bench.robustness.server import SYNTHETIC_VERSION, create_engine_server, fuzzed_config
from retrieval.api import RetrievalClient
from retrieval.api.v1 import retrieval_pb2
from retrieval.serving.config import Engine
from retrieval.serving.native_server import NativeRetrievalServer
from retrieval.serving.server import RetrievalServer
from tests.serving.helpers import built

VERSION = Version(Path("/nowhere/model"), Path("/nowhere/index"), "v1")
CHEAP = [retrieval_pb2.RetrieveRequest(history=[str(i), str(i + 1)], k=5) for i in range(16)]


class Started(Exception):
    """Raised where a server would start, once its command line is recorded."""


def engine_of(command: list[str]) -> str:
    """The value of the one ``--engine`` flag of ``command``."""
    assert command.count("--engine") == 1, command
    return command[command.index("--engine") + 1]


def recorder(into: list[list[str]]) -> Callable[..., Any]:
    """A stand-in for what starts a server: records its command line, then raises :class:`Started`."""

    def record(*args: Any, **kwargs: Any) -> Any:
        into.append([str(a) for a in (args[-1] if isinstance(args[-1], list) else args)])
        raise Started

    return record


@pytest.mark.parametrize("engine", ["python", "native"])
def test_the_command_line_chooses_the_engine(engine: str) -> None:
    assert parse_args(["--fuzz", "5", "--engine", engine]).engine == engine
    assert parse_args(["--group"]).engine == "python"


def test_the_watching_server_is_started_with_the_engine(monkeypatch, tmp_path: Path) -> None:
    commands: list[list[str]] = []
    monkeypatch.setattr(processes.subprocess, "Popen", recorder(commands))
    with pytest.raises(Started):
        processes.start_watching_server(tmp_path, tmp_path / "log", 1.0, engine="native")
    assert commands[0][1].endswith("serve.py") and "--watch" in commands[0]
    assert engine_of(commands[0]) == "native"


@pytest.mark.parametrize("engine", ["python", "native"])
def test_soak_and_deploys_start_their_watching_servers_with_the_engine(
    monkeypatch, tmp_path: Path, engine: str
) -> None:
    engines: list[str] = []

    def watching(*args: Any, engine: str) -> Any:
        engines.append(engine)
        raise Started

    monkeypatch.setattr(soak, "run_tool_process", lambda *args: "")
    monkeypatch.setattr(soak, "start_watching_server", watching)
    monkeypatch.setattr(deploys, "start_watching_server", watching)
    with pytest.raises(Started):
        soak.run_soak([VERSION, VERSION], CHEAP, 1.0, tmp_path, engine=engine)
    with pytest.raises(Started):
        deploys.restart(tmp_path, tmp_path / "log", VERSION, ["1"], engine)
    assert engines == [engine, engine]


def test_every_abuse_case_serves_with_the_engine(monkeypatch) -> None:
    commands: list[list[str]] = []
    monkeypatch.setattr(abuse, "start", recorder(commands))
    cases: list[Callable[[], Any]] = [
        lambda: abuse.oversized_burst(VERSION, "native"),
        lambda: abuse.heavy_flood(VERSION, "native", CHEAP, 1.0, 2048.0),
        lambda: abuse.medium_burst(VERSION, "native", CHEAP),
        lambda: abuse.deadline_expiry(VERSION, "native", CHEAP),
        lambda: abuse.costly_flood(VERSION, "native", CHEAP, 1.0, "diversity"),
        lambda: abuse.costly_flood(VERSION, "native", CHEAP, 1.0, "exclusions"),
        lambda: abuse.invalid_mixed(VERSION, "native", CHEAP, 1.0),
        lambda: abuse.refusals_visible(VERSION, "native", CHEAP),
    ]
    for case in cases:
        with pytest.raises(Started):
            case()
    assert len(commands) == len(cases)
    assert [engine_of(c) for c in commands] == ["native"] * len(cases)
    assert all(c[0] == "tools/serve.py" and "--processes" in c for c in commands)


def test_every_group_case_serves_with_the_engine(monkeypatch, tmp_path: Path) -> None:
    commands: list[list[str]] = []

    class Group:
        def __init__(self, folder: Path, *args: str, **kwargs: Any) -> None:
            self.command = processes.tool_command("serve", "--processes", "2", *args)

        def __enter__(self) -> Any:
            commands.append(self.command)
            raise Started

        def __exit__(self, *exc: object) -> None:
            raise AssertionError("never entered")

    monkeypatch.setattr(workers, "ServedGroup", Group)
    monkeypatch.setattr(workers, "_history", lambda version: ["1"])
    for case in (
        lambda: workers.killed_worker(VERSION, tmp_path, "native"),
        lambda: workers.stopped_worker(VERSION, tmp_path, "native"),
        lambda: workers.stuck_stop(VERSION, tmp_path, "native", signals=1),
    ):
        with pytest.raises(Started):
            case()
    assert [engine_of(c) for c in commands] == ["native"] * 3


@pytest.mark.parametrize(("engine", "kind"), [("python", RetrievalServer), ("native", NativeRetrievalServer)])
def test_the_fuzzed_server_is_the_engine_asked_for(engine: Engine, kind: type) -> None:
    if engine == "native":
        built()
    server, port = create_engine_server(synthetic_retriever(), fuzzed_config(FUZZ_MAX_MESSAGE_BYTES, engine))
    try:
        assert isinstance(server, kind)
        with RetrievalClient(f"127.0.0.1:{port}", timeout=30) as client:
            assert client.model_info().model_version == SYNTHETIC_VERSION
    finally:
        server.stop(None)


@pytest.mark.slow  # 4 s on a quiet machine, up to 20 s on a loaded 2-core one
def test_a_short_fuzz_of_the_native_engine_finds_no_violation() -> None:
    """200 generated calls, checked as ``python -m bench.robustness --engine native`` checks them
    (the Python engine's are in ``tests/serving/test_fuzz_rpc.py``)."""
    built()
    retriever = synthetic_retriever()
    server, port = create_engine_server(retriever, fuzzed_config(FUZZ_MAX_MESSAGE_BYTES, "native"))
    try:
        client = FuzzClient(f"127.0.0.1:{port}")
        client.wait_ready(30)
        report = run_fuzz(client, served_by(retriever, SYNTHETIC_ATTRIBUTES), 200)
        client.close()
    finally:
        server.stop(None)
    assert sum(report.counts.values()) == 200
    assert report.violations == [] and report.probe_failures == 0
    assert {code for _, code in report.counts} >= {"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"}


def test_the_native_engine_is_refused_when_not_built(monkeypatch, capsys) -> None:
    import retrieval.serving as serving

    def missing() -> Any:
        raise serving.NativeEngineMissing("the native engine is not built: run make native")

    monkeypatch.setattr(serving, "native_module", missing)  # the name bench.robustness imports
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--engine", "native"])
    assert exit_info.value.code == 2
    assert "run make native" in capsys.readouterr().err
