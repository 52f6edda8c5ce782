"""A serving group (``tools/serve.py --processes 2``): answers equal one process's, both workers
answer, a killed or hung worker is replaced while the other keeps SERVING, hot reload moves all
workers together without a failed request, SIGTERM drains and leaves no process even with a
worker stuck, metrics are summed over the workers, and a port is shared only inside one group.
Also the memory-mapped index the workers share."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.robustness.workers import UP, Availability, alive, descendants
from bench.robustness.workers import ServedGroup as Group
from bench.robustness.workers import probe as health
from bench.serving import free_port
from index import FaissIndex
from retrieval.api.client import RetrievalClient
from retrieval.api.types import Rerank
from retrieval.artifacts.deployment import publish_deployment
from retrieval.artifacts.model import read_model_vocab
from retrieval.serving.group import HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, hold_ports
from retrieval.serving.retriever import Retriever
from retrieval.serving.server import create_server
from retrieval.serving.stopping import STOP_MARGIN
from tests.helpers import REPO_ROOT, connected, local, save_din, scrape, serving, write_certificates


def connections(pid: int, port: int) -> int:
    """Established TCP connections process ``pid`` holds on its local ``port`` (from /proc)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                inodes.add(fields[9])
    held = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        held += target.startswith("socket:[") and target[8:-1] in inodes
    return held


def worker_up(metrics_port: int) -> dict[str, float]:
    """``retrieval_worker_up`` by worker number, as the group's metrics endpoint serves it."""
    samples = scrape(metrics_port)
    return {
        dict(labels)["worker"]: value
        for (name, labels), value in samples.items()
        if name == "retrieval_worker_up"
    }


@pytest.fixture(scope="module")
def history(model_versions: list[tuple[Path, Path, str]]) -> list[str]:
    return list(read_model_vocab(model_versions[0][0]).ids[:5])


TlsGroup = tuple[Group, Path, dict[str, Path], int]
"""A group over TLS with a DIN ranker in every worker and a metrics port: the group, the ranker's
folder, the certificate files (:func:`tests.helpers.write_certificates`) and the metrics port."""


