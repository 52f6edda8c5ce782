"""Runs ``mitt deploy`` (retrieval/cli/deploy.py): python tools/deploy.py --help."""

import sys

from retrieval.cli.deploy import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
