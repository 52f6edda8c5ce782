"""The native engine under load (issue 44), beside the bare grpcio echo and the Python engine, in one run.

    python -m bench.native_echo                          # toy rows: 100k x 64 items, 5 s per row
    python -m bench.native_echo --rows echo python native --deployment-items 1000000
    python -m bench.native_echo --kernel --deployment-items 1000000     # the kernel alone

Rows (``--rows``), each server in its own process on 127.0.0.1 (started as :mod:`bench.serving`
starts its servers), loaded by :func:`bench.serving.load` (one asyncio grpcio client process
keeping 1, 8 and 32 calls in flight over up to 16 connections, after a one-second warm-up):

* ``echo``: :mod:`bench.serving`'s echo, a Python gRPC server answering every Retrieve with a
  prebuilt 50-item response: grpcio's own per-call cost;
* ``fixed``: the native server with a toy kernel returning prebuilt arrays: the C++ path (parse,
  checks, vocabulary lookup, batching, one Python call per batch, merge, response) with no
  compute, on a ``--items`` catalogue with random histories of 50 of its items;
* ``numpy``: the same with an exact search in numpy over ``--items`` random ``--dim``-vectors, the
  K = 4 interests standing in for a tower being the vectors of the history's last 4 items (BLAS
  on one thread);
* ``python`` and ``native``: the Python engine (``tools/serve.py``, one process) and the native
  engine (:class:`retrieval.serving.NativeServer` serving
  :func:`~retrieval.serving.native_servable` of the loaded retriever) on :mod:`bench.serving`'s
  deployment of ``--deployment-items`` items (ComiRec-SA, K = 4, ``L2MIPS,IVF4096,Flat`` at
  ``nprobe=8``, built and cached as that benchmark builds it), with its requests: the ML-100K
  users' histories, k = 50.

Each row reports QPS, p50/p99 latency, errors, the CPU milliseconds per request of the server
process and the client, and the server's resident memory once measured. The toy kernels alone
(no gRPC) are timed at batches of 1 and 32, in CPU time. Prints a Markdown table and writes
``results.json`` and ``table.md`` to ``--out``.

``--kernel`` times the real kernel instead (:class:`retrieval.serving.NativeKernel`: the user
tower and the FAISS search of the deployment) on the same requests at batches of 1, 8 and 32, in
CPU milliseconds per request of this one-threaded process, beside the Python engine's
``retrieve_many`` of the same requests (lookup, tower, search, merge and answers, no gRPC).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.context import load_average, measured, run_meta, write_report
from bench.data import REPO, add_data_root_argument, dataset_file
from bench.serving import build_artifacts, measure, rows_table, start
from bench.serving import requests as user_requests
from retrieval.api import MAX_BATCH
from retrieval.api.v1 import retrieval_pb2
from retrieval.serving import NativeServable, NativeServer, trimmer

log = logging.getLogger("bench.native_echo")

NUM_INTERESTS, HISTORY, K, MAX_LEN = 4, 50, 50, 50
ROWS = {
    "echo": "echo (grpcio)",
    "fixed": "native, fixed arrays",
    "numpy": "native, numpy brute force",
    "python": "python engine",
    "native": "native engine",
}
TOYS = ("fixed", "numpy")


def vocabulary(items: int) -> list[str]:
    """The external ids: ``item0`` is dense id 1."""
    return [f"item{i}" for i in range(items)]


def item_vectors(items: int, dim: int, seed: int = 0) -> np.ndarray:
    """float32 ``[items + 1, dim]`` random vectors, row 0 (padding) zero."""
    vectors = np.random.default_rng(seed).normal(size=(items + 1, dim)).astype(np.float32)
    vectors[0] = 0.0
    return vectors


class ToyKernel:
    """A toy kernel's search, and the calls no toy request needs."""

    def alone(self, *_: Any) -> Any:
        raise NotImplementedError("the toy rows' requests never come back short")

    def rescore(self, *_: Any) -> Any:
        raise NotImplementedError("the toy rows' requests ask for no DIVERSITY merge")

    def rerank(self, *_: Any) -> Any:
        raise NotImplementedError("the toy rows' requests ask for no rerank")


