"""Serving benchmark: the gRPC server under load, next to a bare gRPC echo service, in one run.

    python -m bench.serving                       # 1M items, K=4, k=50, 10 s per row
    python -m bench.serving --items 200000 --seconds 3      # a quicker run

A ComiRec-SA (K=4, d=64) trained on ML-100K, its catalogue grown to ``--items`` items by
perturbed copies of the learned item embeddings (as in the index benchmark), is written as a
real model artifact with an ``L2MIPS,IVF4096,Flat`` index (``nprobe=8``), cached in ``--out``
(see :func:`build_artifacts`). Each server runs in its own
process, started as users start it (``tools/serve.py``); the load generator is one asyncio gRPC
client process on the same 2 cores, loopback only, keeping ``concurrency`` requests in flight
over up to ``--connections`` connections (16; a serving group spreads connections, not calls,
over its workers) for ``--seconds`` (or ``--max-requests``) after a one-second warm-up.
Requests are the ML-100K users' histories (up to their last 50 items) with k=50.

Rows: the bare echo service (a Python gRPC server answering every Retrieve with a prebuilt
50-item response: the ceiling of Python gRPC here), the retrieval server with micro-batching
(the default), the same with the user tower compiled by XLA (``--xla``), without micro-batching
(``--max-batch 1``), and with micro-batching plus a DIN rerank of
200 candidates per request (``RetrieveRequest.rerank``; the ranker's weights are initialised,
not trained: latency only), plain and with ``--xla`` (user tower and ranker compiled), and the
native engine (``--engine native``: C++ gRPC, the model called once per micro-batch; ``make
native`` builds it), at concurrency 1, 8 and 32; ``--rows`` keeps some of them. Each row also
reports the CPU time per request of the server process and of the client. Each rerank server
is also measured with its users' plain and reranked requests interleaved at concurrency 1
(:func:`paired_load`), which
gives the latency the rerank adds free of the drift between rows; likewise the micro-batching
server with each user's plain request interleaved with its ``explain=true`` twin
(``RetrieveRequest.explain``: what explanations cost at concurrency 1, p50 and p99). With
``--processes 2`` (or more), serving groups too (``tools/serve.py --processes N``: N worker
processes on one port) and an N-process echo (N echo servers sharing the port), and each row
reports the server's memory once loaded and measured: RSS and PSS (:func:`memory`) summed over
its processes, PSS counting a page shared by n processes 1/n in each (the memory-mapped index
is one copy for the whole group; RSS would count it once per process). Prints a
Markdown table and writes ``results.json`` and ``table.md`` to ``--out``. Targets: p99 <= 5 ms
at concurrency 1; QPS at concurrency 32 >= 50% of the echo's; the rerank adds <= 5 ms to p99
at concurrency 1 (interleaved; plain and ``--xla``); no errors; the native engine's
(:data:`NATIVE_TARGETS`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from bench.context import commit, write_report
from bench.data import REPO, add_data_root_argument, dataset_file
from retrieval.api.v1 import retrieval_pb2, retrieval_pb2_grpc

log = logging.getLogger("bench.serving")

FACTORY, SEARCH_PARAMS = "L2MIPS,IVF4096,Flat", "nprobe=8"
TARGET_P99_MS, TARGET_ECHO_SHARE, TARGET_RERANK_P99_MS = 5.0, 0.5, 5.0
RERANK_CANDIDATES = 200
RETRIEVAL = "retrieval (micro-batching)"
RETRIEVAL_XLA = "retrieval (micro-batching, --xla)"
RERANK = f"retrieval + DIN rerank of {RERANK_CANDIDATES}"
RERANK_XLA = f"retrieval + DIN rerank of {RERANK_CANDIDATES}, --xla"
NATIVE = "retrieval (native engine)"
NO_BATCHING = "retrieval (no batching)"
ROWS = {
    "echo": "echo",
    "retrieval": RETRIEVAL,
    "xla": RETRIEVAL_XLA,
    "no-batching": NO_BATCHING,
    "rerank": RERANK,
    "rerank-xla": RERANK_XLA,
    "native": NATIVE,
}
"""``--rows`` names -> the rows' servers."""
NATIVE_TARGETS = {
    "qps_over_python_at_32": 3.0,
    "qps_over_echo_at_32": 0.6,
    "p99_at_32_ms": 10.0,
    "p99_at_1_ms": 2.0,
    "p99_at_8_ms": 5.0,
    "server_cpu_at_32_ms": 0.4,
}
"""The native engine's targets (issue 44): QPS at 32 in flight over the Python engine's (one
process) and the echo's (at least), p99 at 32, 1 and 8 in flight and server CPU per request at
32 (at most); and its resident memory at most the Python engine's."""
BATCH_USERS = 32
"""Users in each ``BatchRetrieve`` of the engines' batch measure (issue 44: at most
``NATIVE_BATCH_TARGET_MS`` of server CPU per user for the native engine)."""
NATIVE_BATCH_TARGET_MS = 0.3
TARGET_GROUP_MEMORY = 1.4
"""A 2-process group's memory (PSS) over one process's: the target of the serving group."""


