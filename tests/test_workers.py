"""A serving group (``tools/serve.py --processes 2``): answers equal one process's, both workers
answer, health follows every worker, hot reload moves all workers together without a failed
request, SIGTERM drains and leaves no process, metrics are summed over the workers, and a port
is shared only inside one group. Also the memory-mapped index the workers share."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from index import FaissIndex
from retrieval.api.client import RetrievalClient
from retrieval.api.convert import SERVICE_NAME
from retrieval.api.types import Rerank
from retrieval.artifacts.deployment import publish_deployment
from retrieval.artifacts.model import read_model_vocab
from retrieval.serving.group import hold_ports
from retrieval.serving.retriever import Retriever
from retrieval.serving.server import create_server
from tests.helpers import REPO_ROOT, connected, save_din, scrape, serving, write_certificates

UP = "serving group of 2 workers on"
"""What the supervisor logs once every worker is up."""
START_SECONDS = 240.0
"""How long a group may take to report SERVING (two TensorFlow loads on a busy 2-core machine)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def descendants(pid: int) -> list[int]:
    """The child processes of ``pid``, their children, and so on (Linux)."""
    children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return [*children, *(d for c in children for d in descendants(c))]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def health(address: str) -> str:
    """The health status a new plain connection (a load balancer's probe) to ``address`` reads."""
    with grpc.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
        try:
            status = health_pb2_grpc.HealthStub(channel).Check(request, timeout=10).status
        except grpc.RpcError as e:
            return str(e.code().name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(status))


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


class Group:
    """``tools/serve.py --processes 2 --port P ARGS`` in a child process, its log in ``log``;
    entered once it logged SERVING."""

    def __init__(self, tmp_path: Path, *args: str, port: int | None = None) -> None:
        self.port = free_port() if port is None else port
        self.address = f"127.0.0.1:{self.port}"
        self.log = tmp_path / f"group-{self.port}.log"
        self.command = [sys.executable, "tools/serve.py", "--processes", "2", "--port", str(self.port), *args]

    def __enter__(self) -> Group:
        with self.log.open("w") as log:
            env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
            self.process = subprocess.Popen(self.command, cwd=REPO_ROOT, stdout=log, stderr=log, env=env)
        self.wait_for_log(UP)
        return self

    def wait_for_log(self, text: str, count: int = 1) -> None:
        deadline = time.monotonic() + START_SECONDS
        while self.log.read_text().count(text) < count:
            assert self.process.poll() is None, f"the group exited: {self.log.read_text()}"
            assert time.monotonic() < deadline, f"no {text!r} in the log: {self.log.read_text()}"
            time.sleep(0.1)

    @property
    def workers(self) -> list[int]:
        """The pids of the running workers, as the supervisor logged them, by worker number."""
        started = dict(re.findall(r"worker (\d+) started \(pid (\d+)\)", self.log.read_text()))
        pids = [int(started[n]) for n in sorted(started)]
        assert set(pids) <= set(descendants(self.process.pid)), "a logged worker is not the group's"
        return pids

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(60)

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def history(model_versions: list[tuple[Path, Path, str]]) -> list[str]:
    return list(read_model_vocab(model_versions[0][0]).ids[:5])


@pytest.mark.slow  # a group of two TensorFlow processes: ~15 s
def test_a_group_answers_as_one_process_does_over_tls_on_both_workers_with_metrics_summed(
    model_versions: list[tuple[Path, Path, str]], tmp_path: Path
) -> None:
    """Plain and reranked requests (a DIN ranker in every worker) answer as one process does."""
    (model_dir, index_dir, version), _ = model_versions
    vocab = read_model_vocab(model_dir)
    ranker_dir = save_din(tmp_path / "din", vocab, version, 0)
    ids = list(vocab.ids)
    files = write_certificates(tmp_path)
    tls = ["--tls-cert", str(files["server.pem"]), "--tls-key", str(files["server.key"])]
    metrics_port = free_port()
    args = ["--model", str(model_dir), "--index", str(index_dir), "--ranker", str(ranker_dir)]
    args += ["--metrics-port", str(metrics_port), *tls]
    reranks = [Rerank("din", 10) if i % 3 == 0 else None for i in range(30)]
    requests = [(ids[i : i + 1 + i % 4], 1 + i % 7, rerank) for i, rerank in enumerate(reranks)]
    single = Retriever.from_dirs(model_dir, index_dir, [ranker_dir])
    with serving(single) as address, RetrievalClient(address) as client:
        expected = [client.retrieve(history, k, rerank=rerank) for history, k, rerank in requests]
    assert sum(e.ranker_version != "" for e in expected) == 10  # the reranked ones
    with Group(tmp_path, *args) as group:
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
        samples = scrape(metrics_port)
        sent = len(requests) + len(clients)
        assert samples[("retrieval_requests_total", (("code", "OK"), ("method", "Retrieve")))] == sent
        assert samples[("retrieval_request_seconds_count", (("code", "OK"), ("method", "Retrieve")))] == sent
        assert samples[("retrieval_model_info", (("model_version", version),))] == 1
        assert samples[("retrieval_workers", ())] == 2
        assert group.stop() == 0
    assert not any(alive(pid) for pid in workers)


@pytest.mark.slow  # a group, one of whose workers is killed and replaced: ~25 s
def test_health_is_serving_only_while_every_worker_is_up(
    model_versions: list[tuple[Path, Path, str]], history: list[str], tmp_path: Path
) -> None:
    (model_dir, index_dir, _), _ = model_versions
    with Group(tmp_path, "--model", str(model_dir), "--index", str(index_dir)) as group:
        first = group.workers
        assert health(group.address) == "SERVING"
        os.kill(first[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while health(group.address) != "NOT_SERVING":  # the other worker is told at once
            assert time.monotonic() < deadline, "still SERVING with a worker down"
            time.sleep(0.02)
        group.wait_for_log(UP, count=2)  # the replacement is up
        assert health(group.address) == "SERVING"
        replaced = group.workers
        assert len(replaced) == 2 and first[1] in replaced and first[0] not in replaced
        with RetrievalClient(group.address, retries=0) as client:
            assert client.retrieve(history, 3).items
        assert group.stop() == 0


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
        assert group.stop() == 0


@pytest.mark.slow  # a group whose supervisor is killed: ~15 s
def test_workers_stop_when_their_supervisor_is_killed(
    model_versions: list[tuple[Path, Path, str]], tmp_path: Path
) -> None:
    (model_dir, index_dir, _), _ = model_versions
    with Group(tmp_path, "--model", str(model_dir), "--index", str(index_dir)) as group:
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


@pytest.mark.slow  # starts a group: ~15 s
def test_a_served_port_is_shared_only_inside_one_group(
    model_versions: list[tuple[Path, Path, str]], tmp_path: Path
) -> None:
    (model_dir, index_dir, _), _ = model_versions
    args = ["--model", str(model_dir), "--index", str(index_dir)]
    with Group(tmp_path, *args) as group:
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
        assert group.stop() == 0


def test_a_group_claims_its_port_against_single_servers_and_groups(retriever: Retriever) -> None:
    """What the supervisor holds before its workers start (:func:`hold_ports`)."""
    held, port = hold_ports("127.0.0.1", 0)
    try:
        assert port > 0
        with pytest.raises(OSError, match="the address is in use"):
            create_server(retriever, port=port)  # a single server
        with pytest.raises(OSError, match="the address is in use"):
            hold_ports("127.0.0.1", port)  # another group
        worker, bound = create_server(retriever, port=port, reuse_port=True, serving=False)
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
    served, port = create_server(retriever, port=0)
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