class FixedKernel(ToyKernel):
    """Answers every row with the same ``[K, n]`` candidates (ids 1..n, decreasing scores), sliced
    from arrays built once: the cost of the native path around the kernel."""

    def __init__(self, items: int, dim: int) -> None:
        n = min(items, 2 * K + HISTORY)
        shape = (MAX_BATCH, NUM_INTERESTS, n)  # a batch has at most max_batch rows
        self.ids = np.ascontiguousarray(np.broadcast_to(np.arange(1, n + 1, dtype=np.int64), shape))
        self.scores = np.ascontiguousarray(np.broadcast_to(-np.arange(n, dtype=np.float32), shape))
        self.fetched = np.full(MAX_BATCH, n, np.int32)
        self.interests = np.ones((MAX_BATCH, NUM_INTERESTS, dim), np.float32)

    def search(self, histories: np.ndarray, *_: Any) -> tuple[Any, ...]:
        rows = len(histories)
        return self.ids[:rows], self.scores[:rows], self.fetched[:rows], self.interests[:rows], None


class NumpyKernel(ToyKernel):
    """An exact search over ``vectors[1:]``: per row, the interests are the vectors of the
    history's last NUM_INTERESTS items; per interest the ``max(fetch)`` best items, best first."""

    def __init__(self, vectors: np.ndarray) -> None:
        self.vectors, self.table = vectors, np.ascontiguousarray(vectors[1:])

    def search(self, histories: np.ndarray, fetch: np.ndarray, *_: Any) -> tuple[Any, ...]:
        rows, n = len(histories), int(fetch.max())
        interests = self.vectors[histories[:, -NUM_INTERESTS:]]  # [B, K, d]
        scores = interests.reshape(rows * NUM_INTERESTS, -1) @ self.table.T  # [B·K, items]
        top = np.argpartition(scores, scores.shape[1] - n, axis=1)[:, -n:]  # the n best, unordered
        top_scores = np.take_along_axis(scores, top, axis=1)
        order = np.argsort(-top_scores, axis=1, kind="stable")
        ids = (np.take_along_axis(top, order, axis=1) + 1).reshape(rows, NUM_INTERESTS, n)
        best = np.take_along_axis(top_scores, order, axis=1).reshape(rows, NUM_INTERESTS, n)
        return ids.astype(np.int64), best, np.full(rows, n, np.int32), interests, None


def toy_servable(name: str, items: int, dim: int) -> NativeServable:
    """The servable of toy kernel ``name`` over ``items`` items of dimension ``dim``."""
    return NativeServable(
        kernel=FixedKernel(items, dim) if name == "fixed" else NumpyKernel(item_vectors(items, dim)),
        vocabulary=vocabulary(items),
        tower_items=items,
        model_version="toy",
        max_len=MAX_LEN,
        num_interests=NUM_INTERESTS,
        num_items=items,
        category_members={},
        category_codes=np.arange(items + 1, dtype=np.int64),
        explanation="unavailable",
        rankers={},
        side_features=False,
        model_info=retrieval_pb2.ModelInfo(model_version="toy").SerializeToString(),
    )


def deployment(args: argparse.Namespace) -> tuple[Path, Path]:
    """bench.serving's model and index folders of ``--deployment-items`` items (built once, cached)."""
    return build_artifacts(args.artifacts, args.deployment_items, data_folder(args), 3)


def data_folder(args: argparse.Namespace) -> Path:
    return Path(args.data or dataset_file("ml100k", args.data_root))


def serve(args: argparse.Namespace) -> None:
    """Runs a native server of ``--serve`` (a toy kernel, or the deployment) on 127.0.0.1:``--port``
    until SIGTERM."""
    stopping = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stopping)  # before gRPC's threads start: they inherit it
    timers: dict[str, float] = {}
    if args.serve == "native":
        from retrieval.serving import Retriever, native_servable

        retriever = Retriever.from_dirs(*deployment(args))
        if args.stages_out:
            time_kernel(retriever, timers)
        servable = native_servable(retriever)
        del retriever  # the kernel keeps it
    else:
        servable = toy_servable(args.serve, args.items, args.dim)
    server = NativeServer(servable)
    del servable  # the engine holds what it needs: the Python vocabulary and tables can go
    trimmer().trim()
    server.start(f"127.0.0.1:{args.port}")
    signal.sigwait(stopping)
    server.stop(5.0)
    log.info("counters %s", server.counters())
    if args.stages_out:
        Path(args.stages_out).write_text(json.dumps({"counters": server.counters(), **timers}))