def group_name(processes: int) -> str:
    return f"retrieval (micro-batching, {processes} processes)"


def build_artifacts(out: Path, items: int, data: Path, epochs: int, seed: int = 0) -> tuple[Path, Path]:
    """The benchmark's model and index folders under ``out`` (built once, then reused).

    A ComiRec-SA (K=4, d=64) is trained on ``data`` (ML-100K) for ``epochs``; its item table is
    then grown to ``items`` rows with perturbed copies of the learned embeddings
    (``bench.index.scale_items``, which keeps their structure), every other weight kept, and
    written as a model artifact with an ``L2MIPS,IVF4096,Flat`` index (``nprobe=8``: recall@50
    0.993 against exact search in the index benchmark). Requests are real users' histories, so
    the interests are the trained tower's. A cached model written before explanations (no
    ``explanation`` in its manifest: its tower cannot give them) is built again.
    """
    model_dir, index_dir = out / f"model-{items}", out / f"index-{items}"
    manifest = model_dir / "manifest.json"
    cached = manifest.is_file() and (index_dir / "manifest.json").is_file()
    if cached and "explanation" in json.loads(manifest.read_text()):
        return model_dir, index_dir
    import keras

    from bench.index import scale_items, user_interests
    from retrieval.artifacts import build_index_from_model, load_model, measure_index, save_index
    from retrieval.data import ItemVocab
    from retrieval.training import (
        Config,
        DataConfig,
        ModelConfig,
        TrainConfig,
        build_model,
        run_folder,
        save_model,
        train,
    )

    config = Config(
        DataConfig(path=str(data)),
        ModelConfig(tower="sa", dim=64, num_interests=4),
        TrainConfig(epochs=epochs),
    )
    base_dir = out / "base-model"
    if not (base_dir / "manifest.json").is_file():
        log.info("training ComiRec-SA on %s for %d epochs into %s", data, epochs, base_dir)
        train(config, base_dir, verbose=0, resume=run_folder(base_dir).is_dir())
    base = load_model(base_dir)
    trained = keras.saving.load_model(base_dir / "model.keras", compile=False)
    keras.utils.set_random_seed(seed)
    model = build_model(config.model, items + 1)
    model({"items": np.ones((1, config.model.max_len), np.int32)})  # builds every layer
    table = np.vstack([np.zeros((1, 64), np.float32), scale_items(base.item_embeddings[1:], items, seed)])
    for new, old in zip(model.weights, trained.weights, strict=True):
        new.assign(table if new.shape != old.shape else np.asarray(old))
    ids = list(base.vocab.ids) + [f"copy{i}" for i in range(items - len(base.vocab))]
    log.info("writing the %d-item model to %s", items, model_dir)
    save_model(
        model, config, ItemVocab.from_ids(ids), base.side, {"base_model": str(base_dir)}, model_dir, True
    )
    artifact = load_model(model_dir)
    log.info("building %s over %d items", FACTORY, items)
    index = build_index_from_model(artifact, FACTORY, SEARCH_PARAMS, seed=seed)
    measured = measure_index(index, artifact, user_interests(artifact, data), 50)
    save_index(index, index_dir, artifact, True, measured=measured)
    return model_dir, index_dir


RANKER_KWARGS = {"dim": 64, "max_len": 20}
"""The rerank row's DIN: what ``tools/train_ranker.py --ranker din`` trains over this model by
default (the model's dimension, the last 20 events, DIN's (80, 40) activation unit and
(200, 80) MLP)."""


def build_ranker_artifact(out: Path, model_dir: Path, seed: int = 0) -> Path:
    """A DIN ranker over the benchmark model's catalogue, in ``out/ranker-<items>`` (built once).

    Its weights are initialised, not trained: the row measures latency, which does not depend
    on the weights' values (shapes and operations are those of a trained DIN).
    """
    from rankers import build_ranker
    from retrieval.artifacts import read_model_vocab, save_ranker

    vocab = read_model_vocab(model_dir)
    ranker_dir = out / f"ranker-{len(vocab)}-dim{RANKER_KWARGS['dim']}-len{RANKER_KWARGS['max_len']}"
    if (ranker_dir / "manifest.json").is_file():
        return ranker_dir
    import keras

    keras.utils.set_random_seed(seed)
    kwargs = {"num_items": len(vocab), **RANKER_KWARGS}
    ranker = build_ranker("din", **kwargs)
    ranker.build()
    version = json.loads((model_dir / "manifest.json").read_text())["version"]
    save_ranker(ranker_dir, ranker, "din", kwargs, vocab, version, metrics={"trained": False})
    return ranker_dir


