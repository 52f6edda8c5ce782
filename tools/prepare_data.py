"""Runs ``mitt prepare`` (retrieval/cli/prepare.py): python tools/prepare_data.py --help."""

import sys

from retrieval.cli.prepare import main, parse_args

__all__ = ["main", "parse_args"]

if __name__ == "__main__":
    sys.exit(main())