def time_kernel(retriever: Any, seconds: dict[str, float]) -> None:
    """Adds each call's time of the retriever's user tower to ``seconds["tower"]`` and of its
    index search to ``seconds["faiss"]`` (as the kernel calls them; wall time on the batcher's
    thread, which holds the GIL throughout)."""
    seconds.update(tower=0.0, faiss=0.0)

    def timed(function: Any, key: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                seconds[key] += time.perf_counter() - started

        return call

    retriever.model = dataclasses.replace(
        retriever.model, user_vectors=timed(retriever.model.user_vectors, "tower")
    )
    retriever.index.search = timed(retriever.index.search, "faiss")


def random_requests(items: int, count: int, seed: int = 1) -> list[retrieval_pb2.RetrieveRequest]:
    """``count`` random histories of HISTORY items, k = K."""
    rng = np.random.default_rng(seed)
    ids = vocabulary(items)
    return [
        retrieval_pb2.RetrieveRequest(history=[ids[i] for i in rng.integers(0, items, HISTORY)], k=K)
        for _ in range(count)
    ]


def toy_kernel_ms(name: str, items: int, dim: int, batch: int, rounds: int = 20) -> float:
    """CPU milliseconds per request of toy kernel ``name`` alone on batches of ``batch`` (this
    process's CPU time, comparable to the servers' CPU per request whatever its BLAS threads)."""
    kernel = toy_servable(name, items, dim).kernel
    histories = np.random.default_rng(2).integers(1, items + 1, (batch, MAX_LEN)).astype(np.int32)
    fetch = np.full(batch, K + HISTORY, np.int32)
    none = np.zeros(0, np.int32)
    kernel.search(histories, fetch, np.full(batch, -1, np.int32), [], None, False, none)
    started = time.process_time()
    for _ in range(rounds):
        kernel.search(histories, fetch, np.full(batch, -1, np.int32), [], None, False, none)
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

    from retrieval.api import query_from_request
    from retrieval.serving import NativeKernel, Retriever

    faiss.omp_set_num_threads(1)
    sent = user_requests(data_folder(args), K)
    retriever = Retriever.from_dirs(*deployment(args))
    kernel = NativeKernel(retriever)
    rows = kernel_inputs(kernel, sent)
    queries = [query_from_request(r) for r in sent]
    none = np.zeros(0, np.int32)

    def search(start: int, batch: int) -> None:
        chunk = [rows[(start + i) % len(rows)] for i in range(batch)]
        histories = np.stack([h for h, _ in chunk])
        fetch = np.array([f for _, f in chunk], np.int32)
        kernel.search(histories, fetch, np.full(batch, -1, np.int32), [], None, True, none)

    def engine(start: int, batch: int) -> None:
        retriever.retrieve_many([queries[(start + i) % len(queries)] for i in range(batch)])

    out: dict[str, Any] = {"items": args.deployment_items, "requests": len(sent)}
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
    meta = run_meta("python -m bench.native_echo " + " ".join(sys.argv[1:]))
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"  # the servers' BLAS
    toy = random_requests(args.items, args.requests)
    sizes = ["--items", str(args.items), "--dim", str(args.dim)]
    own = ["--deployment-items", str(args.deployment_items), "--artifacts", str(args.artifacts)]
    commands: dict[str, tuple[list[str], list[retrieval_pb2.RetrieveRequest]]] = {
        "echo": (["-m", "bench.serving", "--echo", "--k", str(K)], toy),
        "fixed": (["-m", "bench.native_echo", "--serve", "fixed", *sizes], toy),
        "numpy": (["-m", "bench.native_echo", "--serve", "numpy", *sizes], toy),
    }
    if {"python", "native"} & set(args.rows):
        model_dir, index_dir = deployment(args)
        users = user_requests(data_folder(args), K)
        python = ["tools/serve.py", "--model", str(model_dir), "--index", str(index_dir), "--processes", "1"]
        commands["python"] = (python, users)
        commands["native"] = (["-m", "bench.native_echo", "--serve", "native", *own], users)
    rows = []
    for key in args.rows:
        command, sent = commands[key]
        log.info("starting %s", ROWS[key])
        server = start(ROWS[key], command)
        try:
            for concurrency in args.concurrency:
                rows.append(measure(server, sent, concurrency, args.seconds, args.max_requests, 16))
                log.info("%s", rows[-1])
        finally:
            server.stop()
    return {
        **meta,
        "load_end": load_average(2),
        "items": args.items,
        "dim": args.dim,
        "deployment_items": args.deployment_items,
        "rows": rows,
        "kernel_ms_per_request": {
            f"{name} at {batch}": round(toy_kernel_ms(name, args.items, args.dim, batch), 4)
            for name in TOYS
            if name in args.rows
            for batch in (1, 32)
        },
    }


def table(results: dict[str, Any]) -> str:
    lines = [
        *measured(results),
        "",
        f"toy rows: {results['items']:,} items x {results['dim']}, K={NUM_INTERESTS}, k={K}, histories of "
        f"{HISTORY}; engine rows: bench.serving's {results['deployment_items']:,}-item deployment",
        "",
        *rows_table(results["rows"]),
    ]
    if results["kernel_ms_per_request"]:
        kernels = ", ".join(f"{name}: {ms:.3f}" for name, ms in results["kernel_ms_per_request"].items())
        lines += ["", f"Toy kernels alone, CPU ms per request at batches of 1 and 32: {kernels}"]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--rows", nargs="+", choices=list(ROWS), default=["echo", *TOYS], help="servers (default %(default)s)"
    )
    p.add_argument("--items", type=int, default=100_000, help="toy catalogue size (default %(default)s)")
    p.add_argument("--dim", type=int, default=64, help="toy vector dimension (default %(default)s)")
    p.add_argument(
        "--deployment-items",
        type=int,
        default=1_000_000,
        help="bench.serving's deployment (default %(default)s)",
    )
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], help="default %(default)s")
    p.add_argument(
        "--seconds", type=float, default=5.0, help="measured seconds per row (default %(default)s)"
    )
    p.add_argument("--max-requests", type=int, default=200_000, help="measured requests per row at most")
    p.add_argument("--requests", type=int, default=500, help="distinct toy requests sent in turn")
    p.add_argument(
        "--out", type=Path, default=REPO / "runs" / "bench-native-echo", help="default %(default)s"
    )
    p.add_argument("--kernel", action="store_true", help="time the real kernel (see above) instead")
    p.add_argument("--kernel-requests", type=int, default=2000, help="requests per batch size (--kernel)")
    p.add_argument(
        "--artifacts",
        type=Path,
        default=REPO / "runs" / "bench-serving",
        help="where bench.serving caches its deployment (default %(default)s)",
    )
    p.add_argument("--data", type=Path, help="ML-100K folder (default: ml100k in --data-root)")
    add_data_root_argument(p)
    p.add_argument("--serve", choices=[*TOYS, "native"], help=argparse.SUPPRESS)  # run a native server
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--stages-out", type=Path, help=argparse.SUPPRESS)  # --serve native: write its timers
    args = p.parse_args(argv)
    if args.items < 2 * K + HISTORY or args.seconds <= 0 or min(args.concurrency) < 1:
        p.error(f"need --items >= {2 * K + HISTORY}, --seconds > 0 and concurrency >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = parse_args(argv)
    if args.serve:
        serve(args)
        return 0
    if args.kernel:
        kernel = {
            **run_meta("python -m bench.native_echo " + " ".join(sys.argv[1:])),
            "cpu_ms_per_request": kernel_cpu_ms(args),
        }
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "kernel.json").write_text(json.dumps(kernel, indent=2))
        print(json.dumps(kernel, indent=2))
        return 0
    results = run(args)
    write_report(args.out, results, table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
