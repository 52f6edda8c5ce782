"""Convert interactions into the partitioned Parquet layout that training streams from.

mitt prepare --data data/ml-100k --out runs/ml100k-prepared
mitt prepare --data logs/interactions/ --out runs/big-prepared     # a Parquet folder
mitt prepare --data s3://bucket/logs/ --format dataset --out runs/big-prepared

Inputs: every format mitt train reads (MovieLens folder, S3-Rec .txt, CSV/Parquet table),
loaded in memory; or (``--format dataset``, the default for a folder that is not a MovieLens
one and for a URI) a ``user,item,timestamp`` table of any size as a folder of Parquet or CSV
files, read in record batches without loading it whole. The layout (vocabulary, per-user
sequences partitioned by a hash of the user, the leave-one-out split) is described in
retrieval/data/prepared/. Prints the prepared folder's metadata as JSON.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from retrieval.cli.inputs import flag_inputs
from retrieval.cli.startup import command_parser, log_to_stderr, ready, refuse
from retrieval.config import Range, ranged
from retrieval.storage import ArtifactError

__all__ = ["main", "parse_args"]

# retrieval.data's values, spelt out so that --help loads no pandas (a test checks that they agree).
FORMATS = ("movielens", "s3rec", "sasrec", "table", "recbole", "dataset")
TIMESTAMP_UNITS = ("s", "ms", "iso")
MAX_PARTITIONS = 4096
EVENTS_PER_PARTITION = 2_000_000
USERS_PER_ROW_GROUP = 1024
BATCH_ROWS = 1 << 18
SIZES = (
    ("--events-per-partition", EVENTS_PER_PARTITION, "partition size aimed at; bounds memory"),
    ("--users-per-row-group", USERS_PER_ROW_GROUP, "users per Parquet row group, the readers' unit"),
    ("--batch-rows", BATCH_ROWS, "rows per record batch"),
)
"""The positive sizes ``prepare`` takes: flag, default, what it sizes."""


def parse_args(argv: Sequence[str] | None, prog: str | None = None) -> argparse.Namespace:
    p = command_parser(prog, __doc__)
    p.add_argument("--data", required=True, help="input: file, folder or URI")
    p.add_argument("--format", choices=FORMATS, help="override format detection")
    p.add_argument(
        "--columns",
        metavar="NAME=COLUMN,...",
        help="a table's column names for ours, e.g. user=uid,item=product_id",
    )
    p.add_argument(
        "--timestamp-unit",
        choices=TIMESTAMP_UNITS,
        default="s",
        help="a table's timestamps (default %(default)s)",
    )
    p.add_argument("--out", required=True, type=Path, help="prepared folder to create")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument(
        "--partitions",
        type=ranged(int, Range(1, MAX_PARTITIONS)),
        help=f"partition files (1..{MAX_PARTITIONS}; default: events / --events-per-partition)",
    )
    for flag, default, what in SIZES:
        p.add_argument(
            flag, type=ranged(int, Range(1)), default=default, help=f"{what} (default {default:,})"
        )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    args = parse_args(argv, prog)
    if not ready(flag_inputs(args, "data"), verbose=None):  # loads no TensorFlow
        return 2
    from retrieval.data import parse_columns, prepare  # here, never for --help: prepare loads pandas

    log_to_stderr()
    try:
        meta = prepare(
            args.data,
            args.out,
            format=args.format,
            columns=parse_columns(args.columns) if args.columns else None,
            timestamp_unit=args.timestamp_unit,
            partitions=args.partitions,
            events_per_partition=args.events_per_partition,
            users_per_row_group=args.users_per_row_group,
            batch_rows=args.batch_rows,
            overwrite=args.overwrite,
            progress=not args.quiet,
        )
    except (ValueError, FileExistsError, ArtifactError) as e:  # DataError is a ValueError
        return refuse(e)
    print(json.dumps({"out": str(args.out), **meta.to_dict()}, indent=2))
    return 0
