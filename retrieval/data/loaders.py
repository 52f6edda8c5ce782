"""Interaction data: loaders to one in-memory form, per-user sequences and the leave-one-out split.

Formats read by :func:`load_interactions`:

* ``movielens``: a MovieLens-100K folder (``u.data``, ``u.item``, ``u.genre``) or -1M folder
  (``ratings.dat``, ``movies.dat``); every rating is kept as implicit feedback.
* ``s3rec``: the S3-Rec ``user item item ...`` lines (one per user, chronological, no
  timestamps), with the ``<stem>_item2attributes.json`` beside it when present.
* ``sasrec``: SASRec's ``user item`` pairs (users on many lines, each user's in time order).
* ``table``: a CSV, TSV or Parquet file with a user, an item and a timestamp column (+ side
  columns), named as they are or through a column mapping.
* ``recbole``: RecBole's atomic ``.inter`` file (with the ``.item`` beside it for attributes).

Every problem with the input is raised as :class:`DataError`, naming the file and the line
(the row for Parquet): truncated lines, wrong field counts, non-numeric or out-of-range numbers,
text that is not UTF-8 (MovieLens files are Latin-1, where every byte is a character), empty
files, duplicate ids or columns, a user without items. Nothing is silently reinterpreted. The
one thing skipped is blank lines, counted in the log (INFO) when they are not at the end.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from retrieval.data.errors import DataError
from retrieval.data.interactions import Interactions
from retrieval.data.movielens import load_movielens
from retrieval.data.recbole import load_recbole
from retrieval.data.s3rec import load_s3rec, load_sasrec, load_sequence_file
from retrieval.data.tables import FRAME_SOURCE, TABLE_SUFFIXES, load_table

FORMATS = ("movielens", "s3rec", "sasrec", "table", "recbole")
"""What :func:`load_interactions` reads (``format=``)."""

MAPPED_FORMATS = ("table", "recbole")
"""The formats with named columns and real timestamps: the ones a column mapping and a
timestamp unit apply to."""


def load_interactions(
    path: Path | str,
    format: str | None = None,
    *,
    columns: Mapping[str, str] | None = None,
    timestamp_unit: str = "s",
) -> Interactions:
    """Loads interactions, detecting the format from the path unless ``format`` is given.

    Detection: a folder holding ``u.data`` or ``ratings.dat`` (or either file) is
    ``movielens``; a ``.txt`` file ``s3rec`` or ``sasrec``, told apart by its content
    (:func:`~retrieval.data.s3rec.load_sequence_file`); a ``.csv``, ``.tsv`` or ``.parquet`` file
    ``table``; an ``.inter`` file, or a folder ``<name>/`` holding ``<name>.inter``, ``recbole``.

    Args:
        path: the file or folder.
        format: one of :data:`FORMATS`; overrides detection.
        columns: our column names (``user``, ``item``, ``timestamp``, ``title``, side columns) ->
            the file's, for ``table`` and ``recbole``
            (:func:`~retrieval.data.tables.table_interactions`).
        timestamp_unit: how a ``table``'s or ``recbole`` file's timestamps are written: ``s``
            (Unix seconds, the default), ``ms`` (Unix milliseconds) or ``iso`` (ISO-8601 text).

    Raises:
        DataError: unknown format, missing file, malformed content, or a column mapping or a
            timestamp unit given for a format without named columns or timestamps.
    """
    if str(path).startswith(FRAME_SOURCE):
        raise DataError(
            f"{path} stands for a pandas DataFrame a model was trained on, not a file: give the "
            "data again (--data PATH, or train(config, data=frame) in Python)"
        )
    path = Path(path)
    detected = format is None
    if format is None:
        format = _detect_format(path)
    if format not in FORMATS:
        raise DataError(f"unknown data format {format!r}; expected one of {', '.join(FORMATS)}")
    if format not in MAPPED_FORMATS and (columns or timestamp_unit != "s"):
        given = "a column mapping" if columns else f"timestamp unit {timestamp_unit!r}"
        raise DataError(
            f"{path}: {given} applies to tables and RecBole files, not to the {format} format "
            "(its columns and times are fixed)"
        )
    if format == "movielens":
        return load_movielens(path)
    if format == "s3rec":
        return load_sequence_file(path) if detected else load_s3rec(path)
    if format == "sasrec":
        return load_sasrec(path)
    if format == "recbole":
        return load_recbole(path, columns, timestamp_unit)
    return load_table(path, columns, timestamp_unit)


def _detect_format(path: Path) -> str:
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.is_dir():
        if (path / "u.data").is_file() or (path / "ratings.dat").is_file():
            return "movielens"
        if (path / f"{path.name}.inter").is_file():
            return "recbole"
    elif path.name in ("u.data", "ratings.dat"):
        return "movielens"
    elif path.suffix.lower() == ".txt":
        return "s3rec"
    elif path.suffix.lower() in TABLE_SUFFIXES:
        return "table"
    elif path.suffix.lower() == ".inter":
        return "recbole"
    raise DataError(
        f"{path}: cannot tell the data format: expected a MovieLens folder (u.data or ratings.dat), "
        "an S3-Rec or SASRec .txt file, a .csv/.tsv/.parquet table or a RecBole .inter file "
        "(or a RecBole folder NAME/ holding NAME.inter); pass format= to choose"
    )