class EchoServicer(retrieval_pb2_grpc.RetrievalServiceServicer):
    """Answers every Retrieve with the same prebuilt response: gRPC's own cost, nothing else."""

    def __init__(self, k: int) -> None:
        self.response = retrieval_pb2.RetrieveResponse(
            items=[
                retrieval_pb2.ScoredItem(item_id=f"item{i}", score=1.0 / (i + 1), interest=i % 4)
                for i in range(k)
            ],
            model_version="echo",
        )

    def Retrieve(self, request: retrieval_pb2.RetrieveRequest, context: grpc.ServicerContext) -> Any:
        return self.response


def serve_echo(port: int, k: int, workers: int, processes: int = 1) -> None:
    """Runs the echo service on 127.0.0.1:``port`` until SIGTERM; ``processes`` > 1 starts that
    many more echo processes sharing the port (grpcio's default ``SO_REUSEPORT``), stopped with it."""
    others = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.serving", "--echo", "--k", str(k), "--port", str(port)]
        )
        for _ in range(processes - 1)
    ]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(EchoServicer(k), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
    server.wait_for_termination()
    for other in others:
        other.terminate()
        other.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Started:
    """A server process and its address."""

    name: str
    process: subprocess.Popen[bytes]
    address: str

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start(name: str, args: Sequence[str]) -> Started:
    """Starts ``python ARGS --port P`` from the repository root and waits until it answers a Retrieve."""
    port = free_port()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    process = subprocess.Popen(
        [sys.executable, *args, "--port", str(port)], cwd=REPO, env=env, stderr=subprocess.DEVNULL
    )
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    with grpc.insecure_channel(address) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        while True:
            try:
                stub.Retrieve(retrieval_pb2.RetrieveRequest(history=["?"], k=1), timeout=5)
                break
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:  # it answered (an unknown id is fine)
                    break
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    raise RuntimeError(f"{name} did not start (exit code {process.poll()})") from None
                time.sleep(0.5)
    return Started(name, process, address)


def twins(
    batch: Sequence[retrieval_pb2.RetrieveRequest], **fields: Any
) -> list[retrieval_pb2.RetrieveRequest]:
    """Copies of ``batch`` with ``fields`` merged in, e.g. ``explain=True`` or
    ``rerank=retrieval_pb2.Rerank(candidates=200)``."""
    extra = retrieval_pb2.RetrieveRequest(**fields)
    out = []
    for request in batch:
        twin = retrieval_pb2.RetrieveRequest()
        twin.CopyFrom(request)
        twin.MergeFrom(extra)
        out.append(twin)
    return out


def requests(data: Path, k: int) -> list[retrieval_pb2.RetrieveRequest]:
    """Every user of ``data``: the history before their last event (the last 50), k items wanted."""
    from retrieval.data import build_sequences, leave_one_out, load_interactions

    sequences = build_sequences(load_interactions(data))
    histories = leave_one_out(sequences).test_histories
    return [retrieval_pb2.RetrieveRequest(history=sequences.vocab.external(h[-50:]), k=k) for h in histories]


def processes_of(pid: int) -> list[int]:
    """``pid`` and its descendants (a serving group's supervisor, the fork server and the
    workers it forked), on Linux."""
    try:
        children = map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
    except OSError:
        return [pid]
    return [pid, *(one for child in children for one in processes_of(child))]


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, every thread) process ``pid`` and its children have used;
    ``None`` off Linux."""
    total = 0.0
    for one in processes_of(pid):
        try:
            fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def memory(pid: int) -> dict[str, float] | None:
    """Resident memory of process ``pid`` and its children in MB (``/proc/PID/smaps_rollup``):
    ``rss_mb`` sums their RSS, which counts a shared page in every process mapping it;
    ``pss_mb`` their PSS, which splits it among them, so a group's PSS is its real footprint.
    ``None`` off Linux."""
    totals = {"rss_mb": 0.0, "pss_mb": 0.0}
    for one in processes_of(pid):
        try:
            lines = Path(f"/proc/{one}/smaps_rollup").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            key, _, value = line.partition(":")
            if key in ("Rss", "Pss"):
                totals[f"{key.lower()}_mb"] += int(value.split()[0]) / 1024
    return {k: round(v, 1) for k, v in totals.items()}


async def load(
    address: str,
    batch: Sequence[retrieval_pb2.RetrieveRequest],
    concurrency: int,
    seconds: float,
    max_requests: int,
    server_pid: int | None = None,
    connections: int = 1,
) -> dict[str, Any]:
    """Keeps ``concurrency`` requests in flight for ``seconds`` (after a 1 s warm-up), over
    ``min(connections, concurrency)`` TCP connections (request slot ``c`` on connection
    ``c % connections``): a serving group's kernel spreads connections, not requests, over its
    workers, so one connection would reach one worker.

    Also reports the CPU milliseconds per measured request of this client process and of the
    server (``server_pid``): on a machine whose cores are all busy, ``cores / (client + server
    CPU per request)`` bounds the QPS any row can reach.
    """
    latencies: list[float] = []
    errors = 0
    # A local subchannel pool per channel: channels to one address would otherwise share a connection.
    channels = [
        grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(max(1, min(connections, concurrency)))
    ]
    stubs = [retrieval_pb2_grpc.RetrievalServiceStub(channel) for channel in channels]
    try:

        async def worker(offset: int, until: float, record: bool) -> None:
            nonlocal errors
            i, stub = offset, stubs[offset % len(stubs)]
            while time.perf_counter() < until and len(latencies) < max_requests:
                started = time.perf_counter()
                try:
                    await stub.Retrieve(batch[i % len(batch)], timeout=10)
                    if record:
                        latencies.append(time.perf_counter() - started)
                except grpc.RpcError:
                    errors += record
                i += concurrency

        await asyncio.gather(*(worker(c, time.perf_counter() + 1.0, False) for c in range(concurrency)))
        server_cpu = None if server_pid is None else cpu_seconds(server_pid)
        client_cpu = time.process_time()
        started = time.perf_counter()
        await asyncio.gather(*(worker(c, started + seconds, True) for c in range(concurrency)))
        elapsed = time.perf_counter() - started
        client_cpu = time.process_time() - client_cpu
        server_end = None if server_pid is None else cpu_seconds(server_pid)
    finally:
        for channel in channels:
            await channel.close(None)
    per_request = 1000 / max(len(latencies), 1)
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": errors,
        "qps": round(len(latencies) / elapsed, 1),
        **percentiles(latencies),
        "client_cpu_ms": round(client_cpu * per_request, 3),
        "server_cpu_ms": None
        if server_cpu is None or server_end is None
        else round((server_end - server_cpu) * per_request, 3),
    }


def measure(
    server: Started,
    sent: Sequence[retrieval_pb2.RetrieveRequest],
    concurrency: int,
    seconds: float,
    max_requests: int,
    connections: int,
) -> dict[str, Any]:
    """One row of a report: :func:`load` of ``server`` with ``sent`` at ``concurrency`` in flight,
    its ``server`` name and its ``server_memory`` (:func:`memory`) once measured."""
    measured = asyncio.run(
        load(server.address, sent, concurrency, seconds, max_requests, server.process.pid, connections)
    )
    return {"server": server.name, **measured, "server_memory": memory(server.process.pid)}


def percentiles(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99 in milliseconds of latencies in seconds."""
    ms = np.array(seconds) * 1000 if len(seconds) else np.zeros(1)
    return {f"p{q}_ms": round(float(np.percentile(ms, q)), 3) for q in (50, 90, 99)}


