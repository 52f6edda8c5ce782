"""Runs ``mitt serve`` (retrieval/cli/serve.py): python tools/serve.py --help."""

import sys

from retrieval.cli.serve import main, parse_args

__all__ = ["main", "parse_args"]

if __name__ == "__main__":
    sys.exit(main())
