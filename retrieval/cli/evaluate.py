"""Evaluate a trained model under one protocol, or compare the metrics of several runs.

    mitt evaluate --model runs/ml100k-sa --data data/ml-100k \\
        [--protocol loo|loo-sampled|comirec] [--index runs/ml100k-sa-index] \\
        [--split test] [--seed 42] [--negatives 100] [--out runs/ml100k-sa-comirec] [--table]
    mitt evaluate --model runs/big-sa --data runs/big-prepared [--split test]
    mitt evaluate --compare runs/a runs/b runs/c/metrics.json [--metrics hr@10,ndcg@10]

Protocols (retrieval/data/splits.py; mitt train --protocol loo and comirec are scored as
the ones of the same name, loo-refit as loo):
  loo          leave-one-out, ranked against every item, history excluded:
               hr, ndcg, recall @ 5, 10, 20, 50 (exact search, or through --index)
  loo-sampled  leave-one-out, the target against --negatives items the user never touched,
               drawn with --seed (SASRec's protocol): sampled_hr@10, sampled_ndcg@10
  comirec      users split 8:1:1 with --seed, history = first 80% of a held-out user's
               sequence, targets = the rest: recall, hitrate, ndcg, diversity @ 20, 50
               (ComiRec's definitions; diversity needs item attributes, first = category)

--data may also be a prepared folder (mitt prepare, detected, or --format prepared):
its users are read a batch at a time; it holds the leave-one-out split, so loo only.

Prints the result as JSON (default) or a Markdown table (--table). --out DIR also writes it
to DIR/metrics.json; the model folder itself is never written to (its files are checksummed).
--compare reads each run's metrics.json (this tool's --out, or a model folder's training
metrics) and prints Markdown: one table per protocol, a row per run.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

# Light names only: the model, the index and the evaluation itself are imported in main.
from retrieval.cli.inputs import flag_inputs, missing_inputs
from retrieval.cli.startup import command_parser, refuse
from retrieval.config import SEEDS, Range, ranged
from retrieval.data import DEFAULT_SEED, PROTOCOLS
from retrieval.environment import VERBOSE_HELP, quiet_tensorflow
from retrieval.evaluation import METRICS_FILE, comparison_markdown, load_run_rows, markdown_table
from retrieval.storage import ArtifactError

__all__ = ["main", "parse_args"]


def parse_args(argv: Sequence[str] | None, prog: str | None = None) -> argparse.Namespace:
    p = command_parser(prog, __doc__)
    p.add_argument("--model", help="model artifact folder (mitt train --out)")
    p.add_argument("--data", help="interactions, same formats as mitt train")
    p.add_argument(
        "--format",
        choices=["movielens", "s3rec", "table", "prepared"],
        help="override format detection (prepared: a mitt prepare folder)",
    )
    p.add_argument("--protocol", choices=PROTOCOLS, default="loo", help="default %(default)s")
    p.add_argument("--index", help="index folder (mitt build-index --out); default exact search")
    p.add_argument("--split", choices=["test", "valid"], default="test", help="default %(default)s")
    p.add_argument(
        "--seed",
        type=ranged(int, SEEDS),
        default=DEFAULT_SEED,
        help="comirec user split, sampled negatives (%(default)s)",
    )
    p.add_argument(
        "--negatives",
        type=ranged(int, Range(1)),
        default=100,
        help="loo-sampled: negatives per user (default %(default)s)",
    )
    p.add_argument("--out", help="folder to write metrics.json into (created if needed)")
    p.add_argument("--table", action="store_true", help="print a Markdown table instead of JSON")
    p.add_argument(
        "--compare", nargs="+", metavar="RUN", help="run folders or metrics JSON files to tabulate"
    )
    p.add_argument("--metrics", help="--compare: comma-separated metric columns (default all)")
    p.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    args = p.parse_args(argv)
    if args.compare is None and (args.model is None or args.data is None):
        p.error("--model and --data are required (unless --compare)")
    if args.compare is not None and (args.model is not None or args.data is not None):
        p.error("--compare tabulates finished runs: give it without --model/--data")
    if missing_inputs(flag_inputs(args, "model", "data", "index")):
        p.exit(2)  # before telling a prepared folder, which loads pandas and pyarrow
    if args.data is not None and args.format is None:
        from retrieval.data import is_prepared  # reads the folder (pyarrow)

        args.format = "prepared" if is_prepared(args.data) else None
    if args.format == "prepared" and args.protocol != "loo":
        p.error(f"a prepared folder holds the leave-one-out split only: use --protocol loo, or give "
                f"--protocol {args.protocol} the raw interactions")  # fmt: skip
    return args


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    args = parse_args(argv, prog)
    if args.compare is not None:
        try:
            rows = [row for run in args.compare for row in load_run_rows(run)]
        except ValueError as e:
            return refuse(e)
        metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
        print(comparison_markdown(rows, metrics))
        return 0
    out = None if args.out is None else Path(args.out)
    if out is not None and (out / "manifest.json").exists():
        return refuse(f"{out} is an artifact folder (checksummed); write --out elsewhere")
    quiet_tensorflow(args.verbose)
    from retrieval.artifacts import load_index, load_model
    from retrieval.evaluation import ProtocolResult, evaluate_prepared_users, evaluate_protocol

    try:
        model = load_model(args.model)
        index, search = None, "exact"
        if args.index is not None:
            index, index_manifest = load_index(args.index, model.version)
            search = str(index_manifest.get("factory", index_manifest.get("backend", "faiss")))
        if args.format == "prepared":
            found, users = evaluate_prepared_users(model, args.data, args.split, index=index)
            result = ProtocolResult(args.protocol, args.split, found, users)
        else:
            result = evaluate_protocol(
                model,
                args.data,
                args.protocol,
                args.format,
                args.split,
                index,
                seed=args.seed,
                num_negatives=args.negatives,
            )
    except (ArtifactError, ValueError) as e:
        return refuse(e)
    record = result.record(
        model=args.model,
        model_version=model.version,
        tower=model.manifest.get("tower"),
        data=args.data,
        search=search,
    )
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / METRICS_FILE).write_text(json.dumps(record, indent=2) + "\n")
    if args.table:
        print(markdown_table([{**record, "run": args.model}]))
    else:
        print(json.dumps(record, indent=2))
    return 0
