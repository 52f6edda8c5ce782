"""Runs ``mitt build-index`` (retrieval/cli/build_index.py): python tools/build_index.py --help."""

import sys

from retrieval.cli.build_index import main, parse_args

__all__ = ["main", "parse_args"]

if __name__ == "__main__":
    sys.exit(main())