async def paired_load(
    address: str,
    plain: Sequence[retrieval_pb2.RetrieveRequest],
    other: Sequence[retrieval_pb2.RetrieveRequest],
    seconds: float,
    max_requests: int,
    twin: str = "rerank",
) -> dict[str, Any]:
    """One request in flight, alternating each user's plain request with its twin in ``other``
    (reranked, or explained: ``twin`` names them in the keys) on one server (after a 1 s
    warm-up): both latency sets see the same machine at the same time, so the difference of
    their percentiles is what the twin's option adds, free of the drift between rows measured
    minutes apart on a shared machine."""
    times: dict[str, list[float]] = {"plain": [], twin: []}
    async with grpc.aio.insecure_channel(address) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        for record, until in ((False, 1.0), (True, seconds)):
            i, end = 0, time.perf_counter() + until
            while time.perf_counter() < end and len(times[twin]) < max_requests:
                for kind, request in (("plain", plain[i % len(plain)]), (twin, other[i % len(other)])):
                    started = time.perf_counter()
                    await stub.Retrieve(request, timeout=10)
                    if record:
                        times[kind].append(time.perf_counter() - started)
                i += 1
    out: dict[str, Any] = {"twin": twin, "pairs": len(times[twin])}
    for kind, values in times.items():
        out.update({f"{kind}_{k}": v for k, v in percentiles(values).items()})
    for q in (50, 99):
        out[f"added_p{q}_ms"] = round(out[f"{twin}_p{q}_ms"] - out[f"plain_p{q}_ms"], 3)
    return out


async def batch_load(
    address: str,
    sent: Sequence[retrieval_pb2.RetrieveRequest],
    seconds: float,
    server_pid: int,
    users: int = BATCH_USERS,
) -> dict[str, Any]:
    """``BatchRetrieve`` calls of ``users`` users each, one in flight, for ``seconds`` (after a 1 s
    warm-up): the server's CPU milliseconds and the latency per user."""
    calls, errors = [], 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        for record, until in ((False, 1.0), (True, seconds)):
            i, end, cpu = 0, time.perf_counter() + until, cpu_seconds(server_pid)
            while time.perf_counter() < end:
                request = retrieval_pb2.BatchRetrieveRequest(
                    requests=[sent[(i + j) % len(sent)] for j in range(users)]
                )
                started = time.perf_counter()
                try:
                    await stub.BatchRetrieve(request, timeout=30)
                    if record:
                        calls.append(time.perf_counter() - started)
                except grpc.RpcError:
                    errors += record
                i += users
        end_cpu = cpu_seconds(server_pid)
    answered = max(len(calls) * users, 1)
    return {
        "users": users,
        "calls": len(calls),
        "errors": errors,
        "server_cpu_ms_per_user": None
        if cpu is None or end_cpu is None
        else round((end_cpu - cpu) * 1000 / answered, 3),
        "p50_ms_per_user": round(float(np.percentile(calls, 50)) * 1000 / users, 3) if calls else None,
    }


