"""``python -m bench.peers``: see :mod:`bench.peers`."""

import sys

from bench.peers.cli import main

sys.exit(main())
