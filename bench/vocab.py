"""The item vocabulary at serving scale: resident memory once loaded, and lookup time.

Memory: RSS after ``ItemVocab.load`` and ``gc.collect()`` in a fresh interpreter, against the
same ``vocab.json`` held as the dict-based vocabulary held it (a tuple of ids, a dict and an object
array). Lookups of ``--ids`` ids per call, against that dict: the same ids again (warm caches) and
new ids each call (new strings, as a request gives them; a tenth of them unknown).

Example:
    python -m bench.vocab                      # 1M items, 50 ids per call
    python -m bench.vocab --items 100000 --titles
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.data import ItemVocab

RESIDENT = """
import gc, json, os, sys
import numpy as np
from retrieval.data import ItemVocab

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

ItemVocab.from_ids(["a"], {"a": "A"}).lookup(["a"])  # imports and first-call caches
gc.collect()
before = rss()
if sys.argv[2] == "dict":
    with open(sys.argv[1], encoding="utf-8") as f:
        payload = json.loads(f.read())
    ids = tuple(payload["ids"])
    kept = (ids, payload["titles"] and tuple(payload["titles"]), dict(zip(ids, range(1, len(ids) + 1))))
    kept += (np.array(("", *ids), object),)
    del payload
else:
    kept = ItemVocab.load(sys.argv[1])
gc.collect()
print(rss() - before)
"""
"""Prints the bytes a vocabulary adds to a fresh interpreter: ``python -c RESIDENT FILE LAYOUT``."""


def resident_mb(path: Path, layout: str) -> float:
    """MiB that loading ``path`` as ``layout`` ("ItemVocab" or "dict") adds to a fresh interpreter."""
    run = subprocess.run([sys.executable, "-c", RESIDENT, str(path), layout], capture_output=True, text=True)
    run.check_returncode()
    return int(run.stdout) / 2**20


def microseconds_per_call(function: Callable[[Any], object], calls: Sequence[Any]) -> float:
    """Mean time of ``function`` over ``calls`` (its arguments), in microseconds."""
    start = time.perf_counter()
    for call in calls:
        function(call)
    return (time.perf_counter() - start) / len(calls) * 1e6


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--items", type=int, default=1_000_000, help="vocabulary size (ids item0, item1, ...)"
    )
    parser.add_argument("--ids", type=int, default=50, help="ids per lookup")
    parser.add_argument("--calls", type=int, default=20_000, help="lookups timed per measure")
    parser.add_argument("--titles", action="store_true", help="give every item a title")
    args = parser.parse_args(argv)

    ids = [f"item{i}" for i in range(args.items)]
    titles = [f"Title of item number {i}" for i in range(args.items)] if args.titles else None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "vocab.json"
        path.write_text(json.dumps({"ids": ids, "titles": titles}, ensure_ascii=False), encoding="utf-8")
        start = time.perf_counter()
        vocab = ItemVocab.load(path)
        loading = time.perf_counter() - start
        memory = {layout: resident_mb(path, layout) for layout in ("ItemVocab", "dict")}
    index = dict(zip(ids, range(1, args.items + 1), strict=True))

    def dict_lookup(call: list[str]) -> np.ndarray:
        return np.fromiter(map(index.get, call, repeat(0)), np.int64, len(call))

    rng = np.random.default_rng(0)
    known = args.ids - args.ids // 10

    def requests() -> list[list[str]]:
        """New strings for every call: ``known`` random ids of the vocabulary, then unknown ones."""
        unknown = [f"new{i}" for i in range(args.ids - known)]
        return [[f"item{i}" for i in rng.integers(0, args.items, known)] + unknown for _ in range(args.calls)]

    print(f"{args.items:,} items{' with titles' if titles else ''}; ItemVocab.load took {loading:.2f} s")
    print(
        f"resident once loaded: ItemVocab {memory['ItemVocab']:.1f} MiB, dict-based {memory['dict']:.1f} MiB"
    )
    for name, lookup in (("ItemVocab", vocab.lookup), ("dict", dict_lookup)):
        again = min(microseconds_per_call(lookup, requests()[:1] * args.calls) for _ in range(3))
        new = microseconds_per_call(lookup, requests())
        print(
            f"{name:9s} lookup of {args.ids} ids: {again:5.1f} us the same ids again, {new:5.1f} us new ids"
        )
    dense = list(rng.integers(1, args.items + 1, (args.calls, args.ids)))
    print(f"ItemVocab external of {args.ids} ids: {microseconds_per_call(vocab.external, dense):.1f} us")


if __name__ == "__main__":
    main()
