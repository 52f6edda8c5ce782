"""The native engine's skeleton under load (issue 44), beside the bare grpcio echo, in one run.

    python -m bench.native_echo                          # 100k x 64 items, 5 s per row, 1/8/32 in flight
    python -m bench.native_echo --items 20000 --seconds 2     # a quicker run

Rows, each server in its own process on 127.0.0.1 (started as :mod:`bench.serving` starts its
servers), loaded by :func:`bench.serving.load` (one asyncio grpcio client process keeping 1, 8
and 32 calls in flight over up to 16 connections, after a one-second warm-up):

* ``echo (grpcio)``: :mod:`bench.serving`'s echo, a Python gRPC server answering every Retrieve
  with a prebuilt 50-item response: grpcio's own per-call cost;
* ``native, fixed arrays``: the native server (``retrieval.serving.NativeServer``) with a kernel
  returning prebuilt arrays: the C++ path (parse, vocabulary lookup, batching, one Python call
  per batch, merge, response) with no compute;
* ``native, numpy brute force``: the same with an exact search in numpy over ``--items`` random
  ``--dim``-vectors, the K = 4 interests standing in for a tower being the vectors of the
  history's last 4 items (BLAS on one thread).

Requests are ``--requests`` random histories of 50 of the items, k = 50. Each row reports QPS,
p50/p99 latency, errors and the CPU milliseconds per request of the server process and the
client; the kernels alone (no gRPC) are timed at batches of 1 and 32, in CPU time. Prints a
Markdown table and writes ``results.json`` and ``table.md`` to ``--out``.

``--kernel`` times the real kernel instead (:class:`retrieval.serving.native_kernel.NativeKernel`:
the user tower and the FAISS search of :mod:`bench.serving`'s deployment, ``--items`` of them,
built and cached as that benchmark builds it) on the ML-100K users' histories with k = 50, at
batches of 1, 8 and 32, in CPU milliseconds per request of this one-threaded process, beside
the Python engine's ``retrieve_many`` of the same requests (lookup, tower, search, merge and
answers, no gRPC) and its ``retrieve_many`` alone::

    python -m bench.native_echo --kernel --items 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.context import commit, load_average, machine
from bench.data import REPO, add_data_root_argument, dataset_file
from bench.serving import load, start
from retrieval.api import MAX_BATCH
from retrieval.api.v1 import retrieval_pb2
from retrieval.serving import NativeServer

log = logging.getLogger("bench.native_echo")

NUM_INTERESTS, HISTORY, K, MAX_LEN = 4, 50, 50, 50
KERNELS = ("fixed", "numpy")
ROW_NAMES = {"fixed": "native, fixed arrays", "numpy": "native, numpy brute force"}


def vocabulary(items: int) -> list[str]:
    """The external ids: ``item0`` is dense id 1."""
    return [f"item{i}" for i in range(items)]


def item_vectors(items: int, dim: int, seed: int = 0) -> np.ndarray:
    """float32 ``[items + 1, dim]`` random vectors, row 0 (padding) zero."""
    vectors = np.random.default_rng(seed).normal(size=(items + 1, dim)).astype(np.float32)
    vectors[0] = 0.0
    return vectors


def fixed_kernel(items: int) -> Any:
    """A kernel answering every row with the same ``[K, n]`` candidates (ids 1..n, decreasing
    scores), sliced from arrays built once: the cost of the native path around the kernel."""
    n = min(items, 2 * K + HISTORY)
    shape = (MAX_BATCH, NUM_INTERESTS, n)  # a Retrieve batch has at most max_batch (32) rows
    ids = np.ascontiguousarray(np.broadcast_to(np.arange(1, n + 1, dtype=np.int64), shape))
    scores = np.ascontiguousarray(np.broadcast_to(-np.arange(n, dtype=np.float32), shape))

    def kernel(histories: np.ndarray, fetch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return ids[: len(histories)], scores[: len(histories)]

    return kernel


def numpy_kernel(vectors: np.ndarray) -> Any:
    """An exact search over ``vectors[1:]``: per row, the interests are the vectors of the
    history's last NUM_INTERESTS items; per interest the ``max(fetch)`` best items, best first."""
    table = np.ascontiguousarray(vectors[1:])

    def kernel(histories: np.ndarray, fetch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows, n = len(histories), int(fetch.max())
        interests = vectors[histories[:, -NUM_INTERESTS:]].reshape(rows * NUM_INTERESTS, -1)
        scores = interests @ table.T  # [B·K, items]
        top = np.argpartition(scores, scores.shape[1] - n, axis=1)[:, -n:]  # the n best, unordered
        top_scores = np.take_along_axis(scores, top, axis=1)
        order = np.argsort(-top_scores, axis=1, kind="stable")
        ids = np.take_along_axis(top, order, axis=1) + 1
        best = np.take_along_axis(top_scores, order, axis=1)
        return ids.reshape(rows, NUM_INTERESTS, n).astype(np.int64), best.reshape(rows, NUM_INTERESTS, n)

    return kernel


def make_kernel(name: str, items: int, dim: int) -> Any:
    return fixed_kernel(items) if name == "fixed" else numpy_kernel(item_vectors(items, dim))


def serve(kernel_name: str, port: int, items: int, dim: int) -> None:
    """Runs a native server with kernel ``kernel_name`` on 127.0.0.1:``port`` until SIGTERM."""
    stopping = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stopping)  # before gRPC's threads start: they inherit it
    server = NativeServer(make_kernel(kernel_name, items, dim), vocabulary(items), max_len=MAX_LEN)
    server.start(f"127.0.0.1:{port}")
    signal.sigwait(stopping)
    server.stop(5.0)
    log.info("counters %s", server.counters())


