"""``mitt serve``'s settings through the configuration mechanism: a :class:`ServerConfig` from the
defaults, ``--config FILE``, the flags (each a shortcut onto a field, with its old name, default
and meaning) and ``--set``; ``--print-config`` round-trips through ``--config``."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from retrieval.api import DEFAULT_MAX_REQUEST_BYTES
from retrieval.cli import serve as serve_cli
from retrieval.config import config_to_json, field_types
from retrieval.serving.config import ServerConfig

OLD_DEFAULTS: dict[str, Any] = {
    "watch_interval": 2.0,
    "host": "127.0.0.1",
    "port": 50051,
    "threads": 64,
    "max_batch": 32,
    "max_wait_ms": 0.0,
    "search_threads": 1,
    "grace": 5.0,
    "drain": 0.0,
    "max_request_mb": DEFAULT_MAX_REQUEST_BYTES / 2**20,
    "max_queued": 0,
    "cheap_cost": 16.0,
    "max_cost": 64.0,
    "max_waiting": 2,
    "max_memory_mb": 0.0,
    "rate_limit": 0.0,
    "rate_burst": None,
    "access_log_sample": 0.0,
    "access_log_user_ids": False,
    "health_port": 0,
    "reflection": True,  # --no-reflection not given
    "metrics_port": 0,
    "metrics_host": "127.0.0.1",
    "log_format": "text",
    "xla": False,
    "engine": "auto",  # --engine came later (issue 44): native where built, else Python
    "model": None,
    "index": None,
    "watch": None,
    "access_file": None,
    "metrics_auth_file": None,
    "metrics_auth_env": None,
    "tls_cert": None,
    "tls_key": None,
    "tls_ca": None,
}
"""Each flag's default at f5914f2, before the flags stood for fields (its ``--help``), by dest."""

GIVEN: dict[str, tuple[list[str], Any]] = {
    "model": (["--model", "m2"], "m2"),
    "index": (["--index", "i2"], "i2"),
    "watch": (["--watch", "live"], "live"),
    "watch_interval": (["--watch-interval", "0.5"], 0.5),
    "xla": (["--xla"], True),
    "engine": (["--engine", "native"], "native"),
    "host": (["--host", "0.0.0.0"], "0.0.0.0"),
    "port": (["--port", "0"], 0),
    "processes": (["--processes", "3"], 3),
    "threads": (["--threads", "8"], 8),
    "search_threads": (["--search-threads", "2"], 2),
    "grace": (["--grace", "1.5"], 1.5),
    "drain": (["--drain", "3"], 3.0),
    "log_format": (["--log-format", "json"], "json"),
    "max_batch": (["--max-batch", "1"], 1),
    "max_wait_ms": (["--max-wait-ms", "2.5"], 2.5),
    "max_request_mb": (["--max-request-mb", "1"], 1.0),
    "max_queued": (["--max-queued", "5"], 5),
    "cheap_cost": (["--cheap-cost", "8"], 8.0),
    "max_cost": (["--max-cost", "256"], 256.0),
    "max_waiting": (["--max-waiting", "0"], 0),
    "max_memory_mb": (["--max-memory-mb", "4096"], 4096.0),
    "access_file": (["--access-file", "access.toml"], "access.toml"),
    "rate_limit": (["--rate-limit", "5", "--rate-burst", "2"], 5.0),
    "rate_burst": (["--rate-limit", "5", "--rate-burst", "2"], 2.0),
    "access_log_sample": (["--access-log-sample", "0.5"], 0.5),
    "access_log_user_ids": (["--access-log-sample", "0.5", "--access-log-user-ids"], True),
    "health_port": (["--health-port", "8081"], 8081),
    "reflection": (["--no-reflection"], False),
    "metrics_port": (["--metrics-port", "9090"], 9090),
    "metrics_host": (["--metrics-host", "0.0.0.0"], "0.0.0.0"),
    "metrics_auth_file": (["--metrics-port", "9090", "--metrics-auth-file", "creds"], "creds"),
    "metrics_auth_env": (["--metrics-port", "9090", "--metrics-auth-env", "CREDS"], "CREDS"),
    "tls_cert": (["--tls-cert", "s.pem", "--tls-key", "s.key"], "s.pem"),
    "tls_key": (["--tls-cert", "s.pem", "--tls-key", "s.key"], "s.key"),
    "tls_ca": (["--tls-cert", "s.pem", "--tls-key", "s.key", "--tls-ca", "ca.pem"], "ca.pem"),
}
"""Per flag dest, a command line giving it (with what it needs) and the value its field takes."""

ARTIFACTS = ["--model", "m", "--index", "i"]


def field(config: ServerConfig, key: str) -> Any:
    return functools.reduce(getattr, key.split("."), config)


