"""Where a request's server time goes: the per-request floor, stage by stage, without gRPC.

    python -m bench.floor                          # 1M items, batches 1 and 32
    python -m bench.floor --items 200000 --batches 1 8 32
    python -m bench.floor --xla                    # the user tower compiled, as serve --xla

The work of ``bench.serving``'s compute floor, on the same cached artifacts (ComiRec-SA, K = 4,
d = 64, ``L2MIPS,IVF4096,Flat`` at ``nprobe=8``, k = 50, ML-100K histories): one thread (FAISS's
too) parses ``batch`` wire requests, answers them with one ``retrieve_many`` and serialises the
answers, as a micro-batch does. Each batch size is timed twice: plain (the floor, milliseconds
per request) and under ``cProfile``, whose cumulative times are split into the stages below (a
stage is the time inside its functions; "other" is what none of them covers). The profiler
slows Python more than native code, so read the stages as shares of the profiled total, and the
plain floor as the cost.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.data import REPO, add_data_root_argument, dataset_file
from bench.serving import answerer, build_artifacts, ms_per_request, requests

Frame = tuple[str, int, str]
"""cProfile's key of a function: (file, line, name); file ``~`` for built-ins."""

STAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "parse (wire -> Query)": (("~", "FromString"), ("retrieval/api/convert.py", "query_from_request")),
    "vocabulary lookup and checks": (("retrieval/serving/retriever.py", "_prepare_all"),),
    "user tower": (("retrieval/artifacts/model.py", "encode"),),
    "index search (FAISS)": (("index/faiss_index.py", "_raw_search"),),
    "exclusion, filters, merge": (("index/multi_interest.py", "search_interests"),),
    "answer (ids, scores)": (("retrieval/serving/retriever.py", "_answer"),),
    "response building": (("retrieval/api/convert.py", "response_from_result"),),
    "serialisation": (("~", "SerializeToString"),),
}
"""Stage -> the functions (file suffix, name; a substring of a built-in's name) whose cumulative
time it is. ``search_interests`` contains the FAISS search, which is taken out of it."""


def cumulative(stats: dict[Frame, Any], file: str, name: str) -> float:
    """Seconds inside the functions matching ``(file, name)`` (see :data:`STAGES`)."""
    return sum(
        row[3]
        for (path, _, function), row in stats.items()
        if (file == "~" and path == "~" and name in function) or (path.endswith(file) and function == name)
    )


def stages(answer: Callable[[int], None], batch: int, requests_: int) -> dict[str, float]:
    """Milliseconds per request by stage under the profiler, ``other`` and ``total`` included."""
    rounds = max(1, requests_ // batch)
    answer(0)
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    for r in range(rounds):
        answer(r * batch)
    profile.disable()
    total = time.perf_counter() - started
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    seconds = {name: sum(cumulative(stats, *f) for f in functions) for name, functions in STAGES.items()}
    seconds["exclusion, filters, merge"] -= seconds["index search (FAISS)"]
    seconds["other"] = total - sum(seconds.values())
    seconds["total"] = total
    return {name: s * 1000 / (rounds * batch) for name, s in seconds.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    model_dir, index_dir = build_artifacts(args.out, args.items, args.data, args.epochs)
    sent = requests(args.data, args.k)
    rows = []
    for batch in args.batches:
        answer = answerer(model_dir, index_dir, sent, batch, xla=args.xla)
        floor = ms_per_request(answer, batch, args.requests)
        rows.append({"batch": batch, "floor_ms": floor, "profiled_ms": stages(answer, batch, args.requests)})
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m bench.floor " + " ".join(sys.argv[1:]),
        "items": args.items,
        "xla": args.xla,
        "k": args.k,
        "rows": rows,
    }


def table(results: dict[str, Any]) -> str:
    rows = results["rows"]
    header = "| stage | " + " | ".join(f"batch {r['batch']}: ms/request (share)" for r in rows) + " |"
    lines = [header, "|---" * (len(rows) + 1) + "|"]
    for stage in [*STAGES, "other"]:
        cells = [
            f"{r['profiled_ms'][stage]:.3f} ({r['profiled_ms'][stage] / r['profiled_ms']['total']:.0%})"
            for r in rows
        ]
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    lines.append(
        "| **profiled total** | " + " | ".join(f"{r['profiled_ms']['total']:.3f}" for r in rows) + " |"
    )
    lines.append("| **floor, not profiled** | " + " | ".join(f"**{r['floor_ms']:.3f}**" for r in rows) + " |")
    return "\n".join(lines)


def _cell(ms: float, total: float) -> str:
    return f"{ms:.3f} ({ms / total:.0%})"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=1_000_000, help="catalogue size (default %(default)s)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32], help="default %(default)s")
    p.add_argument(
        "--requests", type=int, default=2000, help="requests per measurement (default %(default)s)"
    )
    p.add_argument("--k", type=int, default=50, help="items per request (default %(default)s)")
    p.add_argument(
        "--epochs", type=int, default=3, help="training epochs of the base model (as bench.serving)"
    )
    p.add_argument("--data", type=Path, help="ML-100K folder (default: ml100k in --data-root)")
    p.add_argument("--xla", action="store_true", help="the user tower compiled (tools/serve.py --xla)")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "bench-serving", help="bench.serving's cache")
    add_data_root_argument(p)
    args = p.parse_args(argv)
    args.data = args.data or dataset_file("ml100k", args.data_root)
    if args.items < 200_000 or min(args.batches) < 1 or args.requests < 1:
        p.error("need --items >= 200000 (the index has 4096 lists), batches >= 1 and --requests >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / ("floor-xla.json" if args.xla else "floor.json")).write_text(json.dumps(results, indent=2))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
