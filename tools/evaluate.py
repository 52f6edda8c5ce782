"""Runs ``mitt evaluate`` (retrieval/cli/evaluate.py): python tools/evaluate.py --help."""

import sys

from retrieval.cli.evaluate import main, parse_args

__all__ = ["main", "parse_args"]

if __name__ == "__main__":
    sys.exit(main())