def printed(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What ``mitt serve ARGV --print-config`` prints (its exit code checked)."""
    assert serve_cli.main([*argv, "--print-config"]) == 0
    return capsys.readouterr().out


def test_every_flag_keeps_its_default_and_sets_its_field() -> None:
    assert set(serve_cli.FLAG_FIELDS) == set(OLD_DEFAULTS) | {"processes"} == set(GIVEN)
    default = ServerConfig()
    for dest, key in serve_cli.FLAG_FIELDS.items():
        if dest != "processes":  # None: one per core, as the flag's default always was
            assert field(default, key) == OLD_DEFAULTS[dest], dest
        args, value = GIVEN[dest]
        config, _ = serve_cli.parse_args(args if dest == "watch" else [*ARTIFACTS, *args])
        assert field(config, key) == value, dest
    config, _ = serve_cli.parse_args([*ARTIFACTS, "--ranker", "a", "--ranker", "b"])
    assert config.rankers == ("a", "b")
    with pytest.warns(FutureWarning, match="--workers is deprecated"):
        config, _ = serve_cli.parse_args([*ARTIFACTS, "--workers", "12"])
    assert config.threads == 12


def test_every_field_but_the_internal_bounds_has_a_flag() -> None:
    def keys(cls: type, prefix: str = "") -> set[str]:
        found = set()
        for name, annotation in field_types(cls).items():
            is_section = isinstance(annotation, type) and dataclasses.is_dataclass(annotation)
            found |= keys(annotation, f"{prefix}{name}.") if is_section else {prefix + name}
        return found

    flagged = set(serve_cli.FLAG_FIELDS.values()) | {"rankers"}
    internal = {"max_response_mb", "batch_cost", "cheap_bytes", "heavy_wait", "chunk_cost"}
    assert keys(ServerConfig) - flagged == {f"limits.{name}" for name in internal}


def test_print_config_round_trips_through_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        *ARTIFACTS,
        "--ranker",
        "r1",
        "--ranker",
        "r2",
        "--port",
        "0",
        "--threads",
        "8",
        "--no-reflection",
    ]
    argv += [
        "--rate-limit",
        "5",
        "--access-log-sample",
        "0.25",
        "--access-log-user-ids",
        "--max-wait-ms",
        "1",
    ]
    argv += ["--tls-cert", "s.pem", "--tls-key", "s.key", "--set", "limits.chunk_cost=32", "--processes", "2"]
    text = printed(argv, capsys)
    resolved = json.loads(text)
    assert resolved["rankers"] == ["r1", "r2"] and resolved["access"]["reflection"] is False
    assert resolved["limits"]["chunk_cost"] == 32.0 and resolved["processes"] == 2
    for name, dump in (("server.json", json.dumps), ("server.yaml", yaml.safe_dump)):
        (tmp_path / name).write_text(dump(resolved))
        assert printed(["--config", str(tmp_path / name)], capsys) == text, name
    defaults = printed([], capsys)  # no folder needed to print
    assert json.loads(defaults) == json.loads(config_to_json(ServerConfig()))
    (tmp_path / "defaults.json").write_text(defaults)
    assert printed(["--config", str(tmp_path / "defaults.json")], capsys) == defaults


def test_the_layers_apply_in_order(tmp_path: Path) -> None:
    """Defaults, then the file (partial), then the flags, then every --set."""
    file = tmp_path / "server.yaml"
    file.write_text("threads: 8\nbatching:\n  max_batch: 4\naccess:\n  rate_limit: 10\n")
    config, _ = serve_cli.parse_args(["--config", str(file), *ARTIFACTS, "--threads", "16"])
    assert (config.threads, config.batching.max_batch, config.access.rate_limit) == (16, 4, 10.0)
    config, _ = serve_cli.parse_args(
        ["--config", str(file), *ARTIFACTS, "--threads", "16", "--set", "threads=32"]
    )
    assert (config.threads, config.batching.max_wait_ms, config.port) == (32, 0.0, 50051)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--threads", "0"], "error: --threads 0: must be >= 1"),
        (["--set", "batching.max_batch=300"], "error: batching.max_batch=300: must be in [1, 256]"),
        (["--access-log-sample", "1.5"], "error: --access-log-sample 1.5: must be in [0, 1]"),
        (["--port", "70000"], "error: --port 70000: must be in [0, 65535]"),
        (["--set", "tls.pem=x"], "error: unknown field 'tls.pem'"),
    ],
)
def test_a_setting_out_of_its_range_is_one_line_naming_it(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert serve_cli.main([*ARTIFACTS, *argv]) == 2
    assert capsys.readouterr().err.startswith(line)


def test_the_files_a_config_file_names_must_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Named by the key they came from (the file's), or by the flag."""
    file = tmp_path / "server.json"
    file.write_text(json.dumps({"model": str(tmp_path), "index": str(tmp_path / "nope")}))
    assert serve_cli.main(["--config", str(file)]) == 2
    assert capsys.readouterr().err == f"error: index {tmp_path / 'nope'}: no such file or directory\n"
    assert serve_cli.main(["--config", str(file), "--index", str(tmp_path / "gone")]) == 2
    assert capsys.readouterr().err == f"error: --index {tmp_path / 'gone'}: no such file or directory\n"


def test_rankers_are_a_list_of_paths_in_every_layer(tmp_path: Path) -> None:
    """``tuple[str, ...]``: repeated flags, a file's list, ``--set`` as text split at commas or
    as a JSON list (a path with a comma in it)."""
    file = tmp_path / "server.yaml"
    file.write_text("rankers: [from-file]\n")
    for argv, rankers in (
        (["--config", str(file)], ("from-file",)),
        (["--config", str(file), "--ranker", "a"], ("a",)),
        (["--set", "rankers=a, b"], ("a", "b")),
        (["--set", 'rankers=["x,y"]'], ("x,y",)),
        (["--set", "rankers="], ()),
    ):
        assert serve_cli.parse_args([*ARTIFACTS, *argv])[0].rankers == rankers, argv
    with pytest.raises(ValueError, match="rankers: expected a JSON list of strings"):
        serve_cli.parse_args([*ARTIFACTS, "--set", "rankers=[1]"])
    file.write_text("rankers: [1]\n")
    with pytest.raises(ValueError, match="rankers"):
        serve_cli.parse_args([*ARTIFACTS, "--config", str(file)])
