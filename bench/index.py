"""Index benchmark: Flat, HNSW, IVF-Flat and IVF-PQ on a trained model's embeddings scaled to 1M items.

    python -m bench.index --model runs/ml100k-sa --data ../shared/data/ml-100k   # 1M items
    python -m bench.index --quick                          # 50k items, trains a small model first

Items are the model's learned item embeddings plus perturbed copies: each copy lies between an
item and one of its 10 nearest neighbours (a random point of the segment) plus a small
Gaussian jitter, so the catalogue keeps the learned structure (on pure Gaussian noise every ANN
index looks broken). Queries are real users' interest vectors (the user tower on real
histories), jittered the same way, K per request, searched as one batch.

Reported per index and search setting: build time, memory (serialized size), recall@k of
every interest vector against exact search, latency of one request (K vectors) p50/p99 with
1 and 2 FAISS threads, and batched throughput. Then the auto-tuner (``index.tune``) picks the
cheapest setting reaching the recall target, checked against the targets (recall >= 0.99, p99
<= 2 ms, build <= 60 s). Writes ``results.json``, ``table.md`` and ``recall_latency.png`` to
``--out``. Bounded in time: settings left when ``--time-budget`` is spent are skipped.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from bench.data import REPO, add_data_root_argument, dataset_file
from index import FaissIndex, estimate_memory, exact_neighbours, recall_of, tune
from index.tuning import measure_latency

log = logging.getLogger("bench.index")

TARGET_RECALL, TARGET_P99_MS, TARGET_BUILD_S = 0.99, 2.0, 60.0


@dataclass(frozen=True)
class Family:
    """An index type and the search settings swept for it."""

    name: str
    factory: str
    params: tuple[str, ...]


def families(n: int, d: int, skip: Sequence[str]) -> list[Family]:
    """Flat, HNSW32 and IVF-Flat (each over inner product, and with the MIPS-to-L2 reduction)
    and IVF-PQ, sized for ``n`` items of dimension ``d``."""
    nlist = 4096 if n >= 500_000 else 1024
    probes = ("nprobe=4", "nprobe=8", "nprobe=16", "nprobe=32", "nprobe=64")
    out = [
        Family("Flat", "Flat", ("",)),
        Family("IVF-Flat", f"IVF{nlist},Flat", probes),
        Family("IVF-Flat-L2MIPS", f"L2MIPS,IVF{nlist},Flat", probes[:4]),
        # np: no polysemous training (minutes, and only useful with a Hamming threshold).
        Family("IVF-PQ", f"IVF{nlist},PQ{d // 2}np", probes[1:]),
        Family("HNSW", "HNSW32", ("efSearch=64", "efSearch=128", "efSearch=256", "efSearch=512")),
        Family("HNSW-L2MIPS", "L2MIPS,HNSW32", ("efSearch=64", "efSearch=128", "efSearch=256")),
    ]
    return [f for f in out if f.name.lower() not in {s.lower() for s in skip}]


# ------------------------------------------------------------------------------------ data


def scale_items(base: np.ndarray, n: int, seed: int = 0, jitter: float = 0.05) -> np.ndarray:
    """``base`` (float32 ``[m, d]``) first, then perturbed copies up to ``n`` rows.

    Copy of item ``j``: ``x_j + u (x_m - x_j) + jitter * |x_j| / sqrt(d) * e`` with ``m`` one of
    ``j``'s 10 nearest neighbours (inner product), ``u ~ U(0, 1)``, ``e ~ N(0, I)``.
    """
    rng = np.random.default_rng(seed)
    m, d = base.shape
    flat = faiss.IndexFlatIP(d)
    flat.add(base)
    _, neighbours = flat.search(base, min(11, m))
    neighbours = neighbours[:, 1:]  # drop the item itself
    out = np.empty((n, d), np.float32)
    out[: min(n, m)] = base[:n]
    norms = np.linalg.norm(base, axis=1, keepdims=True) / np.sqrt(d)
    for start in range(m, n, 1 << 18):
        stop = min(n, start + (1 << 18))
        src = rng.integers(m, size=stop - start)
        other = neighbours[src, rng.integers(neighbours.shape[1], size=stop - start)]
        u = rng.random((stop - start, 1), np.float32)
        x = base[src] + u * (base[other] - base[src])
        out[start:stop] = x + jitter * norms[src] * rng.standard_normal((stop - start, d), np.float32)
    return out


def jitter_queries(interests: np.ndarray, requests: int, seed: int = 1, jitter: float = 0.05) -> np.ndarray:
    """``requests`` users sampled with replacement from ``interests`` ``[U, K, d]``, each interest
    jittered like the item copies; all-zero (masked) interests stay zero. Returns ``[requests, K, d]``."""
    rng = np.random.default_rng(seed)
    users = interests[rng.integers(len(interests), size=requests)]
    d = users.shape[-1]
    scale = jitter * np.linalg.norm(users, axis=-1, keepdims=True) / np.sqrt(d)
    return (users + scale * rng.standard_normal(users.shape, np.float32)).astype(np.float32)


def load_or_train_model(args: argparse.Namespace) -> Any:
    """The ``--model`` artifact, or a small ComiRec-SA model trained on ``--data`` for a few epochs."""
    from retrieval.artifacts import load_model

    if args.model is not None:
        return load_model(args.model)
    out = args.out / "model"
    if not (out / "manifest.json").exists():
        from retrieval.training import Config, DataConfig, TrainConfig, run_folder, train

        log.info("no --model: training ComiRec-SA on %s for %d epochs into %s", args.data, args.epochs, out)
        train(
            Config(data=DataConfig(path=str(args.data)), train=TrainConfig(epochs=args.epochs)),
            out,
            verbose=0,
            resume=run_folder(out).is_dir(),
        )
    return load_model(out)


def user_interests(model: Any, data: Path) -> np.ndarray:
    """Interest vectors of every test user of ``data``: float32 ``[U, K, d]``."""
    from retrieval.artifacts import user_interest_queries

    return user_interest_queries(model, data, num_users=10**9)


# ------------------------------------------------------------------------------ measuring


def latency(index: FaissIndex, requests: np.ndarray, k: int, threads: int, limit: int) -> tuple[float, float]:
    """(p50, p99) ms of one request, its K interest vectors searched as one batch: the median
    over 3 timed passes of ``limit`` requests (one burst of load elsewhere on a shared machine
    should not make the p99)."""
    vectors = requests[:limit].reshape(-1, requests.shape[-1])
    return measure_latency(index, vectors, k, requests.shape[1], limit, rounds=3, threads=threads)


def throughput(index: FaissIndex, requests: np.ndarray, k: int, threads: int, batch: int = 256) -> float:
    """Requests per second when ``batch`` requests' interest vectors go through one search call."""
    faiss.omp_set_num_threads(threads)
    flat = requests.reshape(-1, requests.shape[-1])
    start = time.perf_counter()
    per_call = batch * requests.shape[1]
    for s in range(0, len(flat), per_call):
        index.search(flat[s : s + per_call], k)
    return len(requests) / (time.perf_counter() - start)


