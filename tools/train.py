"""Runs ``mitt train`` (retrieval/cli/train.py): python tools/train.py --help."""

import sys

from retrieval.cli.train import main, parse_args

__all__ = ["main", "parse_args"]

if __name__ == "__main__":
    sys.exit(main())
