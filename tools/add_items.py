"""Runs ``mitt add-items`` (retrieval/cli/add_items.py): python tools/add_items.py --help."""

import sys

from retrieval.cli.add_items import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
