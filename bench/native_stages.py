"""Where the native engine's time goes (issue 44): per request, stage by stage, beside ``bench.floor``'s.

    python -m bench.native_stages                      # 1M items, 32 in flight, 10 s
    python -m bench.native_stages --env OMP_WAIT_POLICY=PASSIVE    # the server under another setting
    python -m bench.native_stages --faiss --env OPENBLAS_CORETYPE=Haswell     # the kernel's costs

The native engine serves ``bench.serving``'s deployment (ComiRec-SA, K = 4, d = 64,
``L2MIPS,IVF4096,Flat`` at ``nprobe=8``, k = 50; ``python -m bench.native_echo --serve native`` in
a child process, FAISS on one thread, TensorFlow's pools of one thread as ``mitt serve --engine
native`` sets them: :func:`retrieval.environment.single_threaded_tensorflow`) and is loaded by
:func:`bench.serving.load` with the ML-100K users' requests at ``--concurrency`` in flight for
``--seconds``. The server's own stage timers (:meth:`NativeServer.counters
<retrieval.serving.native.NativeServer.counters>`: the request parsed; its checks and vocabulary
lookups; a batch's kernel call; its merges; its answers built and serialised) and timers around the
kernel's user tower and index search give each stage's milliseconds per request; "kernel call, the
rest" is the Python call's own cost (the GIL, the arrays in and out, the kernel's glue). The stages
are wall time on the thread running them, so a thread preempted inside one counts that too. The
server process's CPU per request (from ``/proc``) minus their sum is gRPC's own work (HTTP/2, its
threads) and the hand-offs between threads; the CPU of each of the server's threads (by name,
``/proc/PID/task/*/comm``) over the measured window shows who spends it (the batcher's thread runs
the kernel, merges and answers), and the server's counters the rows per kernel call (the batches
the batcher formed).

Beside them, ``bench.floor``'s stages of the Python engine's work at batch 32 on one thread
without gRPC (its profiled shares, and its unprofiled floor). Prints a Markdown table and
writes ``stages.json`` and ``stages.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.context import load_average, measured, run_meta, write_report
from bench.data import REPO, add_data_root_argument, dataset_file
from bench.floor import STAGES as FLOOR_STAGES
from bench.floor import stages as floor_stages
from bench.serving import answerer, build_artifacts, measure, ms_per_request, start
from bench.serving import requests as user_requests
from retrieval.environment import THREADS_ENV, single_threaded_tensorflow

log = logging.getLogger("bench.native_stages")

K, BATCH = 50, 32

NATIVE_STAGES = {
    "parse": "parse_ns",
    "checks and vocabulary lookups": "checks_ns",
    "user tower": "tower",
    "index search (FAISS)": "faiss",
    "kernel call, the rest": "kernel_ns",
    "exclusions, merge": "merge_ns",
    "answers built and serialised": "response_ns",
}
"""Stage -> its timer: the engine's counter (nanoseconds), or the kernel's (``tower``, ``faiss``:
seconds, inside the kernel call, whose counter they are taken out of)."""


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) each thread name of process ``pid`` has used (Linux)."""
    used: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        used[name] = used.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return used


def per_request(timers: dict[str, Any]) -> dict[str, float]:
    """Each stage's milliseconds per call from the server's timers (the kernel's taken out of the
    kernel call)."""
    counters = timers["counters"]
    calls = max(1, counters["calls"])
    ms = {}
    for stage, key in NATIVE_STAGES.items():
        seconds = timers[key] if key in ("tower", "faiss") else counters[key] / 1e9
        ms[stage] = seconds * 1000 / calls
    ms["kernel call, the rest"] -= ms["user tower"] + ms["index search (FAISS)"]
    return ms


def run(args: argparse.Namespace) -> dict[str, Any]:
    meta = run_meta("python -m bench.native_stages " + " ".join(sys.argv[1:]))
    model_dir, index_dir = build_artifacts(args.artifacts, args.deployment_items, args.data, 3)
    users = user_requests(args.data, K)
    args.out.mkdir(parents=True, exist_ok=True)
    timers_file = args.out / "stages-server.json"
    own = ["--deployment-items", str(args.deployment_items), "--artifacts", str(args.artifacts)]
    command = ["-m", "bench.native_echo", "--serve", "native", *own, "--stages-out", str(timers_file)]
    server = start("native", command)
    try:
        before = thread_cpu(server.process.pid)
        row = measure(server, users, args.concurrency, args.seconds, args.max_requests, 16)
        after = thread_cpu(server.process.pid)
    finally:
        server.stop()
    threads = {name: seconds - before.get(name, 0.0) for name, seconds in after.items()}
    timers = json.loads(timers_file.read_text())
    native = per_request(timers)
    native[OTHER] = row["server_cpu_ms"] - sum(native.values())
    answer = answerer(model_dir, index_dir, users, 32)
    return {
        **meta,
        "load_end": load_average(2),
        "items": args.deployment_items,
        "env": args.env,
        "row": row,
        "native_ms": native,
        "server_counters": timers["counters"],
        # The window's CPU by thread, as shares of the server's CPU per request.
        "thread_cpu_ms": {
            name: row["server_cpu_ms"] * seconds / sum(threads.values())
            for name, seconds in sorted(threads.items(), key=lambda item: -item[1])
            if seconds > 0
        },
        "floor_ms": ms_per_request(answer, 32, args.floor_requests),
        "floor_profiled_ms": floor_stages(answer, 32, args.floor_requests),
    }