def requests(items: int, count: int, seed: int = 1) -> list[retrieval_pb2.RetrieveRequest]:
    """``count`` random histories of HISTORY items, k = K."""
    rng = np.random.default_rng(seed)
    ids = vocabulary(items)
    return [
        retrieval_pb2.RetrieveRequest(history=[ids[i] for i in rng.integers(0, items, HISTORY)], k=K)
        for _ in range(count)
    ]


def kernel_ms(name: str, items: int, dim: int, batch: int, rounds: int = 20) -> float:
    """CPU milliseconds per request of kernel ``name`` alone on batches of ``batch`` (this
    process's CPU time, comparable to the servers' CPU per request whatever its BLAS threads)."""
    kernel = make_kernel(name, items, dim)
    rng = np.random.default_rng(2)
    histories = rng.integers(1, items + 1, (batch, MAX_LEN)).astype(np.int32)
    fetch = np.full(batch, K + HISTORY, np.int32)
    kernel(histories, fetch)
    started = time.process_time()
    for _ in range(rounds):
        kernel(histories, fetch)
    return (time.process_time() - started) * 1000 / (rounds * batch)


def kernel_inputs(kernel: Any, sent: Sequence[retrieval_pb2.RetrieveRequest]) -> list[tuple[np.ndarray, int]]:
    """Per request, what the C++ side hands the kernel for it: its known history, the last
    ``max_len`` ids left-padded (int32 ``[max_len]``), and its fetch (k + its excluded ids)."""
    model = kernel.retriever.model
    rows = []
    for request in sent:
        dense = model.vocab.lookup(list(request.history))
        known = dense[(dense > 0) & (dense <= model.tower_items)][-model.max_len :]
        row = np.zeros(model.max_len, np.int32)
        row[model.max_len - len(known) :] = known
        rows.append((row, request.k + len(np.unique(dense[dense > 0]))))
    return rows


