"""Interaction data: loaders to one in-memory form, per-user sequences and the leave-one-out split.

Formats read by :func:`load_interactions`:

* ``movielens``: a MovieLens-100K folder (``u.data``, ``u.item``, ``u.genre``) or -1M folder
  (``ratings.dat``, ``movies.dat``); every rating is kept as implicit feedback.
* ``s3rec``: the S3-Rec/SASRec ``user item item ...`` lines (chronological, no timestamps), with
  the ``<stem>_item2attributes.json`` beside it when present.
* ``table``: a CSV or Parquet file with columns ``user, item, timestamp`` (+ side columns).

Every problem with the input is raised as :class:`DataError`, naming the file and the line
(the row for Parquet): truncated lines, wrong field counts, non-numeric or out-of-range numbers,
text that is not UTF-8 (MovieLens files are Latin-1, where every byte is a character), empty
files, duplicate ids or columns, a user without items. Nothing is silently reinterpreted. The
one thing skipped is blank lines, counted in the log (INFO) when they are not at the end.
"""

from __future__ import annotations

from pathlib import Path

from retrieval.data.errors import DataError
from retrieval.data.interactions import Interactions
from retrieval.data.movielens import load_movielens
from retrieval.data.s3rec import load_s3rec
from retrieval.data.tables import load_table

FORMATS = ("movielens", "s3rec", "table")


def load_interactions(path: Path | str, format: str | None = None) -> Interactions:
    """Loads interactions, detecting the format from the path unless ``format`` is given.

    A folder holding ``u.data`` or ``ratings.dat`` (or either file) is ``movielens``, a ``.txt``
    file ``s3rec``, a ``.csv`` or ``.parquet`` file ``table``.

    Args:
        path: the file or folder.
        format: one of ``"movielens"``, ``"s3rec"``, ``"table"``; overrides detection.

    Raises:
        DataError: unknown format, missing file or malformed content.
    """
    path = Path(path)
    if format is None:
        format = _detect_format(path)
    if format == "movielens":
        return load_movielens(path)
    if format == "s3rec":
        return load_s3rec(path)
    if format == "table":
        return load_table(path)
    raise DataError(f"unknown data format {format!r}; expected one of {', '.join(FORMATS)}")


def _detect_format(path: Path) -> str:
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.is_dir():
        if (path / "u.data").is_file() or (path / "ratings.dat").is_file():
            return "movielens"
    elif path.name in ("u.data", "ratings.dat"):
        return "movielens"
    elif path.suffix.lower() == ".txt":
        return "s3rec"
    elif path.suffix.lower() in (".csv", ".parquet"):
        return "table"
    raise DataError(
        f"{path}: cannot tell the data format: expected a MovieLens folder (u.data or ratings.dat), "
        "an S3-Rec .txt file or a .csv/.parquet table; pass format= to choose"
    )
