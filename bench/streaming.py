"""Streaming benchmark: a synthetic log of N interactions, prepared out of core, one epoch streamed.

    python -m bench.streaming                          # 50M interactions
    python -m bench.streaming --events 5000000         # a quicker run

Phases, each in a process of its own so that each peak RSS is that phase's alone:

1. ``generate``: ``--events`` interactions, seeded, written chunk by chunk as a Parquet dataset
   (files of ``--file-rows`` rows; never whole in memory): ``events / 50`` users with log-normal
   activity, ``events / 100`` items with Zipf-like popularity (weight ∝ 1 / rank^1.05, ranks
   shuffled over the ids), int64 ids, timestamps rising with the row (a log in time order,
   with ties).
2. ``prepare``: :func:`retrieval.data.prepared.writer.prepare_dataset` of that folder.
3. ``stream``: one epoch of :func:`retrieval.training.streaming.streaming_dataset` (``--objective``,
   ``--max-len``, ``--batch-size``) pulled through ``tf.data`` with prefetch, no model: the
   input pipeline's own throughput and memory.

Reported per phase: wall time, rows or examples per second and peak RSS (``VmHWM`` of the
phase's process; psutil is not needed); then the sizes: the raw log on disk and in memory as
Arrow, one epoch's examples as the in-memory trainer holds them (``[N, max_len + 1]`` int32), the
prepared folder on disk. ``--in-memory-baseline`` adds today's in-memory path on the same log
(``load_interactions``, ``build_sequences``, ``make_examples``; small ``--events`` only: it needs
all of it in memory). Prints a table and writes ``results.json`` and ``results.md`` to ``--out``.
The data goes to ``--workdir`` and is removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
EVENTS_PER_USER = 50
EVENTS_PER_ITEM = 100
ZIPF_EXPONENT = 1.05


def generate_log(
    out: Path, events: int, seed: int = 0, file_rows: int = 5_000_000, chunk_rows: int = 1_000_000
) -> dict[str, Any]:
    """Writes the synthetic log (module docstring) as ``out/part-*.parquet``: ``user``, ``item``
    (int64), ``timestamp`` (int64 Unix seconds), ``rating`` (int8 1..5).

    Returns:
        rows, users, items and files written.
    """
    rng = np.random.default_rng(seed)
    users = max(1, events // EVENTS_PER_USER)
    items = max(10, events // EVENTS_PER_ITEM)
    activity = np.cumsum(rng.lognormal(0.0, 1.0, users))
    activity /= activity[-1]
    popularity = np.cumsum(1.0 / np.arange(1, items + 1) ** ZIPF_EXPONENT)
    popularity /= popularity[-1]
    item_ids = rng.permutation(items).astype(np.int64) + 1  # popularity rank -> id
    user_ids = rng.permutation(users).astype(np.int64) + 1
    out.mkdir(parents=True, exist_ok=True)
    schema = pa.schema(
        [("user", pa.int64()), ("item", pa.int64()), ("timestamp", pa.int64()), ("rating", pa.int8())]
    )
    written = 0
    files = 0
    writer: pq.ParquetWriter | None = None
    while written < events:
        if written % file_rows == 0:
            if writer is not None:
                writer.close()
            writer = pq.ParquetWriter(out / f"part-{files:05d}.parquet", schema)
            files += 1
        n = min(chunk_rows, events - written, file_rows - written % file_rows)
        rows = np.arange(written, written + n, dtype=np.int64)
        table = pa.table(
            {
                "user": user_ids[np.searchsorted(activity, rng.random(n))],
                "item": item_ids[np.searchsorted(popularity, rng.random(n))],
                "timestamp": 1_600_000_000 + rows * 3 // 5,  # ~0.6 s apart: ties every few rows
                "rating": rng.integers(1, 6, n, dtype=np.int8),
            },
            schema=schema,
        )
        assert writer is not None
        writer.write_table(table)
        written += n
    if writer is not None:
        writer.close()
    return {"rows": written, "users": users, "items": items, "files": files}


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under ``folder``."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def arrow_bytes(folder: Path) -> int:
    """The Parquet files' size in memory as Arrow tables (fixed-width columns: rows × widths)."""
    total = 0
    for path in sorted(folder.glob("*.parquet")):
        file = pq.ParquetFile(path)
        widths = [field.type.bit_width // 8 for field in file.schema_arrow]
        total += file.metadata.num_rows * sum(widths)
    return total


def peak_rss_mb() -> float:
    """This process's peak resident set size, MB: ``VmHWM`` from ``/proc/self/status`` (reset when
    a process execs, unlike ``ru_maxrss``, which a spawned child inherits from its parent's
    fork), else ``ru_maxrss`` (KiB on Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    start = time.perf_counter()
    result = fn()
    seconds = round(time.perf_counter() - start, 2)
    return {**result, "seconds": seconds, "peak_rss_mb": round(peak_rss_mb(), 1)}


def phase_generate(raw: str, events: int, seed: int, file_rows: int) -> dict[str, Any]:
    """Phase 1 (in its own process)."""
    return _timed(lambda: generate_log(Path(raw), events, seed, file_rows))


def phase_prepare(
    raw: str, prepared: str, events_per_partition: int, users_per_row_group: int
) -> dict[str, Any]:
    """Phase 2 (in its own process)."""
    from retrieval.data import prepare_dataset

    def run() -> dict[str, Any]:
        meta = prepare_dataset(
            raw,
            prepared,
            events_per_partition=events_per_partition,
            users_per_row_group=users_per_row_group,
            overwrite=True,
        )
        keys = ("partitions", "users", "items", "events", "train_events", "largest_partition_events")
        return {k: getattr(meta, k) for k in keys}

    return _timed(run)


def phase_stream(
    prepared: str, objective: str, max_len: int, batch_size: int, seed: int, shuffle_buffer: int
) -> dict[str, Any]:
    """Phase 3 (in its own process): one epoch through tf.data, no model."""
    before = peak_rss_mb()
    import tensorflow as tf

    from retrieval.data import count_examples
    from retrieval.training import streaming_dataset

    after_import = peak_rss_mb()

    def run() -> dict[str, Any]:
        expected = count_examples(prepared, objective, max_len)
        dataset = streaming_dataset(
            prepared, objective, max_len, batch_size, seed, shuffle_buffer=shuffle_buffer
        ).prefetch(tf.data.AUTOTUNE)
        # The loop runs inside tf.data (no Python per batch but the generator's): the pipeline's
        # own throughput, as model.fit would pull it.
        count = dataset.reduce(
            (tf.constant(0, tf.int64), tf.constant(0, tf.int64), tf.constant(0, tf.int64)),
            lambda acc, batch: (
                acc[0] + tf.cast(tf.shape(batch[1])[0], tf.int64),
                acc[1] + 1,
                acc[2] + tf.reduce_sum(tf.cast(batch[0]["items"][:, -1], tf.int64)),
            ),
        )
        examples, batches, checksum = (int(v) for v in count)
        if examples != expected:
            raise RuntimeError(f"streamed {examples} examples, count_examples says {expected}")
        return {"examples": examples, "batches": batches, "last_item_sum": checksum}

    result = _timed(run)
    result["rss_before_tensorflow_mb"] = round(before, 1)
    result["rss_after_import_mb"] = round(after_import, 1)
    return result


def phase_in_memory(raw: str, objective: str, max_len: int) -> dict[str, Any]:
    """Baseline (in its own process): what tools/train.py does today, all in memory:
    ``load_interactions`` of the single Parquet file, ``build_sequences``, ``leave_one_out`` and
    ``make_examples``."""
    from retrieval.data import build_sequences, leave_one_out, load_interactions
    from retrieval.training import make_examples

    def run() -> dict[str, Any]:
        files = sorted(Path(raw).glob("*.parquet"))
        if len(files) != 1:
            raise ValueError("the in-memory baseline reads one Parquet file: use --file-rows >= --events")
        split = leave_one_out(build_sequences(load_interactions(files[0])))
        _, y = make_examples(objective, {"items": split.train}, max_len)
        return {"examples": len(y)}

    return _timed(run)


def in_process(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Runs ``fn(*args)`` in a fresh (spawned) process, so its peak RSS is its own."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The three phases; returns the results written to ``results.json``."""
    work = Path(args.workdir or Path(args.out) / f"data-{args.events}")
    raw, prepared = work / "raw", work / "prepared"
    if work.exists():
        shutil.rmtree(work)
    load = [os.getloadavg()[0]]
    print(f"generating {args.events:,} interactions in {raw} ...", flush=True)
    generate = in_process(phase_generate, str(raw), args.events, args.seed, args.file_rows)
    generate["rows_per_s"] = round(generate["rows"] / generate["seconds"])
    print(f"preparing into {prepared} ...", flush=True)
    prep = in_process(
        phase_prepare, str(raw), str(prepared), args.events_per_partition, args.users_per_row_group
    )
    prep["rows_per_s"] = round(args.events / prep["seconds"])
    print(f"streaming one epoch of {args.objective} examples ...", flush=True)
    stream_args = (args.objective, args.max_len, args.batch_size, args.seed, args.shuffle_buffer)
    stream = in_process(phase_stream, str(prepared), *stream_args)
    stream["examples_per_s"] = round(stream["examples"] / stream["seconds"])
    baseline = None
    if args.in_memory_baseline:
        print("in-memory baseline (load, build_sequences, make_examples) ...", flush=True)
        baseline = in_process(phase_in_memory, str(raw), args.objective, args.max_len)
    load.append(os.getloadavg()[0])
    sizes = {
        "raw_disk_mb": round(folder_bytes(raw) / 2**20, 1),
        "raw_arrow_mb": round(arrow_bytes(raw) / 2**20, 1),
        # What the in-memory trainer materialises for one epoch: x [N, max_len] + y, int32.
        "examples_in_memory_mb": round(stream["examples"] * (args.max_len + 1) * 4 / 2**20, 1),
        "prepared_disk_mb": round(folder_bytes(prepared) / 2**20, 1),
    }
    if not args.keep:
        shutil.rmtree(work)
    settings = (
        "seed", "objective", "max_len", "batch_size", "shuffle_buffer",
        "events_per_partition", "users_per_row_group", "file_rows",
    )  # fmt: skip
    return {
        "events": args.events,
        "settings": {k: getattr(args, k) for k in settings},
        "generate": generate,
        "prepare": prep,
        "stream": stream,
        "in_memory_baseline": baseline,
        "sizes": sizes,
        "load_average_1min": [round(x, 2) for x in load],
        "cpus": os.cpu_count(),
        "command": " ".join(["python -m bench.streaming", *sys.argv[1:]]),
    }


def markdown(results: dict[str, Any]) -> str:
    """The results as a Markdown table."""
    g, p, s, z = results["generate"], results["prepare"], results["stream"], results["sizes"]
    b = results.get("in_memory_baseline")
    lines = [
        f"{results['events']:,} interactions ({p['users']:,} users, {p['items']:,} items), "
        f"{p['partitions']} partitions, objective {results['settings']['objective']}",
        "",
        "| phase | wall s | throughput | peak RSS MB |",
        "|---|---|---|---|",
        f"| generate | {g['seconds']} | {g['rows_per_s']:,} rows/s | {g['peak_rss_mb']} |",
        f"| prepare | {p['seconds']} | {p['rows_per_s']:,} rows/s | {p['peak_rss_mb']} |",
        f"| stream 1 epoch ({s['examples']:,} examples) | {s['seconds']} | "
        f"{s['examples_per_s']:,} examples/s | {s['peak_rss_mb']} "
        f"({s['rss_after_import_mb']} after importing TensorFlow) |",
    ]
    if b:
        lines.append(
            f"| in-memory baseline (load + sequences + examples) | {b['seconds']} | "
            f"{round(b['examples'] / b['seconds']):,} examples/s | {b['peak_rss_mb']} |"
        )
    lines += [
        "",
        f"Data: raw log {z['raw_disk_mb']} MB on disk, {z['raw_arrow_mb']} MB in memory as Arrow; "
        f"one epoch's examples in memory (what the in-memory trainer holds) {z['examples_in_memory_mb']} MB; "
        f"prepared {z['prepared_disk_mb']} MB on disk; largest partition "
        f"{p['largest_partition_events']:,} events. Load average (1 min) {results['load_average_1min']} "
        f"on {results['cpus']} cores.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    # Not retrieval.training.streaming: this process stays free of TensorFlow (its children fork from it).
    from retrieval.data import EVENTS_PER_PARTITION, USERS_PER_ROW_GROUP

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=50_000_000, help="interactions to generate (default 50M)")
    p.add_argument("--out", default=str(REPO / "runs" / "bench-streaming"), help="results folder")
    p.add_argument("--workdir", help="data folder (default OUT/data-EVENTS); replaced")
    p.add_argument("--keep", action="store_true", help="keep the generated and prepared data")
    p.add_argument(
        "--in-memory-baseline",
        action="store_true",
        help="also time today's in-memory path on the same log (one file; small --events only)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--file-rows", type=int, default=5_000_000, help="rows per generated Parquet file")
    p.add_argument("--events-per-partition", type=int, default=EVENTS_PER_PARTITION)
    p.add_argument("--users-per-row-group", type=int, default=USERS_PER_ROW_GROUP)
    p.add_argument("--objective", default="last", choices=["last", "all_positions", "cloze"])
    p.add_argument("--max-len", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument(
        "--shuffle-buffer", type=int, default=100_000, help="retrieval.training.streaming.SHUFFLE_BUFFER"
    )
    args = p.parse_args(argv)
    if args.in_memory_baseline:
        args.file_rows = max(args.file_rows, args.events)
    results = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    table = markdown(results)
    (out / "results.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
