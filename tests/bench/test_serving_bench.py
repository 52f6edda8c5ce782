"""bench.serving's native engine row: its targets read from hand-made rows (each side of each
bound), the table's RSS column and verdicts (none for a row not measured), and ``--rows``."""

from __future__ import annotations

from typing import Any

import pytest

from bench import serving


def row(
    server: str, concurrency: int, qps: float, p99: float, cpu: float = 0.5, rss: float = 0.0
) -> dict[str, Any]:
    return {
        "server": server,
        "concurrency": concurrency,
        "qps": qps,
        "p50_ms": p99 / 2,
        "p90_ms": p99 * 0.9,
        "p99_ms": p99,
        "errors": 0,
        "server_cpu_ms": cpu,
        "client_cpu_ms": 0.2,
        "server_memory": {"rss_mb": rss, "pss_mb": rss} if rss else None,
    }


ROWS = [
    row("echo", 32, 5000, 10),
    row(serving.RETRIEVAL, 32, 1000, 40, 1.0, rss=1400),
    row(serving.NATIVE, 1, 500, 1.5),  # p99 <= 2 ms: met
    row(serving.NATIVE, 8, 1500, 6.0),  # p99 > 5 ms: not met
    row(serving.NATIVE, 32, 3100, 9.0, cpu=0.5, rss=1300),  # 3.1x python, 0.62x echo; CPU > 0.4
]


def test_the_native_targets_are_read_from_the_rows() -> None:
    checks = serving.checks(ROWS)
    assert checks["native_qps_over_python_at_32"] == 3.1 and checks["native_qps_over_python_at_32_ok"]
    assert checks["native_qps_over_echo_at_32"] == 0.62 and checks["native_qps_over_echo_at_32_ok"]
    assert checks["native_p99_at_32_ms_ok"] and checks["native_p99_at_1_ms_ok"]
    assert checks["native_p99_at_8_ms"] == 6.0 and not checks["native_p99_at_8_ms_ok"]
    assert checks["native_server_cpu_at_32_ms"] == 0.5 and not checks["native_server_cpu_at_32_ms_ok"]
    assert checks["native_rss_over_python"] == round(1300 / 1400, 3) and checks["native_rss_over_python_ok"]
    slower = [
        r if r["concurrency"] != 32 or r["server"] != serving.NATIVE else {**r, "qps": 2900} for r in ROWS
    ]
    assert not serving.checks(slower)["native_qps_over_python_at_32_ok"]  # 2.9x < 3x
    # (python 1.0 + client 0.2) / (native 0.5 + 0.2); (echo 0.5 + 0.2) / (native 0.5 + 0.2)
    assert checks["native_cpu_bound_over_python_at_32"] == round(1.2 / 0.7, 3)
    assert checks["native_cpu_bound_over_echo_at_32"] == 1.0


def test_without_a_native_row_there_is_no_native_verdict() -> None:
    assert not [key for key in serving.checks(ROWS[:2]) if key.startswith("native_")]


def test_the_table_has_rss_and_the_native_verdicts() -> None:
    results = {
        "items": 1_000_000,
        "num_interests": 4,
        "k": 50,
        "index": "L2MIPS,IVF4096,Flat nprobe=8",
        "index_recall": 0.99,
        "cpus": 2,
        "date": "2026-12-06",
        "load_average": (0.5, 0.5, 0.5),
        "rows": ROWS,
        "checks": serving.checks(ROWS),
        "compute_ms_per_request_at_32": 0.4,
    }
    text = serving.table(results)
    assert f"| {serving.NATIVE} | 32 | 3,100 | 4.50 | 8.10 | 9.00 | 0 | 0.50 | 0.20 | 1,300 |" in text
    assert f"{serving.NATIVE}: p99_at_8_ms = 6.0 (target <= 5.0: NOT met)" in text
    assert f"{serving.NATIVE}: qps_over_python_at_32 = 3.1 (target >= 3.0: met)" in text
    assert f"{serving.RETRIEVAL}: p99 at concurrency 1" in text  # measured (at 32)
    # Rows --rows left out get no verdict (they printed "None ... NOT met").
    assert serving.RETRIEVAL_XLA not in text and "rerank" not in text
    assert (
        "bounded by CPU (cores / (server + client CPU ms per request)) = 1.714 x the Python engine's" in text
    )


def test_rows_keeps_the_servers_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    assert serving.parse_args(["--rows", "echo", "native"]).rows == ["echo", "native"]
    assert serving.parse_args([]).rows == list(serving.ROWS)
    with pytest.raises(SystemExit):
        serving.parse_args(["--rows", "nothing"])
    assert "invalid choice" in capsys.readouterr().err
