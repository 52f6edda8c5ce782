"""Two runs compared on the same users: per metric, the difference, its standard error, a 95%
interval and the relative change (:func:`retrieval.evaluation.paired_comparison`).

    python -m bench.paired A B [--metrics recall@50 ndcg@50 hitrate@50] [--names K=4 K=1]

A and B are per-user metric files (:class:`retrieval.evaluation.UserMetrics`): those
``python -m bench.quality`` writes per row as ``OUT/users/<dataset>/<protocol>/<tower>-<fusion>.csv``
(seeds averaged per user, test folds pooled) or per run as ``<run folder>/user_metrics.csv``
(a run folder can be given for the latter). Users are paired by id; the two files must hold
the same users (the same data, ``data.split_seed`` and ``--folds``). Prints a Markdown table;
``--json FILE`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench import markdown
from retrieval.evaluation import PairedComparison, UserMetrics, compare_user_metrics


def comparison_table(comparisons: Mapping[str, PairedComparison], names: tuple[str, str]) -> str:
    """Markdown: a row per metric, ``a`` and ``b``'s means, ``a − b`` ± its standard error (bold
    when the 95% interval excludes 0), the interval, and the relative change with its interval."""
    a, b = names
    header = ["metric", a, b, f"{a} − {b} ± SE", "95% interval", f"{a} / {b} − 1 (95% interval)"]
    rows = []
    for metric, c in comparisons.items():
        difference = f"{c.difference:+.4f} ± {c.se:.4f}"
        if c.low > 0 or c.high < 0:
            difference = f"**{difference}**"
        low, high = c.relative_interval
        rows.append(
            [
                metric,
                f"{c.mean_a:.4f}",
                f"{c.mean_b:.4f}",
                difference,
                f"[{c.low:+.4f}, {c.high:+.4f}]",
                f"{c.relative:+.1%} [{low:+.1%}, {high:+.1%}]",
            ]
        )
    return "\n".join(markdown.table(header, rows))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", type=Path, help="per-user metrics of the first run (or its run folder)")
    p.add_argument("b", type=Path, help="per-user metrics of the second run, the reference")
    p.add_argument("--metrics", nargs="+", help="the metrics, in order (default: every one both hold)")
    p.add_argument("--names", nargs=2, metavar=("A", "B"), help="column names (default: the file names)")
    p.add_argument("--json", type=Path, help="also write the comparisons as JSON")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        a, b = UserMetrics.load(args.a), UserMetrics.load(args.b)
        comparisons = compare_user_metrics(a, b, args.metrics)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    names = tuple(args.names) if args.names else (args.a.stem, args.b.stem)
    print(f"{len(a.users)} users, paired by id: {args.a} against {args.b}\n")
    print(comparison_table(comparisons, (names[0], names[1])))
    if args.json:
        payload = {
            m: {**dataclasses.asdict(c), "relative_interval": c.relative_interval}
            for m, c in comparisons.items()
        }
        args.json.write_text(json.dumps({"a": str(args.a), "b": str(args.b), "metrics": payload}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