OTHER = "gRPC, threads' hand-offs (server CPU - stages)"


def faiss_cost(args: argparse.Namespace) -> dict[str, Any]:
    """The kernel's FAISS search and user tower at batch 32, in this process's CPU time and wall
    time per request (one thread each, as the native engine's batcher runs them): the search by
    OpenMP threads and by depth (the kernel's, k plus the history's ids; and k + 2), the coarse
    quantizer alone (a BLAS product: the OpenBLAS kernels FAISS's build picked for this CPU are
    named), the tower; and per interest list the depth that holds k ids outside the history
    (what the search must reach for the same answers). Environment variables read at start
    (:data:`FAISS_ENV`) are compared by running it again with ``--env``."""
    import faiss
    import numpy as np

    from bench.native_echo import kernel_inputs
    from index import FaissIndex
    from retrieval.serving import NativeKernel, Retriever

    retriever = Retriever.from_dirs(*build_artifacts(args.artifacts, args.deployment_items, args.data, 3))
    sent = user_requests(args.data, K)
    rows = kernel_inputs(NativeKernel(retriever), sent)
    histories = np.stack([h for h, _ in rows])
    batches = len(rows) // BATCH
    model, index = retriever.model, retriever.index
    tower = np.concatenate(
        [model.user_vectors({"items": histories[b * BATCH : (b + 1) * BATCH]}) for b in range(batches)]
    )
    queries = [
        np.ascontiguousarray(tower[b * BATCH : (b + 1) * BATCH].reshape(-1, tower.shape[2]))
        for b in range(batches)
    ]
    depth = max(fetch for _, fetch in rows[: batches * BATCH])

    def cost(work: Any, rounds: int = 4 * batches) -> dict[str, float]:
        work(0)
        cpu, wall = time.process_time(), time.perf_counter()
        for r in range(rounds):
            work(r % batches)
        per = 1000 / (rounds * BATCH)
        return {
            "cpu_ms": round((time.process_time() - cpu) * per, 4),
            "wall_ms": round((time.perf_counter() - wall) * per, 4),
        }

    def search(threads: int, n: int) -> Any:
        def work(b: int) -> None:
            faiss.omp_set_num_threads(threads)
            index.search(queries[b], n)

        return work

    assert isinstance(index, FaissIndex)  # the deployment's: L2MIPS,IVF4096,Flat
    ivf = faiss.extract_index_ivf(index.faiss_index.index)
    out: dict[str, Any] = {
        "env": {key: os.environ.get(key, "") for key in FAISS_ENV},
        "openblas_core": openblas_core(),
        "depth": depth,
        f"search, 1 thread, depth {depth}": cost(search(1, depth)),
        f"search, 2 threads, depth {depth}": cost(search(2, depth)),
        f"search, 1 thread, depth {K + 2}": cost(search(1, K + 2)),
    }
    faiss.omp_set_num_threads(1)
    padded = [np.hstack([q, np.zeros((len(q), 1), np.float32)]) for q in queries]  # L2MIPS's extra dimension
    out["coarse quantizer alone"] = cost(lambda b: ivf.quantizer.search(padded[b], ivf.nprobe))
    out["user tower"] = cost(lambda b: model.user_vectors({"items": histories[b * BATCH : (b + 1) * BATCH]}))
    out["depth holding k ids outside the history, per list"] = _needed_depth(retriever, sent, tower, depth)
    return out


FAISS_ENV = ("OMP_WAIT_POLICY", "OPENBLAS_CORETYPE", *THREADS_ENV)
"""The variables :func:`faiss_cost` reports: what they were set to in the run."""


def openblas_core() -> str:
    """The kernels the OpenBLAS loaded in this process chose for this CPU (``openblas_get_corename``),
    e.g. ``"Haswell"``; ``""`` without one (a FAISS built on another BLAS). An old OpenBLAS that
    does not know a CPU model falls back to ``"Prescott"`` (SSE3) kernels, whatever the CPU has."""
    import ctypes

    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if "libopenblas" in Path(path).name:
            corename = ctypes.CDLL(path).openblas_get_corename
            corename.restype = ctypes.c_char_p
            return str(corename().decode())
    return ""


