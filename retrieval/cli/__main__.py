"""``python -m retrieval.cli COMMAND [ARGS]``: the ``mitt`` command, where its script is not on PATH."""

import sys

from retrieval.cli.dispatch import main

sys.exit(main())
