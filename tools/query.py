"""Runs ``mitt query`` (retrieval/cli/query.py): python tools/query.py --help."""

import sys

from retrieval.cli.query import main, parse_args

__all__ = ["main", "parse_args"]

if __name__ == "__main__":
    sys.exit(main())
