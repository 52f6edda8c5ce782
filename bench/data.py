"""Where the benchmarks find their datasets.

The library never guesses a data root (:func:`retrieval.data.data_root`: a root given by the
caller, else ``$MITT_DATA``). The benchmarks run from a checkout, so they may: their root is
``$MITT_DATA`` when set, else ``../shared/data`` beside the checkout, and ``--data-root`` replaces
it wherever a benchmark names a dataset.

Example:
    >>> dataset_file("beauty", Path("/data"))
    PosixPath('/data/amazon-beauty/Beauty.txt')
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from retrieval.data import DATA_ROOT_ENV, DATASETS

REPO = Path(__file__).resolve().parent.parent
"""The checkout the benchmarks run from."""


def default_data_root() -> Path:
    """``$MITT_DATA`` when set, else ``<repo>/../shared/data`` (read at each call, not at import)."""
    return Path(os.environ.get(DATA_ROOT_ENV) or REPO.parent / "shared" / "data").expanduser()


def dataset_file(name: str, root: Path | None = None) -> Path:
    """Where dataset ``name`` (a key of :data:`retrieval.data.DATASETS`) is under ``root`` (default
    :func:`default_data_root`). Not checked: it is also the default a ``--help`` shows."""
    return (root or default_data_root()) / DATASETS[name]


def add_data_root_argument(parser: argparse.ArgumentParser) -> None:
    """Adds ``--data-root DIR`` (``args.data_root``, a :class:`~pathlib.Path`)."""
    parser.add_argument(
        "--data-root",
        type=Path,
        default=default_data_root(),
        help=f"folder of the named datasets (default: ${DATA_ROOT_ENV}, else ../shared/data: %(default)s)",
    )