def explanation_kind(address: str, request: retrieval_pb2.RetrieveRequest) -> str:
    """The kind of explanation the server at ``address`` gives ``request`` (with ``explain``)."""
    with grpc.insecure_channel(address) as channel:
        response = retrieval_pb2_grpc.RetrievalServiceStub(channel).Retrieve(request, timeout=10)
    return (
        retrieval_pb2.ExplanationKind.Name(response.explanations.kind)
        .removeprefix("EXPLANATION_KIND_")
        .lower()
    )


def answerer(
    model_dir: Path,
    index_dir: Path,
    sent: Sequence[retrieval_pb2.RetrieveRequest],
    batch: int,
    xla: bool = False,
) -> Callable[[int], None]:
    """``answer(start)``: ``batch`` requests from ``sent`` (from ``start``, cyclically) parsed from
    the wire, answered with one ``retrieve_many`` and serialised, on one thread (``xla``: the
    user tower compiled, as ``tools/serve.py --xla``)."""
    import faiss

    from retrieval.api import query_from_request, response_from_result
    from retrieval.serving import Retriever

    faiss.omp_set_num_threads(1)
    retriever = Retriever.from_dirs(model_dir, index_dir, xla=xla)
    wire = [request.SerializeToString() for request in sent]

    def answer(start: int) -> None:
        chunk = [wire[(start + i) % len(wire)] for i in range(batch)]
        queries = [query_from_request(retrieval_pb2.RetrieveRequest.FromString(b)) for b in chunk]
        for result in retriever.retrieve_many(queries):
            response_from_result(result).SerializeToString()

    return answer


def ms_per_request(answer: Callable[[int], None], batch: int, requests_: int) -> float:
    """Milliseconds per request of ``answer`` over about ``requests_`` requests (after one warm-up)."""
    rounds = max(1, requests_ // batch)
    answer(0)
    started = time.perf_counter()
    for r in range(rounds):
        answer(r * batch)
    return (time.perf_counter() - started) * 1000 / (rounds * batch)


def compute_per_request(
    model_dir: Path, index_dir: Path, sent: Sequence[retrieval_pb2.RetrieveRequest], batch: int = 32
) -> float:
    """Milliseconds of server work per request without gRPC at ``batch`` (:func:`answerer`): the
    floor of the retrieval server's CPU per request (``python -m bench.floor`` splits it)."""
    return ms_per_request(answerer(model_dir, index_dir, sent, batch), batch, len(sent))


def run(args: argparse.Namespace) -> dict[str, Any]:
    model_dir, index_dir = build_artifacts(args.out, args.items, args.data, args.epochs)
    ranker_dir = build_ranker_artifact(args.out, model_dir)
    batch = requests(args.data, args.k)
    reranked = twins(batch, rerank=retrieval_pb2.Rerank(candidates=RERANK_CANDIDATES))
    explained = twins(batch, explain=True)
    serve = ["tools/serve.py", "--model", str(model_dir), "--index", str(index_dir), "--engine", "python"]
    serve += ["--processes", "1"]  # the last flag: a group's rows replace its value
    servers = {
        "echo": (["-m", "bench.serving", "--echo", "--k", str(args.k)], batch),
        RETRIEVAL: (serve, batch),
        RETRIEVAL_XLA: ([*serve, "--xla"], batch),
        NO_BATCHING: ([*serve, "--max-batch", "1"], batch),
        RERANK: ([*serve, "--ranker", str(ranker_dir)], reranked),
        RERANK_XLA: ([*serve, "--xla", "--ranker", str(ranker_dir)], reranked),
        NATIVE: ([*serve, "--engine", "native"], batch),
    }
    servers = {name: server for name, server in servers.items() if name in {ROWS[row] for row in args.rows}}
    for n in (n for n in args.processes if n > 1):
        servers[f"echo ({n} processes)"] = ([*servers["echo"][0], "--processes", str(n)], batch)
        servers[group_name(n)] = ([*serve[:-1], str(n)], batch)
    rows = []
    paired: dict[str, dict[str, Any]] = {}  # rerank server -> plain/reranked requests interleaved
    batched: dict[str, dict[str, Any]] = {}  # engine -> BatchRetrieve of BATCH_USERS users
    for name, (command, sent) in servers.items():
        log.info("starting %s", name)
        server = start(name, command)
        try:
            for concurrency in args.concurrency:
                rows.append(
                    measure(server, sent, concurrency, args.seconds, args.max_requests, args.connections)
                )
                log.info("%s", rows[-1])
            if name in (RERANK, RERANK_XLA):
                paired[name] = asyncio.run(
                    paired_load(server.address, batch, reranked, args.seconds, args.max_requests)
                )
                log.info("paired %s", paired[name])
            if name in (RETRIEVAL, NATIVE):
                batched[name] = asyncio.run(
                    batch_load(server.address, batch, args.seconds, server.process.pid)
                )
                log.info("BatchRetrieve %s", batched[name])
            if name == RETRIEVAL:
                paired[RETRIEVAL] = asyncio.run(
                    paired_load(server.address, batch, explained, args.seconds, args.max_requests, "explain")
                )
                paired[RETRIEVAL]["kind"] = explanation_kind(server.address, explained[0])
                log.info("paired %s", paired[RETRIEVAL])
        finally:
            server.stop()
    index_manifest = json.loads((index_dir / "manifest.json").read_text())
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m bench.serving " + " ".join(sys.argv[1:]),
        "commit": commit(),
        "items": args.items,
        "num_interests": 4,
        "k": args.k,
        "connections": args.connections,
        "index": f"{FACTORY} {SEARCH_PARAMS}",
        "index_recall": index_manifest.get("measured", {}).get("recall"),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "rows": rows,
        "paired": paired,
        "batched": batched,
        "compute_ms_per_request_at_32": round(compute_per_request(model_dir, index_dir, batch), 3),
        "checks": {**checks(rows, paired), **batch_checks(batched)},
    }


