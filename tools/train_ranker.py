"""Runs ``mitt train-ranker`` (retrieval/cli/train_ranker.py): python tools/train_ranker.py --help."""

import sys

from retrieval.cli.train_ranker import main, parse_args

__all__ = ["main", "parse_args"]

if __name__ == "__main__":
    sys.exit(main())
