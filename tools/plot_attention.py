"""Runs ``mitt plot-attention`` (retrieval/cli/plot_attention.py): python tools/plot_attention.py --help."""

import sys

from retrieval.cli.plot_attention import main, parse_args

__all__ = ["main", "parse_args"]

if __name__ == "__main__":
    sys.exit(main())
