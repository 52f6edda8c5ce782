"""Reading a CSV log: ``load_interactions`` against ``pyarrow.csv.read_csv`` alone, time and memory.

Writes a seeded synthetic ``uid,product_id,ts`` CSV of each ``--rows`` count (ids as text, Unix
seconds), then reads it in fresh interpreters, ``--repeats`` times each: with
``pyarrow.csv.read_csv`` alone (Arrow's own type inference, nothing checked) and with
``retrieval.data.load_interactions`` under the column mapping ``user=uid,item=product_id,
timestamp=ts`` (ids kept as text, timestamps checked as integers, the rows' lines known for
errors). Each child reports its wall time around the one call and its peak resident memory
(``ru_maxrss``), and the RSS it had before the call (the interpreter and its imports): the best
time and the largest peak over the repeats are printed, as a Markdown table.

Example:
    python -m bench.ingest --rows 1000000 10000000
    python -m bench.ingest --rows 100000 --repeats 1     # a smoke run
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pv

from bench.context import commit, load_average, machine

COLUMNS = {"user": "uid", "item": "product_id", "timestamp": "ts"}
"""The benchmark file's column names, as ``load_interactions`` is told them."""

READERS = ("pyarrow.csv.read_csv", "load_interactions")

CHILD = """
import json, os, resource, sys, time

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

reader, path, columns = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if reader == "pyarrow.csv.read_csv":
    import pyarrow.csv
    read = lambda: pyarrow.csv.read_csv(path)
else:
    from retrieval.data.loaders import load_interactions
    read = lambda: load_interactions(path, columns=columns)
before = rss_mib()
start = time.perf_counter()
rows = read().num_rows if reader == "pyarrow.csv.read_csv" else len(read().events)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
print(json.dumps({"seconds": seconds, "before_mib": before, "peak_mib": peak, "rows": rows}))
"""
"""Reads ``argv[2]`` with ``argv[1]`` (one of :data:`READERS`) and prints its time and memory."""


def write_log(path: Path, rows: int, seed: int = 0) -> None:
    """A ``uid,product_id,ts`` CSV of ``rows`` events: ``rows // 20`` users and ``rows // 5`` items
    (``c17``, ``p4021``) drawn uniformly, timestamps in increasing Unix seconds."""
    rng = np.random.default_rng(seed)

    def ids(prefix: str, count: int) -> pa.Array:
        numbers = pa.array(rng.integers(0, max(count, 1), rows)).cast(pa.string())
        return pc.binary_join_element_wise(prefix, numbers, "")

    times = 1_600_000_000 + np.sort(rng.integers(0, 100_000_000, rows))
    table = pa.table({"uid": ids("c", rows // 20), "product_id": ids("p", rows // 5), "ts": times})
    pv.write_csv(table, path, pv.WriteOptions(quoting_style="none"))


def measure(reader: str, path: Path) -> dict[str, float]:
    """One read of ``path`` by ``reader`` in a fresh interpreter: seconds, MiB before and at peak."""
    run = subprocess.run(
        [sys.executable, "-c", CHILD, reader, str(path), json.dumps(COLUMNS)],
        capture_output=True,
        text=True,
    )
    if run.returncode:
        raise RuntimeError(f"{reader} failed on {path}:\n{run.stderr}")
    result: dict[str, float] = json.loads(run.stdout)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000], help="events per file")
    parser.add_argument("--repeats", type=int, default=3, help="reads per reader and file (best time kept)")
    parser.add_argument("--dir", type=Path, default=None, help="where the CSV files go (default: a temp dir)")
    args = parser.parse_args(argv)

    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{stamp}, commit {commit()}, {machine()}")
    print("| rows | file MB | reader | best s | × read_csv | RSS before MiB | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for rows in args.rows:
            path = Path(tmp) / f"log-{rows}.csv"
            write_log(path, rows)
            size = path.stat().st_size / 1e6
            best: dict[str, float] = {}
            for reader in READERS:
                runs = [measure(reader, path) for _ in range(args.repeats)]
                if any(r["rows"] != rows for r in runs):
                    raise RuntimeError(f"{reader} read {runs[0]['rows']} rows of {rows}")
                best[reader] = min(r["seconds"] for r in runs)
                print(
                    f"| {rows:,} | {size:,.0f} | `{reader}` | {best[reader]:.2f} "
                    f"| {best[reader] / best[READERS[0]]:.1f} | {max(r['before_mib'] for r in runs):,.0f} "
                    f"| {max(r['peak_mib'] for r in runs):,.0f} |",
                    flush=True,
                )
            path.unlink()
    print(f"load average at the end: {load_average()}")


if __name__ == "__main__":
    main()
