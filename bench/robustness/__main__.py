"""``python -m bench.robustness``: see :mod:`bench.robustness`."""

import sys

from bench.robustness.cli import main

sys.exit(main())