def serialized_bytes(index: faiss.Index) -> int:
    return int(faiss.serialize_index(index).nbytes)


def measure_family(
    family: Family,
    ids: np.ndarray,
    items: np.ndarray,
    vectors: np.ndarray,
    truth: np.ndarray,
    requests: np.ndarray,
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """Builds one index type and measures each of its search settings."""
    n, d = items.shape
    estimate = estimate_memory(family.factory, n, d)
    log.info("building %s (%s): %s", family.name, family.factory, estimate)
    faiss.omp_set_num_threads(2)
    start = time.perf_counter()
    index = FaissIndex.build(ids, items, family.factory)
    build = time.perf_counter() - start
    size = serialized_bytes(index.faiss_index)
    rows = []
    for params in family.params:
        index.set_search_params(params)
        faiss.omp_set_num_threads(2)
        _, found = index.search(vectors, args.k)
        p50_1, p99_1 = latency(index, requests, args.k, 1, args.latency_requests)
        p50_2, p99_2 = latency(index, requests, args.k, 2, args.latency_requests)
        row = {
            "index": family.name,
            "factory": family.factory,
            "search_params": params,
            "build_s": round(build, 2),
            "memory_mb": round(size / 2**20, 1),
            "estimate_mb": round(estimate.disk_bytes / 2**20, 1),
            "recall": round(recall_of(found, truth), 4),
            "p50_1t_ms": round(p50_1, 3),
            "p99_1t_ms": round(p99_1, 3),
            "p50_2t_ms": round(p50_2, 3),
            "p99_2t_ms": round(p99_2, 3),
            "qps_batched": round(throughput(index, requests, args.k, 2), 1),
        }
        rows.append(row)
        log.info("%s", row)
    return rows


def measure_tuned(
    ids: np.ndarray, items: np.ndarray, vectors: np.ndarray, requests: np.ndarray, args: argparse.Namespace
) -> dict[str, Any]:
    """``index.tune`` over the candidate index types, then the chosen index timed like the rows."""
    faiss.omp_set_num_threads(2)
    log.info("auto-tuning (target recall@%d %.2f) ...", args.k, TARGET_RECALL)
    start = time.perf_counter()
    result = tune(
        ids, items, vectors, args.k, TARGET_RECALL, "auto",
        batch_size=requests.shape[1], max_latency_requests=args.tune_latency_requests,
        max_build_seconds=TARGET_BUILD_S,
    )  # fmt: skip
    chosen = result.chosen
    p50_1, p99_1 = latency(result.index, requests, args.k, 1, args.latency_requests)
    p50_2, p99_2 = latency(result.index, requests, args.k, 2, args.latency_requests)
    tuned = {
        **chosen.to_json(),
        "tune_seconds": round(time.perf_counter() - start, 1),
        "p50_1t_ms": round(p50_1, 3),
        "p99_1t_ms": round(p99_1, 3),
        "p50_2t_ms": round(p50_2, 3),
        "p99_2t_ms": round(p99_2, 3),
        "meets_targets": bool(
            chosen.recall >= TARGET_RECALL
            and min(p99_1, p99_2) <= TARGET_P99_MS
            and chosen.build_seconds <= TARGET_BUILD_S
        ),
        "tried": [p.to_json() for p in result.tried],
    }
    log.info("auto-tuned: %s", {k: v for k, v in tuned.items() if k != "tried"})
    return tuned


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    model = load_or_train_model(args)
    base = np.ascontiguousarray(model.item_embeddings[1:], np.float32)
    items = scale_items(base, args.items, args.seed)
    n, d = items.shape
    ids = np.arange(n, dtype=np.int64)
    interests = user_interests(model, args.data)
    requests = jitter_queries(interests, args.requests, args.seed + 1)  # [R, K, d]
    vectors = requests.reshape(-1, d)
    active = np.any(vectors != 0, axis=1)
    log.info(
        "%d items x %d (from %d trained), %d requests x %d interests (%d non-zero vectors)",
        n, d, len(base), len(requests), requests.shape[1], int(active.sum()),
    )  # fmt: skip
    truth = exact_neighbours(ids, items, vectors[active], args.k)
    rows: list[dict[str, Any]] = []
    # Auto-tuning (None) before HNSW: at 1M items the HNSW build alone takes minutes, and the
    # time budget may end there.
    kinds = families(n, d, args.skip)
    hnsw = [f for f in kinds if f.name.startswith("HNSW")]
    steps = [f for f in kinds if f not in hnsw] + [None] + hnsw
    tuned: dict[str, Any] = {}
    for family in steps:
        if time.perf_counter() - started > args.time_budget:
            log.warning("time budget spent: skipping %s", family.name if family else "auto-tuning")
        elif family is None:
            tuned = measure_tuned(ids, items, vectors, requests, args)
        else:
            rows += measure_family(family, ids, items, vectors[active], truth, requests, args)
    return {
        "date": time.strftime("%Y-%m-%d"),
        "command": "python -m bench.index " + " ".join(args.argv),
        "items": n,
        "dim": d,
        "trained_items": len(base),
        "requests": len(requests),
        "interests_per_request": int(requests.shape[1]),
        "k": args.k,
        "cpu_threads": faiss.omp_get_max_threads(),
        "rows": rows,
        "auto_tuned": tuned,
        "seconds": round(time.perf_counter() - started, 1),
    }


# ------------------------------------------------------------------------------- reporting


def table(results: dict[str, Any]) -> str:
    """Markdown table of the rows and the auto-tuned choice."""
    k = results["k"]
    lines = [
        f"| index | search | build s | memory MB (est.) | recall@{k} | p50 / p99 ms, 1 thread "
        "| p50 / p99 ms, 2 threads | batched req/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        lines.append(
            f"| {r['index']} `{r['factory']}` | {r['search_params'] or '-'} | {r['build_s']} "
            f"| {r['memory_mb']} ({r['estimate_mb']}) | {r['recall']:.4f} "
            f"| {r['p50_1t_ms']} / {r['p99_1t_ms']} | {r['p50_2t_ms']} / {r['p99_2t_ms']} "
            f"| {r['qps_batched']:,.0f} |"
        )
    t = results["auto_tuned"]
    if t:
        lines.append(
            f"| **auto-tuned** `{t['factory']}` | {t['search_params'] or '-'} | {t['build_seconds']:.1f} | "
            f"| {t['recall']:.4f} | {t['p50_1t_ms']} / {t['p99_1t_ms']} "
            f"| {t['p50_2t_ms']} / {t['p99_2t_ms']} | |"
        )
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    """Recall@k against p99 latency (1 thread), one line per index type."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r["index"] for r in results["rows"]):
        points = [r for r in results["rows"] if r["index"] == name]
        ax.plot(
            [r["p99_1t_ms"] for r in points],
            [r["recall"] for r in points],
            marker="o",
            label=points[0]["factory"],
        )
    if results["auto_tuned"]:
        t = results["auto_tuned"]
        ax.scatter(
            [t["p99_1t_ms"]], [t["recall"]], marker="*", s=200, color="black", zorder=5, label="auto-tuned"
        )
    ax.axhline(TARGET_RECALL, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel(f"p99 latency of one request ({results['interests_per_request']} vectors), ms, 1 thread")
    ax.set_ylabel(f"recall@{results['k']} vs exact")
    ax.set_title(f"{results['items']:,} items x {results['dim']}, {results['date']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="model artifact; default: train a small one on --data")
    p.add_argument(
        "--data", type=Path, help="interactions of the model and the queries (default: ml100k in --data-root)"
    )
    add_data_root_argument(p)
    p.add_argument("--items", type=int, default=1_000_000, help="catalogue size after scaling")
    p.add_argument("--quick", action="store_true", help="smoke run: 50k items, fewer requests")
    p.add_argument("--requests", type=int, default=1000, help="requests (users) searched")
    p.add_argument("--latency-requests", type=int, default=300, help="requests timed one by one")
    p.add_argument("--tune-latency-requests", type=int, default=100, help="requests timed per tuning point")
    p.add_argument("--k", type=int, default=50)
    p.add_argument("--epochs", type=int, default=3, help="epochs of the model trained without --model")
    p.add_argument("--skip", nargs="*", default=[], help="index families to leave out (e.g. HNSW)")
    p.add_argument("--time-budget", type=float, default=1800, help="seconds after which steps are skipped")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=REPO / "runs" / "bench-index")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.data = args.data or dataset_file("ml100k", args.data_root)
    if args.quick:
        args.items, args.requests, args.latency_requests = min(args.items, 50_000), 300, 200
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    results = run(args)
    markdown = table(results)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    (args.out / "table.md").write_text(markdown + "\n")
    plot(results, args.out / "recall_latency.png")
    print(markdown)
    print(f"\n{results['command']}  ({results['date']}, {results['seconds']} s); written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
