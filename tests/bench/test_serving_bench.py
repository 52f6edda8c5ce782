"""bench.serving's native engine row: its targets read from hand-made rows (each side of each
bound), the table's RSS column and verdicts (none for a row not measured), ``--rows``, and the
``BatchRetrieve`` measure against a servicer in this process."""

from __future__ import annotations

import asyncio
import os
from concurrent import futures
from typing import Any

import grpc
import pytest

from bench import serving
from retrieval.api.v1 import retrieval_pb2, retrieval_pb2_grpc


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
    assert f"| {serving.NATIVE} | 32 | 3,100 | 4.50 | 8.10 | 9.00 | 0 | 0.500 | 0.200 | 1,300 |" in text
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


def test_the_batch_target_is_read_from_the_native_engines_cpu_per_user() -> None:
    batched = {
        serving.RETRIEVAL: {"server_cpu_ms_per_user": 0.5},
        serving.NATIVE: {"server_cpu_ms_per_user": 0.25},
    }
    checks = serving.batch_checks(batched)
    assert checks == {
        "native_batch_cpu_ms_per_user": 0.25,
        "native_batch_ok": True,
        "native_batch_cpu_over_python": 0.5,
    }
    assert not serving.batch_checks({serving.NATIVE: {"server_cpu_ms_per_user": 0.31}})["native_batch_ok"]
    assert serving.batch_checks({serving.RETRIEVAL: {"server_cpu_ms_per_user": 0.5}}) == {}
    results = {
        "items": 10,
        "num_interests": 4,
        "k": 50,
        "index": "Flat",
        "index_recall": 1.0,
        "cpus": 2,
        "date": "2026-12-06",
        "load_average": (0.5, 0.5, 0.5),
        "rows": ROWS,
        "checks": {**serving.checks(ROWS), **checks},
        "batched": {
            name: {**b, "users": 32, "calls": 9, "errors": 0, "p50_ms_per_user": 0.4}
            for name, b in batched.items()
        },
    }
    text = serving.table(results)
    assert f"{serving.NATIVE}: BatchRetrieve of 32 users, one in flight (9 calls, 0 errors): 0.25 ms" in text
    assert (
        "BatchRetrieve server CPU per user = 0.25 ms (target <= 0.3: met; 0.5 x the Python engine's)" in text
    )


class Batches(serving.EchoServicer):
    """The echo, answering BatchRetrieve too (one response per request), counting the users."""

    users = 0

    def BatchRetrieve(
        self, request: retrieval_pb2.BatchRetrieveRequest, context: grpc.ServicerContext
    ) -> Any:
        Batches.users += len(request.requests)
        return retrieval_pb2.BatchRetrieveResponse(responses=[self.response] * len(request.requests))


@pytest.mark.parametrize("servicer", [Batches, serving.EchoServicer])
def test_batch_load_sends_batches_of_users_and_counts_what_failed(servicer: type) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(servicer(3), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    Batches.users = 0
    sent = [retrieval_pb2.RetrieveRequest(history=[f"item{i}"], k=3) for i in range(5)]
    try:
        out = asyncio.run(serving.batch_load(f"127.0.0.1:{port}", sent, 0.3, os.getpid(), users=4))
    finally:
        server.stop(0)
    if servicer is Batches:  # every call answered: 4 users each, warm-up calls included in the count
        assert out["calls"] > 0 and out["errors"] == 0 and Batches.users % 4 == 0
        assert Batches.users >= 4 * out["calls"] and out["server_cpu_ms_per_user"] is not None
        assert out["p50_ms_per_user"] is not None and out["p50_ms_per_user"] > 0
    else:  # the echo has no BatchRetrieve: every measured call is an error, nothing is answered
        assert out["calls"] == 0 and out["errors"] > 0 and out["p50_ms_per_user"] is None