def kernel_cpu_ms(args: argparse.Namespace) -> dict[str, Any]:
    """CPU ms per request of the real kernel and of the Python engine at batches 1, 8 and 32."""
    import faiss

    from bench.serving import build_artifacts
    from bench.serving import requests as user_requests
    from retrieval.api import query_from_request
    from retrieval.serving import NativeKernel, Retriever

    faiss.omp_set_num_threads(1)
    data = args.data or dataset_file("ml100k", args.data_root)
    model_dir, index_dir = build_artifacts(args.artifacts, args.items, data, 3)
    sent = user_requests(data, K)
    retriever = Retriever.from_dirs(model_dir, index_dir)
    kernel = NativeKernel(retriever)
    rows = kernel_inputs(kernel, sent)
    queries = [query_from_request(r) for r in sent]
    none = np.zeros(0, np.int32)

    def search(start: int, batch: int) -> None:
        chunk = [rows[(start + i) % len(rows)] for i in range(batch)]
        histories = np.stack([h for h, _ in chunk])
        fetch = np.array([f for _, f in chunk], np.int32)
        kernel.search(histories, fetch, np.full(batch, -1, np.int32), [], None, False, none)

    def engine(start: int, batch: int) -> None:
        retriever.retrieve_many([queries[(start + i) % len(queries)] for i in range(batch)])

    out: dict[str, Any] = {"items": args.items, "requests": len(sent)}
    for name, work in (("kernel", search), ("python engine retrieve_many", engine)):
        for batch in (1, 8, 32):
            rounds = max(1, args.kernel_requests // batch)
            work(0, batch)  # warm-up (the tower traces once per batch size)
            started = time.process_time()
            for r in range(rounds):
                work(r * batch, batch)
            out[f"{name} at {batch}"] = round((time.process_time() - started) * 1000 / (rounds * batch), 4)
            log.info("%s at %d: %.4f CPU ms per request", name, batch, out[f"{name} at {batch}"])
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"  # the servers' BLAS
    sent = requests(args.items, args.requests)
    servers = {"echo (grpcio)": ["-m", "bench.serving", "--echo", "--k", str(K)]}
    for name in KERNELS:
        servers[ROW_NAMES[name]] = [
            "-m", "bench.native_echo", "--serve", name, "--items", str(args.items), "--dim", str(args.dim),
        ]  # fmt: skip
    rows = []
    for name, command in servers.items():
        log.info("starting %s", name)
        server = start(name, command)
        try:
            for concurrency in args.concurrency:
                measured = asyncio.run(
                    load(
                        server.address,
                        sent,
                        concurrency,
                        args.seconds,
                        args.max_requests,
                        server.process.pid,
                        16,
                    )
                )
                rows.append({"server": name, **measured})
                log.info("%s", rows[-1])
        finally:
            server.stop()
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": machine(),
        "load_average": load_average(),
        "command": "python -m bench.native_echo " + " ".join(sys.argv[1:]),
        "items": args.items,
        "dim": args.dim,
        "rows": rows,
        "kernel_ms_per_request": {
            f"{name} at {batch}": round(kernel_ms(name, args.items, args.dim, batch), 4)
            for name in KERNELS
            for batch in (1, 32)
        },
    }


def table(results: dict[str, Any]) -> str:
    lines = [
        f"{results['items']:,} items x {results['dim']}, K={NUM_INTERESTS}, k={K}, histories of {HISTORY}; "
        f"{results['machine']}, load {results['load_average']}, commit {results['commit']}, "
        f"{results['date']}",
        "",
        "| server | in flight | QPS | p50 ms | p99 ms | errors | server CPU ms/req | client CPU ms/req |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        server_cpu = "–" if r.get("server_cpu_ms") is None else f"{r['server_cpu_ms']:.3f}"
        lines.append(
            f"| {r['server']} | {r['concurrency']} | {r['qps']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
            f"| {r['errors']} | {server_cpu} | {r['client_cpu_ms']:.3f} |"
        )
    kernels = ", ".join(f"{name}: {ms:.3f}" for name, ms in results["kernel_ms_per_request"].items())
    lines += ["", f"Kernels alone, CPU ms per request at batches of 1 and 32: {kernels}"]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=100_000, help="catalogue size (default %(default)s)")
    p.add_argument("--dim", type=int, default=64, help="vector dimension (default %(default)s)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], help="default %(default)s")
    p.add_argument(
        "--seconds", type=float, default=5.0, help="measured seconds per row (default %(default)s)"
    )
    p.add_argument("--max-requests", type=int, default=200_000, help="measured requests per row at most")
    p.add_argument("--requests", type=int, default=500, help="distinct requests sent in turn")
    p.add_argument(
        "--out", type=Path, default=REPO / "runs" / "bench-native-echo", help="default %(default)s"
    )
    p.add_argument("--kernel", action="store_true", help="time the real kernel (see above) instead")
    p.add_argument("--kernel-requests", type=int, default=2000, help="requests per batch size (--kernel)")
    p.add_argument(
        "--artifacts",
        type=Path,
        default=REPO / "runs" / "bench-serving",
        help="where bench.serving caches its deployment (--kernel; default %(default)s)",
    )
    p.add_argument("--data", type=Path, help="ML-100K folder (--kernel; default: ml100k in --data-root)")
    add_data_root_argument(p)
    p.add_argument("--serve", choices=KERNELS, help=argparse.SUPPRESS)  # run a native server
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.items < 2 * K + HISTORY or args.seconds <= 0 or min(args.concurrency) < 1:
        p.error(f"need --items >= {2 * K + HISTORY}, --seconds > 0 and concurrency >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = parse_args(argv)
    if args.serve:
        serve(args.serve, args.port, args.items, args.dim)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.kernel:
        measured = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "commit": commit(),
            "machine": machine(),
            "load_average": load_average(),
            "command": "python -m bench.native_echo " + " ".join(sys.argv[1:]),
            "cpu_ms_per_request": kernel_cpu_ms(args),
        }
        (args.out / "kernel.json").write_text(json.dumps(measured, indent=2))
        print(json.dumps(measured, indent=2))
        return 0
    results = run(args)
    text = table(results)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
