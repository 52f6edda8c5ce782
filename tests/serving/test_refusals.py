"""Refusals a server makes visible (issue 43, items 10-12): every refusal counted in /metrics with
its code, reason and identity, the queue depths exported, the ``--max-queued`` refusal with a
retry hint, callers identified and rate-limited before their request is read, access-file
changes that were not applied counted and shown, and ``last_refusal`` kept from non-admins.
Real servers on port 0."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from retrieval.api.client import RetrievalClient
from retrieval.api.v1 import retrieval_pb2
from retrieval.artifacts.index import build_index_from_model
from retrieval.serving.access import AccessControl
from retrieval.serving.access_log import AccessLog
from retrieval.serving.auth import AccessFile
from retrieval.serving.metrics import GroupMetrics, Metrics
from retrieval.serving.ratelimit import RateLimiter
from retrieval.serving.reload import RetrieverSlot
from retrieval.serving.server import RetrievalServer, create_server, public_refusal
from retrieval.storage.manifest import ArtifactError
from tests.helpers import REPO_ROOT, GatedRetriever, local, make_model, scrape
from tests.serving.helpers import refusal

ACCESS = """
[identities.reader]
tokens = ["reader-token"]
permissions = ["info"]

[identities.team]
tokens = ["team-token"]
permissions = ["retrieve", "info"]
rate = 1
burst = 2