def _needed_depth(retriever: Any, sent: Sequence[Any], tower: Any, depth: int) -> dict[str, float]:
    """Per user and interest, the search depth at which the list holds K ids outside the user's
    history (the percentiles; a list that never does counts ``depth + 1``)."""
    import numpy as np

    model = retriever.model
    _, ids = retriever.index.search(np.ascontiguousarray(tower.reshape(-1, tower.shape[2])), depth)
    needed = []
    for user, found in enumerate(ids.reshape(len(tower), tower.shape[1], depth)):
        history = model.vocab.lookup(list(sent[user].history))
        for row in found:
            kept = np.cumsum(~np.isin(row, history))
            reached = np.flatnonzero(kept >= K)
            needed.append(int(reached[0]) + 1 if len(reached) else depth + 1)
    return {f"p{q}": float(np.percentile(needed, q)) for q in (50, 90, 99, 100)}


def rows_per_batch(counters: dict[str, int]) -> float:
    """The mean rows of the server's kernel calls (warm-up included)."""
    return counters["rows"] / max(1, counters["batches"])


def table(results: dict[str, Any]) -> str:
    row, native, floor = results["row"], results["native_ms"], results["floor_profiled_ms"]
    env = f", server environment {' '.join(results['env'])}" if results["env"] else ""
    lines = [
        *measured(results),
        "",
        f"{results['items']:,} items, K=4, k=50, {row['concurrency']} in flight{env}: {row['qps']:,.0f} QPS, "
        f"p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms, server CPU {row['server_cpu_ms']:.3f} ms "
        f"per request, {rows_per_batch(results['server_counters']):.1f} rows per kernel call",
        "",
        "| native engine stage | ms per request | | bench.floor stage (Python, batch 32, one thread) "
        "| ms per request (profiled share) |",
        "|---|---|---|---|---|",
    ]
    floor_names = [*FLOOR_STAGES, "other"]
    native_names = list(native)
    for i in range(max(len(native_names), len(floor_names))):
        left = f"| {native_names[i]} | {native[native_names[i]]:.3f} |" if i < len(native_names) else "| | |"
        right = " | | |"
        if i < len(floor_names):
            ms = floor[floor_names[i]]
            right = f" | {floor_names[i]} | {ms:.3f} ({ms / floor['total']:.0%}) |"
        lines.append(left + right)
    lines.append(
        f"| **server CPU (/proc)** | **{row['server_cpu_ms']:.3f}** | | **floor, not profiled** "
        f"| **{results['floor_ms']:.3f}** |"
    )
    threads = ", ".join(f"{name} {ms:.3f}" for name, ms in results["thread_cpu_ms"].items() if ms >= 0.001)
    lines += ["", f"Server CPU ms per request by thread: {threads}"]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--deployment-items",
        type=int,
        default=1_000_000,
        help="bench.serving's deployment (default %(default)s)",
    )
    p.add_argument("--concurrency", type=int, default=32, help="calls in flight (default %(default)s)")
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds (default %(default)s)")
    p.add_argument("--max-requests", type=int, default=200_000, help="measured requests at most")
    p.add_argument("--floor-requests", type=int, default=2000, help="requests of bench.floor's measurement")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable of the server, or of this process with --faiss (repeatable), "
        "e.g. OMP_WAIT_POLICY=PASSIVE",
    )
    p.add_argument(
        "--artifacts",
        type=Path,
        default=REPO / "runs" / "bench-serving",
        help="where bench.serving caches its deployment (default %(default)s)",
    )
    p.add_argument(
        "--out", type=Path, default=REPO / "runs" / "bench-native-stages", help="default %(default)s"
    )
    p.add_argument("--data", type=Path, help="ML-100K folder (default: ml100k in --data-root)")
    p.add_argument("--faiss", action="store_true", help="the kernel's FAISS cost instead (see faiss_cost)")
    add_data_root_argument(p)
    args = p.parse_args(argv)
    args.data = args.data or dataset_file("ml100k", args.data_root)
    if args.concurrency < 1 or args.seconds <= 0 or any("=" not in setting for setting in args.env):
        p.error("need --concurrency >= 1, --seconds > 0 and --env KEY=VALUE")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = parse_args(argv)
    os.environ.update(dict(setting.split("=", 1) for setting in args.env))  # the server inherits them
    single_threaded_tensorflow()  # as mitt serve --engine native, unless --env says otherwise
    if args.faiss:
        meta = run_meta("python -m bench.native_stages " + " ".join(sys.argv[1:]))
        print(json.dumps({**meta, **faiss_cost(args)}, indent=2))
        return 0
    results = run(args)
    write_report(args.out, results, table(results), ("stages.json", "stages.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
