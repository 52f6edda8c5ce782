"""How a table's columns are named and its timestamps written: the column mapping and the
timestamp unit that :func:`~retrieval.data.loaders.load_interactions` applies to tables
(CSV, TSV, Parquet, pandas DataFrames) and RecBole atomic files.

No pandas here: the training configuration checks its ``data.columns`` with these functions
before anything heavy is loaded.

Example:
    >>> parse_columns("user=uid, item=product_id,timestamp=ts")
    {'user': 'uid', 'item': 'product_id', 'timestamp': 'ts'}
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any, Literal

REQUIRED_COLUMNS = ("user", "item", "timestamp")
"""The columns every table needs, under these names or the ones a column mapping gives."""

TimestampUnit = Literal["s", "ms", "iso"]
"""How a table's timestamps are written: integer Unix seconds (``s``), integer Unix milliseconds
(``ms``) or ISO-8601 text (``iso``, e.g. ``2024-05-01T12:30:00Z``; no offset means UTC). Datetime
columns (Parquet, pandas) carry their own unit and are read under any of them."""
TIMESTAMP_UNITS: tuple[TimestampUnit, ...] = typing.get_args(TimestampUnit)


def check_columns(columns: Mapping[str, Any] | None) -> dict[str, str]:
    """A column mapping (our name -> the file's column) with its names as text.

    Our names are ``user``, ``item``, ``timestamp``, ``title`` or a side column's name (``rating``
    or ``action`` become the action feature); a file column is named once.

    Raises:
        ValueError: an empty name, a name that is not text (or an integer, taken as its digits),
            or one file column mapped to two of ours.
    """
    checked: dict[str, str] = {}
    for ours, theirs in (columns or {}).items():
        if isinstance(theirs, int) and not isinstance(theirs, bool):
            theirs = str(theirs)  # --set data.columns.user=7 reads 7 as JSON: a column named "7"
        if not isinstance(ours, str) or not ours.strip() or not isinstance(theirs, str) or not theirs.strip():
            raise ValueError(f"data.columns: {ours!r}={theirs!r}: both names must be non-empty text")
        checked[ours.strip()] = theirs.strip()
    named: dict[str, str] = {}
    for ours, theirs in checked.items():
        if theirs in named:
            raise ValueError(f"data.columns: column {theirs!r} is mapped twice ({named[theirs]}, {ours})")
        named[theirs] = ours
    return checked


def parse_columns(spec: str) -> dict[str, str]:
    """``"user=uid,item=product_id"`` (what a ``--columns`` flag takes) -> ``{"user": "uid", ...}``.

    Raises:
        ValueError: an entry that is not ``name=column``, or what :func:`check_columns` refuses.
    """
    columns: dict[str, str] = {}
    for entry in (e for e in spec.split(",") if e.strip()):
        ours, sep, theirs = entry.partition("=")
        if not sep or not ours.strip() or not theirs.strip():
            raise ValueError(f"columns: {entry.strip()!r} is not NAME=COLUMN (e.g. user=uid,item=product_id)")
        if ours.strip() in columns:
            raise ValueError(f"columns: {ours.strip()!r} is given twice")
        columns[ours.strip()] = theirs.strip()
    return check_columns(columns)