@pytest.fixture(scope="module")
def tls_group(
    model_versions: list[tuple[Path, Path, str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsGroup]:
    """One group for the tests that leave it running until the last of them stops it (a group's
    start is two TensorFlow processes: ~7 s of CPU)."""
    (model_dir, index_dir, version), _ = model_versions
    folder = tmp_path_factory.mktemp("tls-group")
    ranker_dir = save_din(folder / "din", read_model_vocab(model_dir), version, 0)
    files = write_certificates(folder)
    metrics_port = free_port()
    args = ["--model", str(model_dir), "--index", str(index_dir), "--ranker", str(ranker_dir)]
    args += ["--metrics-port", str(metrics_port)]
    args += ["--tls-cert", str(files["server.pem"]), "--tls-key", str(files["server.key"])]
    with Group(folder, *args) as group:
        yield group, ranker_dir, files, metrics_port


@pytest.mark.slow  # starts a group (shared with the next test): ~15 s
def test_a_served_port_is_shared_only_inside_one_group(
    model_versions: list[tuple[Path, Path, str]],
    tls_group: TlsGroup,
    tmp_path: Path,
) -> None:
    (model_dir, index_dir, _), _ = model_versions
    group, args = tls_group[0], ["--model", str(model_dir), "--index", str(index_dir)]
    second = subprocess.run(
        [*Group(tmp_path, *args, port=group.port).command], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert second.returncode == 2
    assert f"cannot serve gRPC on 127.0.0.1:{group.port}: the address is in use" in second.stderr
    single = subprocess.run(
        [*Group(tmp_path, *args, port=group.port).command, "--processes", "1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert single.returncode == 2 and "the address is in use" in single.stderr
    assert group.process.poll() is None  # the group goes on serving


@pytest.mark.slow  # a group of two TensorFlow processes: ~15 s
def test_a_group_answers_as_one_process_does_over_tls_on_both_workers_with_metrics_summed(
    model_versions: list[tuple[Path, Path, str]], tls_group: TlsGroup
) -> None:
    """Plain and reranked requests (a DIN ranker in every worker) answer as one process does."""
    (model_dir, index_dir, version), _ = model_versions
    ids = list(read_model_vocab(model_dir).ids)
    group, ranker_dir, files, metrics_port = tls_group
    reranks = [Rerank("din", 10) if i % 3 == 0 else None for i in range(30)]
    requests = [(ids[i : i + 1 + i % 4], 1 + i % 7, rerank) for i, rerank in enumerate(reranks)]
    single = Retriever.from_dirs(model_dir, index_dir, [ranker_dir])
    with serving(single) as address, RetrievalClient(address) as client:
        expected = [client.retrieve(history, k, rerank=rerank) for history, k, rerank in requests]
    assert sum(e.ranker_version != "" for e in expected) == 10  # the reranked ones
    workers = group.workers
    assert len(workers) == 2
    # One connection per client: the kernel spreads them over the workers.
    clients = [RetrievalClient(group.address, tls_ca=files["ca.pem"], retries=0) for _ in range(20)]
    try:
        for i, (history, k, rerank) in enumerate(requests):
            got = clients[i % len(clients)].retrieve(history, k, rerank=rerank)
            assert got.items == expected[i].items and got.model_version == version
            assert got.ranker_version == expected[i].ranker_version
            if rerank is not None:
                np.testing.assert_allclose(got.rank_scores, expected[i].rank_scores, rtol=1e-6)
        for c in clients:
            c.retrieve(requests[0][0], 3)
        assert all(connections(pid, group.port) > 0 for pid in workers), "a worker got no connection"
        for c in clients:
            assert c.health() == "SERVING"
    finally:
        for c in clients:
            c.close()
    sent = len(requests) + len(clients)
    ok = ("retrieval_requests_total", (("code", "OK"), ("method", "Retrieve")))
    samples = scrape(metrics_port)
    deadline = time.monotonic() + 30  # a native worker moves its counts every second
    while samples.get(ok, 0) < sent and time.monotonic() < deadline:
        time.sleep(0.2)
        samples = scrape(metrics_port)
    assert samples[ok] == sent
    assert samples[("retrieval_request_seconds_count", (("code", "OK"), ("method", "Retrieve")))] == sent
    assert samples[("retrieval_model_info", (("model_version", version),))] == 1
    assert samples[("retrieval_workers", ())] == 2
    assert group.stop()[0] == 0
    assert not any(alive(pid) for pid in workers)


GRACE = 1.0
"""The ``--grace`` of :func:`replacing_group`: the stop the last worker test holds up."""


@pytest.fixture(scope="module")
def replacing_group(
    model_versions: list[tuple[Path, Path, str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Group, int]]:
    """A group with a metrics port (and ``--grace 1``) whose workers the next two tests kill and
    stop, the second stopping the group: the group and its metrics port."""
    (model_dir, index_dir, _), _ = model_versions
    metrics_port = free_port()
    args = ["--model", str(model_dir), "--index", str(index_dir), "--metrics-port", str(metrics_port)]
    with Group(tmp_path_factory.mktemp("replacing-group"), *args, "--grace", str(GRACE)) as group:
        yield group, metrics_port


@pytest.mark.slow  # a group under load, one of whose workers is killed and replaced: ~30 s
def test_a_killed_worker_leaves_the_group_serving_under_load(
    replacing_group: tuple[Group, int], history: list[str]
) -> None:
    """kill -9 of one worker: the other keeps SERVING (a probe on a new connection never reads
    NOT_SERVING), no call of 4 health-checked clients fails, the replacement serves once
    loaded, and ``retrieval_worker_up`` follows. (The next test stops the group: exit code 0.)"""
    group, metrics_port = replacing_group
    first = group.workers
    ups = group.log.read_text().count(UP)
    assert worker_up(metrics_port) == {"0": 1, "1": 1}
    with Availability(group.address, history) as load:
        load.wait_for(ok=40)
        os.kill(first[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while worker_up(metrics_port) != {"0": 0, "1": 1}:  # seen at once, while it is replaced
            assert time.monotonic() < deadline, worker_up(metrics_port)
            time.sleep(0.05)
        group.wait_for_log(UP, count=ups + 1)
        load.wait_for(load.ok + 40)
        # A quick replacement (under a second on a quiet machine) leaves few probes: go on
        # probing the group until it has answered more than 20, none NOT_SERVING.
        while load.probes["SERVING"] <= 20 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert not load.failed, load.failed
    assert load.not_serving == 0 and load.probes["SERVING"] > 20, load.probes
    assert load.unreachable <= 2, load.probes  # a probe meeting the dead worker's closing socket
    assert worker_up(metrics_port) == {"0": 1, "1": 1}
    replaced = group.workers
    assert len(replaced) == 2 and first[1] in replaced and first[0] not in replaced
    assert f"worker 0 (pid {first[0]}) exited with code -9" in group.log.read_text()


@pytest.mark.slow  # a group, one of whose workers is stopped, replaced, then stuck in the stop: ~40 s
def test_a_stopped_worker_is_replaced_and_cannot_hold_the_group_stop(
    replacing_group: tuple[Group, int], history: list[str]
) -> None:
    """SIGSTOP of a worker (hung): the supervisor notices the missing heartbeats, kills it with
    an ERROR naming it and starts a replacement that answers every new connection. Then SIGTERM
    with the other worker stopped: the group exits 0 within its grace and the margin."""
    group, _ = replacing_group
    first = group.workers
    ups = group.log.read_text().count(UP)
    os.kill(first[1], signal.SIGSTOP)
    stopped = time.monotonic()
    group.wait_for_log(f"worker 1 (pid {first[1]}) exited with code -9: killed", timeout=120)
    took = time.monotonic() - stopped
    # Its last answer came up to a ping interval before the SIGSTOP; 30 s: a loaded machine's slack.
    assert HEARTBEAT_TIMEOUT - HEARTBEAT_INTERVAL - 0.5 <= took <= HEARTBEAT_TIMEOUT + 30
    group.wait_for_log(UP, count=ups + 1)
    assert not alive(first[1])
    for _ in range(10):  # new connections, spread over both workers
        with RetrievalClient(group.address, timeout=10, retries=0) as client:
            assert client.retrieve(history, 5).items
    second = group.workers
    os.kill(second[0], signal.SIGSTOP)
    code, took = group.stop()
    assert code == 0 and took <= GRACE + STOP_MARGIN + 30
    assert not any(alive(pid) for pid in second)


@pytest.mark.slow  # a watched deployment served by a group, a version published under load: ~25 s
def test_hot_reload_moves_every_worker_without_a_failed_request(
    model_versions: list[tuple[Path, Path, str]], history: list[str], tmp_path: Path
) -> None:
    (model_1, index_1, v1), (model_2, index_2, v2) = model_versions
    root = tmp_path / "live"
    publish_deployment(model_1, index_1, root)
    seen: list[list[str]] = [[] for _ in range(6)]
    errors: list[Exception] = []
    stop = threading.Event()

    def call(answers: list[str], address: str) -> None:
        with RetrievalClient(address, retries=0) as client:  # one connection each
            while not stop.is_set():
                try:
                    answers.append(client.retrieve(history, 5).model_version)
                except Exception as e:  # any failure fails the test
                    errors.append(e)

    with Group(tmp_path, "--watch", str(root), "--watch-interval", "0.05") as group:
        callers = [threading.Thread(target=call, args=(answers, group.address)) for answers in seen]
        for caller in callers:
            caller.start()
        try:
            while sum(map(len, seen)) < 20:
                time.sleep(0.02)
            publish_deployment(model_2, index_2, root)
            group.wait_for_log(f"the group now serves model {v2}")
            for _ in range(10):  # fresh connections, spread over both workers
                with RetrievalClient(group.address, retries=0) as client:
                    assert client.retrieve(history, 5).model_version == v2
        finally:
            stop.set()
            for caller in callers:
                caller.join()
        assert not errors
        for answers in seen:  # each connection: the old version, then only the new one
            assert answers[0] == v1 and answers[-1] == v2
            assert set(answers[answers.index(v2) :]) == {v2}
        assert group.stop()[0] == 0


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A new folder in the system's temporary folder: the metrics folder's socket paths under it fit
    AF_UNIX's 108 bytes, where under ``tmp_path`` on a pytest-xdist worker (``popen-gw1/``) not."""
    with tempfile.TemporaryDirectory(prefix="mitt-test-") as folder:
        yield Path(folder)


@pytest.mark.slow  # a group whose supervisor is killed: ~15 s
def test_workers_stop_when_their_supervisor_is_killed_and_remove_the_metrics_folder(
    model_versions: list[tuple[Path, Path, str]], tmp_path: Path, short_tmp: Path
) -> None:
    (model_dir, index_dir, _), _ = model_versions
    temporary = short_tmp  # where the supervisor makes its metrics folder
    args = ["--model", str(model_dir), "--index", str(index_dir), "--metrics-port", str(free_port())]
    with Group(tmp_path, *args, env={"TMPDIR": str(temporary)}) as group:
        assert len(list(temporary.glob("mitt-metrics-*"))) == 1
        started = group.log.read_text()  # TensorFlow's start-up lines stay quiet in the forking process
        assert not any(noise in started for noise in ("oneDNN", "absl::InitializeLog")), started
        workers = descendants(group.process.pid)  # the workers and the process forking them
        assert set(group.workers) < set(workers)
        group.process.kill()
        group.process.wait()
        deadline = time.monotonic() + 60
        while any(alive(pid) for pid in workers):
            assert time.monotonic() < deadline, "orphaned processes"
            time.sleep(0.1)
        hold_ports("127.0.0.1", group.port)[0][0].close()  # nobody holds the port any more
        assert not list(temporary.glob("mitt-metrics-*"))  # the last worker out removed it


def test_a_group_claims_its_port_against_single_servers_and_groups(retriever: Retriever) -> None:
    """What the supervisor holds before its workers start (:func:`hold_ports`)."""
    held, port = hold_ports("127.0.0.1", 0)
    try:
        assert port > 0
        with pytest.raises(OSError, match="the address is in use"):
            create_server(retriever, local(port=port))  # a single server
        with pytest.raises(OSError, match="the address is in use"):
            hold_ports("127.0.0.1", port)  # another group
        worker, bound = create_server(retriever, local(port=port), reuse_port=True, serving=False)
        try:
            assert bound == port  # a worker of the group joins
            assert health(f"127.0.0.1:{port}") == "NOT_SERVING"  # until the group is up
            worker.set_serving(True)
            with connected(f"127.0.0.1:{port}", retries=0) as client:
                assert client.retrieve(["item01"], 3).items
        finally:
            worker.stop(None)
    finally:
        for holder in held:
            holder.close()
    served, port = create_server(retriever, local())
    try:
        with pytest.raises(OSError, match="the address is in use"):
            hold_ports("127.0.0.1", port)  # a group on a served port
    finally:
        served.stop(None)


def _same_answers(got: tuple[np.ndarray, np.ndarray], expected: tuple[np.ndarray, np.ndarray]) -> None:
    """The same ids in the same order, scores equal to float32 rounding (a copy's vectors may sit
    at another alignment, which FAISS's SIMD distance code sums in another order)."""
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6)
    np.testing.assert_array_equal(got[1], expected[1])


@pytest.mark.parametrize(
    ("factory", "params"),
    [("Flat", ""), ("L2MIPS,IVF8,Flat", "nprobe=4"), ("HNSW8", "efSearch=32"), ("IVF8,SQ8", "nprobe=4")],
)
def test_a_memory_mapped_index_answers_the_same_and_is_changed_only_as_a_copy(
    factory: str, params: str, tmp_path: Path
) -> None:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(500, 16)).astype(np.float32)
    queries = rng.normal(size=(20, 16)).astype(np.float32)
    built = FaissIndex.build(np.arange(1, 501), vectors, factory, params)
    built.save(tmp_path / "index.faiss")
    norm: Any = built.describe().get("mips_norm")
    mapped = FaissIndex.load(tmp_path / "index.faiss", factory, params, mips_norm=norm, mmap=True)
    _same_answers(mapped.search(queries, 10), built.search(queries, 10))
    for change in (lambda i: i.remove([1, 2]), lambda i: i.upsert(np.array([3]), vectors[:1])):
        with pytest.raises(ValueError, match="memory-mapped"):  # FAISS would crash writing its pages
            change(mapped)
    copy, reference = mapped.copy(), built.copy()
    for index in (copy, reference):
        index.remove([1, 2])
        index.upsert(np.array([3, 501]), vectors[:2] * 0.5)
    _same_answers(copy.search(queries, 10), reference.search(queries, 10))
    _same_answers(mapped.search(queries, 10), built.search(queries, 10))  # the mapped one is as it was