def batch_checks(batched: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The native engine's server CPU per user of a ``BatchRetrieve`` against
    :data:`NATIVE_BATCH_TARGET_MS` (and over the Python engine's), from the engines measured."""
    native = (batched.get(NATIVE) or {}).get("server_cpu_ms_per_user")
    if native is None:
        return {}
    out = {"native_batch_cpu_ms_per_user": native, "native_batch_ok": native <= NATIVE_BATCH_TARGET_MS}
    python = (batched.get(RETRIEVAL) or {}).get("server_cpu_ms_per_user")
    if python:
        out["native_batch_cpu_over_python"] = round(native / python, 3)
    return out


def checks(rows: list[dict[str, Any]], paired: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The targets, from the rows of this run (``_xla``: the same for the ``--xla`` server). The
    p99 a rerank adds is the paired measurement's (:func:`paired_load`) when there is one, else
    the difference between the rerank row and the retrieval row at concurrency 1."""
    by = {(r["server"], r["concurrency"]): r for r in rows}
    out: dict[str, Any] = {}
    echo = by.get(("echo", 32))
    for name, suffix in ((RETRIEVAL, ""), (RETRIEVAL_XLA, "_xla")):
        single, served = by.get((name, 1)), by.get((name, 32))
        if single:
            out[f"p99_at_1_ms{suffix}"] = single["p99_ms"]
            out[f"p99_at_1_ok{suffix}"] = single["p99_ms"] <= TARGET_P99_MS
        if echo and served:
            out[f"qps_share_of_echo_at_32{suffix}"] = round(served["qps"] / echo["qps"], 3)
            out[f"qps_share_ok{suffix}"] = served["qps"] >= TARGET_ECHO_SHARE * echo["qps"]
    for plain, rerank, suffix in ((RETRIEVAL, RERANK, ""), (RETRIEVAL_XLA, RERANK_XLA, "_xla")):
        single, reranked = by.get((plain, 1)), by.get((rerank, 1))
        if single and reranked:
            out[f"rerank_rows_added_p99_at_1_ms{suffix}"] = round(reranked["p99_ms"] - single["p99_ms"], 3)
        added = (
            (paired or {})
            .get(rerank, {})
            .get("added_p99_ms", out.get(f"rerank_rows_added_p99_at_1_ms{suffix}"))
        )
        if added is not None:
            out[f"rerank_added_p99_at_1_ms{suffix}"] = added
            out[f"rerank_added_p99_ok{suffix}"] = added <= TARGET_RERANK_P99_MS
    one, two = by.get((RETRIEVAL, 32)), by.get((group_name(2), 32))
    if one and two and one.get("server_memory") and two.get("server_memory"):
        for key in ("pss_mb", "rss_mb"):
            out[f"group_memory_{key[:3]}_ratio"] = round(
                two["server_memory"][key] / one["server_memory"][key], 3
            )
        out["group_memory_ok"] = out["group_memory_pss_ratio"] <= TARGET_GROUP_MEMORY
    if explain := (paired or {}).get(RETRIEVAL):
        out["explain_added_p50_at_1_ms"] = explain["added_p50_ms"]
        out["explain_added_p99_at_1_ms"] = explain["added_p99_ms"]
    out.update(native_checks(by))
    out["errors"] = sum(r["errors"] for r in rows)
    return out


def native_checks(by: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    """The native engine's measures against :data:`NATIVE_TARGETS` (``native_<measure>`` and
    ``native_<measure>_ok``), from the rows present."""
    one, eight, busy = (by.get((NATIVE, c)) for c in (1, 8, 32))
    python, echo = by.get((RETRIEVAL, 32)), by.get(("echo", 32))
    measures: dict[str, float] = {}
    if busy is not None:
        measures.update(p99_at_32_ms=busy["p99_ms"], server_cpu_at_32_ms=busy["server_cpu_ms"] or 0.0)
        if python is not None:
            measures["qps_over_python_at_32"] = busy["qps"] / python["qps"]
        if echo is not None:
            measures["qps_over_echo_at_32"] = busy["qps"] / echo["qps"]
    if one is not None:
        measures["p99_at_1_ms"] = one["p99_ms"]
    if eight is not None:
        measures["p99_at_8_ms"] = eight["p99_ms"]
    out: dict[str, Any] = {}
    for name, value in measures.items():
        target = NATIVE_TARGETS[name]
        out[f"native_{name}"] = round(value, 3)
        out[f"native_{name}_ok"] = value >= target if name.startswith("qps") else value <= target
    if busy and python and busy.get("server_memory") and python.get("server_memory"):
        ratio = busy["server_memory"]["rss_mb"] / python["server_memory"]["rss_mb"]
        out["native_rss_over_python"], out["native_rss_over_python_ok"] = round(ratio, 3), ratio <= 1.0
    for name, other in (("python", python), ("echo", echo)):
        if busy and other and busy["server_cpu_ms"] and other["server_cpu_ms"]:
            out[f"native_cpu_bound_over_{name}_at_32"] = round(cpu_bound(busy) / cpu_bound(other), 3)
    return out


def cpu_bound(row: dict[str, Any]) -> float:
    """The requests per second a row's server and client could answer on one core between them (1000
    / their CPU milliseconds per request): with every core busy, the rows' QPS stand in the ratio
    of these bounds."""
    return 1000 / (row["server_cpu_ms"] + row["client_cpu_ms"])


def rows_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The Markdown table of measured rows (:func:`load`'s, with ``server`` and
    ``server_memory``), one line each; CPU to the microsecond (the native engine's is ~0.3 ms)."""
    lines = [
        "| server | concurrency | QPS | p50 ms | p90 ms | p99 ms | errors | server CPU ms/req "
        "| client CPU ms/req | server RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        server_cpu = "–" if r.get("server_cpu_ms") is None else f"{r['server_cpu_ms']:.3f}"
        rss = "–" if not r.get("server_memory") else f"{r['server_memory']['rss_mb']:,.0f}"
        lines.append(
            f"| {r['server']} | {r['concurrency']} | {r['qps']:,.0f} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} "
            f"| {r['p99_ms']:.2f} | {r['errors']} | {server_cpu} | {r['client_cpu_ms']:.3f} | {rss} |"
        )
    return lines


def native_lines(results: dict[str, Any]) -> list[str]:
    """The native engine's verdicts against its targets, and each engine's ``BatchRetrieve``."""
    c, lines = results["checks"], []
    for name, target in NATIVE_TARGETS.items():
        if f"native_{name}" in c:
            bound = ">=" if name.startswith("qps") else "<="
            verdict = f"target {bound} {target}: {met(c[f'native_{name}_ok'])}"
            lines.append(f"{NATIVE}: {name} = {c[f'native_{name}']} ({verdict})")
    if "native_cpu_bound_over_python_at_32" in c or "native_cpu_bound_over_echo_at_32" in c:
        lines.append(
            f"{NATIVE}: QPS at 32 bounded by CPU (cores / (server + client CPU ms per request)) = "
            f"{c.get('native_cpu_bound_over_python_at_32')} x the Python engine's, "
            f"{c.get('native_cpu_bound_over_echo_at_32')} x the echo's"
        )
    if "native_rss_over_python" in c:
        lines.append(
            f"{NATIVE}: RSS / the Python engine's at 32 = {c['native_rss_over_python']} "
            f"(target <= 1: {met(c['native_rss_over_python_ok'])})"
        )
    for name, b in results.get("batched", {}).items():
        lines.append(
            f"{name}: BatchRetrieve of {b['users']} users, one in flight ({b['calls']} calls, "
            f"{b['errors']} errors): {b['server_cpu_ms_per_user']} ms of server CPU and "
            f"{b['p50_ms_per_user']} ms (p50) per user"
        )
    if "native_batch_cpu_ms_per_user" in c:
        lines.append(
            f"{NATIVE}: BatchRetrieve server CPU per user = {c['native_batch_cpu_ms_per_user']} ms "
            f"(target <= {NATIVE_BATCH_TARGET_MS}: {met(c['native_batch_ok'])}; "
            f"{c.get('native_batch_cpu_over_python')} x the Python engine's)"
        )
    return lines


def met(ok: Any) -> str:
    """A target's verdict."""
    return "met" if ok else "NOT met"


def table(results: dict[str, Any]) -> str:
    lines = [
        f"{results['items']:,} items, K={results['num_interests']}, k={results['k']}, "
        f"index {results['index']} (recall@50 {results['index_recall']}), "
        f"{results['cpus']} CPUs, {results['date']}, commit {results.get('commit', 'unknown')}, "
        f"load average at the end {', '.join(f'{x:.1f}' for x in results['load_average'])}",
        "",
        *rows_table(results["rows"]),
    ]
    c = results["checks"]
    lines.append("")
    for name, suffix in ((RETRIEVAL, ""), (RETRIEVAL_XLA, "_xla")):
        if f"p99_at_1_ms{suffix}" not in c and f"qps_share_of_echo_at_32{suffix}" not in c:
            continue  # a row --rows left out: no verdict
        lines.append(
            f"{name}: p99 at concurrency 1: {c.get('p99_at_1_ms' + suffix)} ms (target <= "
            f"{TARGET_P99_MS}: {met(c.get('p99_at_1_ok' + suffix))}); QPS at "
            f"concurrency 32 = {c.get('qps_share_of_echo_at_32' + suffix)} x echo (target >= "
            f"{TARGET_ECHO_SHARE}: {met(c.get('qps_share_ok' + suffix))})"
        )
    lines += native_lines(results)
    lines += [
        f"errors: {c['errors']}",
        f"Server work without gRPC (one thread, batches of 32): "
        f"{results.get('compute_ms_per_request_at_32')} ms per request. With every core busy, "
        f"QPS <= {results['cpus']} cores / (server + client CPU ms per request).",
    ]
    for name, r in results.get("paired", {}).items():
        twin = r.get("twin", "rerank")
        kind = f" (explanations: {r['kind']})" if "kind" in r else ""
        lines.append(
            f"{name}, plain and {twin} requests interleaved at concurrency 1 ({r['pairs']} pairs){kind}: "
            f"p50 {r['plain_p50_ms']:.2f} -> {r[twin + '_p50_ms']:.2f} ms, p99 {r['plain_p99_ms']:.2f} -> "
            f"{r[twin + '_p99_ms']:.2f} ms"
        )
    for suffix, server in (("", RERANK), ("_xla", RERANK_XLA)):
        if f"rerank_added_p99_at_1_ms{suffix}" not in c:
            continue
        lines.append(
            f"p99 added by the DIN rerank of {RERANK_CANDIDATES} candidates at concurrency 1 ({server}"
            f"{', interleaved' if server in results.get('paired', {}) else ', between rows'}): "
            f"{c.get('rerank_added_p99_at_1_ms' + suffix)} ms (target <= "
            f"{TARGET_RERANK_P99_MS}: {met(c.get('rerank_added_p99_ok' + suffix))})"
        )
    for r in results["rows"]:
        if r.get("server_memory") and r["concurrency"] == max(x["concurrency"] for x in results["rows"]):
            lines.append(
                f"{r['server']}: memory after the run {r['server_memory']['pss_mb']:,.0f} MB PSS "
                f"({r['server_memory']['rss_mb']:,.0f} MB RSS)"
            )
    if "group_memory_pss_ratio" in c:
        lines.append(
            f"2 processes / 1 process memory: PSS x{c['group_memory_pss_ratio']} (target <= "
            f"{TARGET_GROUP_MEMORY}: {met(c['group_memory_ok'])}), "
            f"RSS x{c['group_memory_rss_ratio']}"
        )
    if "explain_added_p99_at_1_ms" in c:
        lines.append(
            f"added by explain=true at concurrency 1 ({RETRIEVAL}, interleaved): "
            f"p50 {c['explain_added_p50_at_1_ms']} ms, p99 {c['explain_added_p99_at_1_ms']} ms"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=1_000_000, help="catalogue size (default %(default)s)")
    p.add_argument("--data", type=Path, help="ML-100K folder (default: ml100k in --data-root)")
    add_data_root_argument(p)
    p.add_argument("--epochs", type=int, default=3, help="training epochs of the base model")
    p.add_argument("--k", type=int, default=50, help="items per request (default %(default)s)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], help="default %(default)s")
    p.add_argument(
        "--connections",
        type=int,
        default=16,
        help="client connections, at most one per call in flight (default %(default)s)",
    )
    p.add_argument(
        "--seconds", type=float, default=10.0, help="measured seconds per row (default %(default)s)"
    )
    p.add_argument("--max-requests", type=int, default=200_000, help="measured requests per row at most")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "bench-serving", help="default %(default)s")
    p.add_argument(
        "--processes",
        type=int,
        nargs="+",
        default=[1],
        help="also rows for serving groups of these sizes (> 1), and echoes of as many processes",
    )
    p.add_argument(
        "--rows",
        nargs="+",
        choices=list(ROWS),
        default=list(ROWS),
        help="the servers measured (default: all)",
    )
    p.add_argument("--echo", action="store_true", help=argparse.SUPPRESS)  # run the echo server
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.data = args.data or dataset_file("ml100k", args.data_root)
    if args.items < 200_000 or args.seconds <= 0 or args.max_requests < 1 or min(args.concurrency) < 1:
        p.error(
            "need --items >= 200000 (the index has 4096 lists), --seconds > 0, --max-requests >= 1 "
            "and concurrency >= 1"
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = parse_args(argv)
    if args.echo:
        serve_echo(args.port, args.k, workers=64, processes=max(args.processes))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    results = run(args)
    write_report(args.out, results, table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
