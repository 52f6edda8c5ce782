"""The soak of ``python -m bench.robustness --soak``, short: a server in its own process under 80% of its
measured max QPS, a new version published at 2 s, no failed call and bounded memory growth."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from bench.robustness import Version, model_version_of, rss_kb, run_soak, soak_table, start_watching_server
from bench.serving import requests
from retrieval.artifacts.deployment import publish_deployment

SOAK_SECONDS = 25.0
"""Long enough for the deploy (which test-loads the version: 5-10 s on a loaded machine) and the
server's load and warm-up of it to finish well inside the run: 12 s here with another job running."""

SHORT_RSS_LIMIT = 0.05
"""The issue's 5% holds for the short run too: what grows in it is mostly one-time. Start RSS is
taken after the 2 s probe at 32 calls in flight; the soak then keeps up to 64 in flight (more of
the server's threads and gRPC buffers touched) and loads the second version beside the first
(plus the ~1 MB a reload of this tiny model keeps: see the xfail test below). Three 12 s runs
here on the loaded 2-core machine grew +1.1% to +1.4% (7-9 MB of ~645, about half before the
swap and half at it). 5% leaves room for three times that, and a leak of ~3 KB per call would
still exceed it on its own (~10,000 calls)."""


@pytest.fixture
def versions(model_versions: list[tuple[Path, Path, str]]) -> list[Version]:
    return [Version(*v) for v in model_versions]


@pytest.mark.slow  # a server in its own process under load for 25 s, plus the probe: ~40 s here
def test_a_short_soak_with_a_hot_reload(versions: list[Version], synthetic_csv: Path, tmp_path: Path) -> None:
    old, new = versions
    result = run_soak(
        versions,
        requests(synthetic_csv, 10),
        SOAK_SECONDS,
        tmp_path,
        probe_seconds=2.0,
        watch_interval=0.2,
        rss_limit=SHORT_RSS_LIMIT,
        reload_at=0.08,  # 23 s for the swap: a loaded machine took 12 s to deploy, load and warm up
    )
    print(soak_table(result))
    checks = result["checks"]
    assert result["errors"] == 0, result["errors_by_status"]
    assert checks["deploy_ok"], result["deploy"]
    assert checks["server_alive"] and result["server_exit_code"] == 0  # and it stopped cleanly
    # The swap: only the old version answered before it, only the new one after the calls in flight.
    assert result["swap_at_s"] is not None and result["swap_at_s"] > result["deploy"]["start_s"]
    assert set(result["versions_before_swap"]) == {old.version}
    after = result["versions_after_swap"]
    assert after[new.version] > 0 and after.get(old.version, 0) <= 64  # at most the calls in flight
    assert set(result["windows"][-1]["versions"]) == {new.version}
    assert checks["serves_new_at_end"]
    assert any(f"now serving model {new.version}" in line for line in result["server_reload_log"])
    assert result["rss_growth"] < SHORT_RSS_LIMIT, (result["rss_start_mb"], result["rss_end_mb"])
    # Not asserted: ``rate_held``. The probe measures what the shared machine gives in 2 s; other
    # jobs starting during the soak can take it back, and this test is about correctness.
    assert all(ok for name, ok in checks.items() if name != "rate_held"), checks


def serving(address: str) -> str | None:
    """The version a server answers with, ``None`` while it is too busy to answer in time."""
    try:
        return model_version_of(address)
    except grpc.RpcError:
        return None


@pytest.mark.slow  # twelve reloads of a server in its own process: ~20 s here
def test_repeated_hot_reloads_do_not_grow_the_server(versions: list[Version], tmp_path: Path) -> None:
    """Twelve reloads, no load: the server's RSS after the 12th is that after the 2nd (the first
    two allocate what every later version reuses)."""
    root = tmp_path / "live"
    publish_deployment(versions[0].model, versions[0].index, root, keep=2, grace=0)
    server, address = start_watching_server(root, tmp_path / "server.log", interval=0.1)
    rss = []
    try:
        for i in range(1, 13):
            new = versions[i % 2]
            publish_deployment(new.model, new.index, root, keep=2, grace=0)
            deadline = time.monotonic() + 60
            while serving(address) != new.version and time.monotonic() < deadline:
                time.sleep(0.05)
            assert model_version_of(address, timeout=30) == new.version
            time.sleep(0.5)
            rss.append(rss_kb(server.pid) / 1024)
    finally:
        server.terminate()
        server.wait(30)
    print("RSS MB after each reload:", [round(r, 1) for r in rss])
    assert rss[-1] - rss[1] < 4.0, rss  # measured: +11 MB now, +0 with the fix
