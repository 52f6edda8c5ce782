"""Draw a trained tower's attention maps over one user's history as a PNG heatmap.

mitt plot-attention --model runs/ml100k-sa --data data/ml-100k --user 1 --out u1.png

Rows are interests (sa, dr, mind, din) or heads, columns the user's history (titles when the
data has them), oldest first.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from retrieval.cli.inputs import flag_inputs
from retrieval.cli.startup import command_parser, log_to_stderr, ready, refuse
from retrieval.environment import VERBOSE_HELP

__all__ = ["main", "parse_args"]


def parse_args(argv: Sequence[str] | None, prog: str | None = None) -> argparse.Namespace:
    p = command_parser(prog, __doc__)
    p.add_argument("--model", required=True, type=Path, help="model artifact folder (mitt train --out)")
    p.add_argument("--data", required=True, help="interactions holding the user (same formats as training)")
    p.add_argument("--format", choices=["movielens", "s3rec", "table"], help="override format detection")
    p.add_argument("--user", required=True, help="external user id")
    p.add_argument("--out", required=True, type=Path, help="PNG file to write")
    p.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    args = parse_args(argv, prog)
    if not ready(flag_inputs(args, "model", "data"), args.verbose):
        return 2
    # Imported here, once TensorFlow's logging is set and never for --help: the training layer
    # loads TensorFlow, the data layer pandas.
    from retrieval.data import DataError
    from retrieval.training import plot_user_attention

    log_to_stderr(logging.WARNING)
    try:
        maps = plot_user_attention(args.model, args.data, args.user, args.out, args.format)
    except (ValueError, DataError, FileNotFoundError) as e:
        return refuse(e)
    print(json.dumps({"out": str(args.out), "maps": {k: list(v.shape) for k, v in maps.items()}}))
    return 0