[identities.ops]
tokens = ["ops-token"]
permissions = ["admin"]
rate = 0
"""

Labels = tuple[tuple[str, str], ...]


@pytest.fixture
def gated() -> GatedRetriever:
    model = make_model()
    return GatedRetriever(model, build_index_from_model(model, "Flat"))


@contextmanager
def metered(retriever: Any, *overrides: str, **options: Any) -> Iterator[tuple[RetrievalServer, str, int]]:
    """A server (``--set`` ``overrides`` of :func:`local`'s config) counting in a :class:`Metrics`
    served on its own port: ``(server, address, metrics port)``."""
    metrics = Metrics()
    metrics_port = metrics.serve(0)
    server, port = create_server(retriever, local(*overrides), metrics=metrics, **options)
    try:
        yield server, f"127.0.0.1:{port}", metrics_port
    finally:
        server.stop(None)
        metrics.close()


def refusals(values: dict[tuple[str, Labels], float]) -> dict[tuple[str, str, str, str], float]:
    """``(method, code, reason, identity) -> count`` of ``retrieval_refusals_total``."""
    counts = {}
    for (name, labels), value in values.items():
        if name == "retrieval_refusals_total":
            got = dict(labels)
            counts[(got["method"], got["code"], got["reason"], got["identity"])] = value
    return counts


def code_of(call: Any) -> grpc.RpcError | None:
    """The error a call ends with, ``None`` when it returns."""
    try:
        call()
    except grpc.RpcError as e:
        return e
    return None


def pushback_ms(error: grpc.RpcError) -> int:
    (value,) = [v for k, v in error.trailing_metadata() if k == "grpc-retry-pushback-ms"]
    return int(value)


def test_every_refusal_is_counted_with_its_code_reason_and_identity(
    gated: GatedRetriever, tmp_path: Path
) -> None:
    access_file = tmp_path / "access.toml"
    access_file.write_text(ACCESS)
    access = AccessControl(identities=AccessFile(access_file), rate_limit=RateLimiter(rate=100, burst=100))
    with metered(gated, "limits.max_queued=1", f"limits.max_request_mb={4096 / 2**20}", access=access) as (
        _,
        address,
        port,
    ):
        request = retrieval_pb2.RetrieveRequest(history=["item01"], k=3)
        with RetrievalClient(address, retries=0, token="") as anonymous:
            assert code_of(anonymous.model_info).code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[union-attr]
        with RetrievalClient(address, retries=0, token="wrong") as wrong:
            assert code_of(wrong.model_info).code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[union-attr]
        with RetrievalClient(address, retries=0, token="reader-token") as reader:
            denied = code_of(lambda: reader.retrieve(["item01"], 3))
            assert denied is not None and denied.code() == grpc.StatusCode.PERMISSION_DENIED
        with RetrievalClient(address, retries=0, token="team-token") as team:
            assert code_of(lambda: team.retrieve(["item01"], 0)).code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[union-attr]
            limited = code_of(lambda: [team.retrieve(["item01"], 3) for _ in range(3)])
            assert limited is not None and limited.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with RetrievalClient(address, retries=0, token="ops-token") as ops:
            large = retrieval_pb2.RetrieveRequest(history=["item01"] * 1000, k=3)  # ~9 KB > 4096 bytes
            oversized = code_of(lambda: ops._stub.Retrieve(large, timeout=10, metadata=ops._metadata))
            assert oversized is not None and oversized.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # --max-queued 1: while one call is held, the next is refused with a retry hint.
            gated.hold()
            held = ops._stub.Retrieve.future(request, timeout=30, metadata=ops._metadata)
            assert gated.entered.wait(10)
            depth = scrape(port)[("retrieval_queue_depth", (("queue", "calls"),))]
            full = code_of(lambda: ops._stub.Retrieve(request, timeout=10, metadata=ops._metadata))
            gated.gate.set()
            assert len(held.result().items) == 3
        assert full is not None and full.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-queued" in (full.details() or "") and pushback_ms(full) >= 1
        values = scrape(port)
    assert depth == 1 and values[("retrieval_queue_depth", (("queue", "calls"),))] == 0
    assert refusals(values) == {
        ("GetModelInfo", "UNAUTHENTICATED", "missing_credentials", ""): 1,
        ("GetModelInfo", "UNAUTHENTICATED", "invalid_token", ""): 1,
        ("Retrieve", "PERMISSION_DENIED", "permission", "reader"): 1,
        ("Retrieve", "INVALID_ARGUMENT", "invalid_argument", "team"): 1,
        ("Retrieve", "RESOURCE_EXHAUSTED", "rate_limit", "team"): 1,
        ("Retrieve", "RESOURCE_EXHAUSTED", "message_size", "ops"): 1,  # identified, then not read
        ("Retrieve", "RESOURCE_EXHAUSTED", "queue_full", ""): 1,  # refused before identified
    }
    requests = values[("retrieval_requests_total", (("code", "RESOURCE_EXHAUSTED"), ("method", "Retrieve")))]
    assert requests == 3  # refusals are requests too


def test_max_queued_refusals_carry_a_retry_hint_under_concurrency(gated: GatedRetriever) -> None:
    """Rounds of 8 calls at once with 2 held: every one beyond 2 is refused at once (while the
    held ones compute) with a pushback, and the held ones are answered."""
    with metered(gated, "limits.max_queued=2") as (_, address, port):
        request = retrieval_pb2.RetrieveRequest(history=["item01"], k=3)
        refused = 0
        with RetrievalClient(address, retries=0) as client:
            client.wait_until_serving(timeout=10)
            for _ in range(20):
                gated.hold()
                held = [client._stub.Retrieve.future(request, timeout=30) for _ in range(2)]
                assert gated.entered.wait(10)
                time.sleep(0.05)  # the second held call reaches the server (it queues in the batcher)
                more = [client._stub.Retrieve.future(request, timeout=30) for _ in range(6)]
                errors = [f.exception(timeout=20) for f in more]  # answered while the gate is shut
                gated.gate.set()
                assert [len(f.result().items) for f in held] == [3, 3]
                for error in errors:
                    assert isinstance(error, grpc.RpcError)
                    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and pushback_ms(error) >= 1
                refused += len(errors)
        values = scrape(port)
    assert refusals(values) == {("Retrieve", "RESOURCE_EXHAUSTED", "queue_full", ""): refused}
    assert values[("retrieval_queue_depth", (("queue", "calls"),))] == 0


def test_unidentified_callers_are_rate_limited_by_address_and_never_parsed(
    gated: GatedRetriever, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    access_file = tmp_path / "access.toml"
    access_file.write_text(ACCESS)
    access = AccessControl(
        identities=AccessFile(access_file), rate_limit=RateLimiter(rate=0.5, burst=3), access_log=AccessLog()
    )
    large = retrieval_pb2.RetrieveRequest(history=[f"item{i % 40:02d}" for i in range(300_000)], k=3)
    with (
        caplog.at_level(logging.INFO, logger="retrieval.access"),
        metered(gated, access=access) as (server, address, _),
        RetrievalClient(address, retries=0, token="wrong", max_request_bytes=8 << 20) as stranger,
    ):
        errors = [code_of(lambda: stranger._stub.Retrieve(large, timeout=30, metadata=stranger._metadata))]
        errors += [code_of(stranger.model_info) for _ in range(5)]
        with RetrievalClient(address, retries=0, token="ops-token") as ops:
            assert ops.model_info().model_version == "model-v1"  # its own bucket: unlimited
        server.stop(10).wait(30)  # every line written
    codes = [e.code().name for e in errors if e is not None]
    assert codes == ["UNAUTHENTICATED"] * 3 + ["RESOURCE_EXHAUSTED"] * 3
    assert "rate limit of 0.5 requests/s (burst 3) for unauthenticated calls from 127.0.0.1" in (
        errors[-1].details() or ""  # type: ignore[union-attr]
    )
    lines = [r.fields for r in caplog.records if r.name == "retrieval.access"]  # type: ignore[attr-defined]
    assert (lines[0]["identity"], lines[0]["code"], lines[0]["method"]) == (
        None,
        "UNAUTHENTICATED",
        "Retrieve",
    )
    assert "history_len" not in lines[0] and "k" not in lines[0]  # its request was never parsed
    assert gated.calls == 0


def test_an_access_file_change_not_applied_is_counted_and_shown(
    gated: GatedRetriever, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    access_file = tmp_path / "access.toml"
    access_file.write_text(ACCESS)
    identities = AccessFile(access_file, check_interval=0.0)
    with (
        metered(gated, access=AccessControl(identities=identities)) as (_, address, port),
        RetrievalClient(address, retries=0, token="reader-token") as reader,
        caplog.at_level(logging.ERROR, logger="retrieval.serving.auth"),
    ):

        def seen() -> tuple[float, float]:
            values = scrape(port)
            return values[("retrieval_access_file_errors_total", ())], values[
                ("retrieval_access_file_stale", ())
            ]

        def shown() -> tuple[str, str]:
            """GetModelInfo.access_file_error as an admin and as the reader see it."""
            with RetrievalClient(address, retries=0, token="ops-token") as ops:
                return ops.model_info().access_file_error, reader.model_info().access_file_error

        assert reader.model_info().access_file_error == ""
        assert seen() == (0, 0)
        access_file.unlink()  # deleted: the last good file stays in force, visibly
        for _ in range(3):
            reader.model_info()
        assert seen() == (1, 1) and identities.stale is not None and "No such file" in identities.stale
        assert shown() == (
            f"{access_file}: No such file or directory",
            "access.toml: No such file or directory",
        )
        # A revocation written into a file that does not parse: still the last good file.
        access_file.write_text(ACCESS.replace('["reader-token"]', '["revoked"') + "\n[broken\n")
        reader.model_info()
        assert seen() == (2, 1) and "Unclosed array" in (identities.stale or "")
        whole, public = shown()
        assert whole == identities.stale and whole.startswith(f"{access_file}: ")
        assert public == public_refusal(whole) and public.startswith("access.toml: ")
        assert str(tmp_path) not in public
        access_file.write_text(ACCESS.replace('"reader-token"', '"new-reader-token"'))
        assert code_of(reader.model_info).code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[union-attr]
        assert seen() == (2, 0) and identities.stale is None
        with RetrievalClient(address, retries=0, token="ops-token") as ops:
            assert ops.model_info().access_file_error == ""
    assert len([r for r in caplog.records if "not reloaded" in r.getMessage()]) == 2  # once per change


REFUSAL = (
    "version 3: /srv/secret/deploy/versions/3/model/user_tower is not a readable user tower: "
    "Op type not registered 'MittOp' in binary running on host-17.internal"
)


def test_last_refusal_is_shown_whole_to_admins_only(gated: GatedRetriever, tmp_path: Path) -> None:
    access_file = tmp_path / "access.toml"
    access_file.write_text(ACCESS)
    slot = RetrieverSlot(gated)
    slot.refuse(tmp_path / "3", ArtifactError(REFUSAL))
    with metered(slot, access=AccessControl(identities=AccessFile(access_file))) as (_, address, _port):
        infos = {}
        for token in ("reader-token", "ops-token"):
            with RetrievalClient(address, retries=0, token=token) as client:
                infos[token] = client.model_info().last_refusal
    assert infos["ops-token"] == REFUSAL
    assert infos["reader-token"] == "version 3: user_tower is not a readable user tower"


@pytest.mark.parametrize(
    ("reason", "shown"),
    [
        ("index 'Flat' holds NaN or infinite vectors", "index 'Flat' holds NaN or infinite vectors"),
        ("ValueError: cannot reshape array of size 7 in /opt/app/lib.py", "ValueError"),
        ("version v2: OSError: [Errno 5] I/O error: '/data/x.npy'", "version v2: OSError"),
        ("/srv/m/manifest.json: 'files' must map file names to SHA-256 checksums",
         "manifest.json: 'files' must map file names to SHA-256 checksums"),
        ("/srv/m/w.npy is corrupted: checksum does not match the manifest", "w.npy is corrupted"),
    ],
)  # fmt: skip
def test_public_refusal_drops_paths_and_what_libraries_said(reason: str, shown: str) -> None:
    assert public_refusal(reason) == shown


def test_a_refusal_on_a_full_server_does_not_wait_for_a_request_thread(gated: GatedRetriever) -> None:
    """One request thread, held: the refusal of a call over --max-queued is answered at once
    by a thread of its own, not after the held call."""
    with metered(gated, "threads=1", "limits.max_queued=1") as (_, address, _port):
        request = retrieval_pb2.RetrieveRequest(history=["item01"], k=3)
        with RetrievalClient(address, retries=0) as client:
            client.wait_until_serving(timeout=10)
            gated.hold()
            held = client._stub.Retrieve.future(request, timeout=30)
            assert gated.entered.wait(10)
            answered = threading.Event()
            refused = client._stub.Retrieve.future(request, timeout=30)
            refused.add_done_callback(lambda _: answered.set())
            assert answered.wait(10)  # the gate is still shut
            gated.gate.set()
            assert len(held.result().items) == 3
    assert refused.exception().code() == grpc.StatusCode.RESOURCE_EXHAUSTED


WORKER = """
import sys
from retrieval.serving.metrics import Metrics
metrics = Metrics(worker=True)
metrics.queue.labels("calls").set(int(sys.argv[1]))
metrics.answered("Retrieve", "RESOURCE_EXHAUSTED", 0.001, "queue_full")
"""


def test_a_groups_queue_depths_are_those_of_its_live_workers(tmp_path: Path) -> None:
    """Two worker processes set their queue depth (3 and 4) and count a refusal each; once the
    first is gone, the group's depth is the other's alone, and both refusals stay counted."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for depth in (3, 4):
        subprocess.run([sys.executable, "-c", WORKER, str(depth)], env=env, cwd=REPO_ROOT, check=True)
    group = GroupMetrics(tmp_path)
    port = group.serve(0)
    try:
        before = scrape(port)
        pid = int(next(f.stem.rpartition("_")[2] for f in tmp_path.glob("gauge_livesum_*.db")))
        group.worker_gone(pid)
        after = scrape(port)
    finally:
        group.close()
    depth = ("retrieval_queue_depth", (("queue", "calls"),))
    refused = refusal("RESOURCE_EXHAUSTED", "queue_full")
    assert (before[depth], before[refused]) == (7, 2)
    assert after[depth] in (3, 4) and after[refused] == 2
