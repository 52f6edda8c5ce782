"""Named public datasets and where they live: under a data root the user gives, never a path
derived from where this code is installed.

The root is ``--data-root`` (tools pass it as ``root``) or the ``MITT_DATA`` environment
variable; under it each dataset keeps the layout of its public release (MovieLens-100K's folder,
S3-Rec's preprocessed Amazon files).

Example:
    >>> dataset_path("beauty", "/data")
    PosixPath('/data/amazon-beauty/Beauty.txt')
"""

from __future__ import annotations

import os
from pathlib import Path

from retrieval.data.errors import DataError

DATA_ROOT_ENV = "MITT_DATA"
"""Environment variable naming the data root when no root is given."""

DATASETS: dict[str, str] = {
    "ml100k": "ml-100k",
    "beauty": "amazon-beauty/Beauty.txt",
    "sports": "amazon-sports/Sports_and_Outdoors.txt",
}
"""Dataset name -> its path under the data root."""


def data_root(root: str | Path | None = None) -> Path:
    """``root``, else ``$MITT_DATA``.

    Raises:
        DataError: neither is set.
    """
    root = root or os.environ.get(DATA_ROOT_ENV)
    if not root:
        raise DataError(
            f"no data root: pass --data-root DIR or set {DATA_ROOT_ENV}=DIR, the folder holding "
            f"{', '.join(DATASETS.values())}"
        )
    return Path(root).expanduser()


def dataset_path(name: str, root: str | Path | None = None) -> Path:
    """Where dataset ``name`` (a key of :data:`DATASETS`) is under the data root.

    Raises:
        DataError: an unknown name, no data root, or nothing at that path.
    """
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    path = data_root(root) / DATASETS[name]
    if not path.exists():
        raise DataError(f"dataset {name!r} not found at {path}")
    return path


def dataset_at(path: str | Path, root: str | Path | None = None) -> str | None:
    """The dataset whose location under the data root is ``path``; ``None`` for any other path or
    when no root is set."""
    try:
        base = data_root(root)
    except DataError:
        return None
    resolved = Path(path).resolve()
    return next((name for name, rel in DATASETS.items() if (base / rel).resolve() == resolved), None)
