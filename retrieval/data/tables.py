"""Tables of interactions: CSV, TSV and Parquet files and pandas DataFrames with a user, an item
and a timestamp column (+ ``title`` and side columns), under any column names a mapping gives.

The same steps read every table, and RecBole's atomic files (:mod:`retrieval.data.recbole`):
:func:`table_interactions` renames the columns (:mod:`retrieval.data.columns`), checks the ids
and converts the timestamps to Unix seconds by the table's unit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from retrieval.data.columns import REQUIRED_COLUMNS, TIMESTAMP_UNITS, check_columns
from retrieval.data.delimited import read_delimited
from retrieval.data.errors import DataError
from retrieval.data.interactions import Interactions
from retrieval.data.parsing import INT64_MAX, INT64_MIN, INTEGER

log = logging.getLogger(__name__)

TABLE_SUFFIXES = (".csv", ".tsv", ".parquet")
"""Files read as tables: ``.csv`` (comma-separated, unless its header line holds no comma and a
tab or a semicolon), ``.tsv`` (tab-separated) and ``.parquet``."""

FRAME_SOURCE = "<DataFrame"
"""How a pandas DataFrame is named where a path would be (``data.path`` of a run trained on one):
``<DataFrame 1000 rows, 3 columns, sha256 ...>`` (:func:`frame_source`)."""

SECONDS_LOOK_LIKE_MS = 10**11
"""Timestamps above this read as seconds are after the year 5138: likely milliseconds (and
below it, read as milliseconds, before March 1973: likely seconds). Only logged: the unit given wins."""


def load_table(
    path: Path | str, columns: Mapping[str, str] | None = None, timestamp_unit: str = "s"
) -> Interactions:
    """Loads a CSV or TSV file (UTF-8, with a header) or a Parquet file of interactions.

    Columns ``user``, ``item`` and ``timestamp`` are required, under these names or those
    ``columns`` maps them to (``{"user": "uid", "timestamp": "ts"}``, our name -> the file's);
    see :func:`table_interactions` for the rest: side columns, titles, timestamps.

    A ``.tsv`` file is tab-separated; a ``.csv`` file comma-separated, unless its header line
    holds no comma and a tab (or a semicolon): then that is the separator. Fields are quoted
    as in CSV.

    Raises:
        DataError: unreadable file, missing or duplicate columns, wrong field count, empty or
            non-scalar ids, or a timestamp that the unit does not read.
    """
    path = Path(path)
    if path.suffix.lower() == ".parquet":
        frame = _read_parquet(path)
        return table_interactions(
            frame, str(path), str(path), lambda row: f"{path}, row {row + 1}", False, columns, timestamp_unit
        )
    frame, line_of, header_line = read_delimited(path, "\t" if path.suffix.lower() == ".tsv" else None)
    return table_interactions(
        frame,
        str(path),
        f"{path}, line {header_line}",
        lambda row: f"{path}, line {line_of(row)}",
        True,
        columns,
        timestamp_unit,
    )


def interactions_from_frame(
    frame: pd.DataFrame, columns: Mapping[str, str] | None = None, timestamp_unit: str = "s"
) -> Interactions:
    """Interactions from a pandas DataFrame, read as a Parquet table is (:func:`table_interactions`);
    the frame itself is not modified. Errors name the row by its position (``row 1`` is the first).

    Example:
        >>> frame = pd.DataFrame({"uid": ["a", "a"], "sku": [7, 9], "ts": ["2024-05-01", "2024-05-02"]})
        >>> data = interactions_from_frame(frame, {"user": "uid", "item": "sku", "timestamp": "ts"}, "iso")
        >>> data.events["timestamp"].tolist()
        [1714521600, 1714608000]

    Raises:
        DataError: not a DataFrame, repeated column names, or what :func:`table_interactions` refuses.
    """
    if not isinstance(frame, pd.DataFrame):
        raise DataError(f"expected a pandas DataFrame of interactions, got {type(frame).__name__}")
    source = "DataFrame"
    names = [str(c) for c in frame.columns]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise DataError(f"{source}: column(s) {', '.join(map(repr, repeated))} repeated")
    frame = frame.reset_index(drop=True)
    frame.columns = pd.Index(names, dtype=object)
    return table_interactions(
        frame, source, source, lambda row: f"{source}, row {row + 1}", False, columns, timestamp_unit
    )


def frame_source(frame: pd.DataFrame) -> str:
    """What stands for a DataFrame where a path would be: its shape and a SHA-256 of its column
    names, dtypes and values (``<DataFrame 1000 rows, 3 columns, sha256 9f2c...>``), so that a
    saved configuration says which data it was trained on, and differs when the data does."""
    digest = hashlib.sha256(json.dumps([[str(c), str(t)] for c, t in frame.dtypes.items()]).encode())
    try:
        digest.update(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes())
    except TypeError:  # cells pandas cannot hash (lists): their text
        digest.update(frame.to_csv(index=False).encode())
    rows, width = frame.shape
    return f"{FRAME_SOURCE} {rows} rows, {width} columns, sha256 {digest.hexdigest()}>"


def table_interactions(
    frame: pd.DataFrame,
    source: str,
    header_at: str,
    where: Callable[[int], str],
    from_text: bool,
    columns: Mapping[str, str] | None = None,
    timestamp_unit: str = "s",
    *,
    need_time: bool = True,
) -> Interactions:
    """A table read from a file or given in memory -> :class:`Interactions`.

    1. ``columns`` (our name -> the table's column) renames the table's columns: ``user``,
       ``item``, ``timestamp``, ``title`` or any side column (``rating`` or ``action`` is the
       action feature). A column of the table already named like one of ours that the mapping
       gives another column is dropped (logged).
    2. ``user`` and ``item`` are ids, kept as text (whole-float ids lose their ``.0``).
    3. ``timestamp`` becomes int64 Unix seconds by ``timestamp_unit``: ``s`` (integers; ``1e3`` is
       1000), ``ms`` (integers, floored to seconds) or ``iso`` (ISO-8601 text; no offset = UTC);
       datetime columns are converted whatever the unit (naive times taken as UTC). When the
       unit is finer than seconds, a user's events within one second keep their exact order.
    4. Other columns are kept with the events (text columns that are all numbers become
       numeric); ``title`` moves to the items (the first non-empty title of each item).

    Args:
        frame: the table, string columns when ``from_text`` (CSV), typed otherwise.
        source: the path (or ``DataFrame``) named in errors and kept as the data's source.
        header_at: where the column names are (``log.csv, line 1``), named in errors.
        where: row position -> where it is (``log.csv, line 7``), named in errors.
        from_text: the values are text as written in a file (parsed exactly).
        columns: the column mapping (:func:`~retrieval.data.columns.check_columns`).
        timestamp_unit: one of :data:`~retrieval.data.columns.TIMESTAMP_UNITS`.
        need_time: refuse a table without a timestamp column; else its events are ordered as
            they come (the position is the timestamp, ``has_time`` false), as RecBole does.

    Raises:
        DataError: what the steps above refuse, naming the column, row or line.
    """
    if timestamp_unit not in TIMESTAMP_UNITS:
        raise DataError(
            f"unknown timestamp unit {timestamp_unit!r}; expected one of {', '.join(TIMESTAMP_UNITS)}"
        )
    try:
        mapping = check_columns(columns)
    except ValueError as e:
        raise DataError(f"{header_at}: {e}") from None
    frame = _renamed(frame, mapping, header_at)
    has_time = "timestamp" in frame.columns
    required = REQUIRED_COLUMNS if need_time else tuple(c for c in REQUIRED_COLUMNS if c != "timestamp")
    missing = [c for c in required if c not in frame.columns]
    if missing:
        hint = "" if mapping else "; name yours with data.columns (e.g. data.columns.user=COLUMN)"
        raise DataError(
            f"{header_at}: missing column(s) {', '.join(missing)}; "
            f"found: {', '.join(map(str, frame.columns))}{hint}"
        )
    if frame.empty:
        raise DataError(f"{source}: empty file (no rows)")
    for column in ("user", "item"):
        if not from_text:
            frame[column] = _scalar_ids(frame[column], column, where)
        values = frame[column].astype(str).str.strip()
        bad = frame[column].isna().to_numpy() | (values == "").to_numpy()
        if bad.any():
            raise DataError(f"{where(int(np.argmax(bad)))}: empty {column} id")
        frame[column] = values
    if has_time:
        frame["timestamp"], exact = _read_timestamps(frame["timestamp"], from_text, timestamp_unit, where)
        if exact is not None:
            frame = _exact_order_within_users(frame, exact)
    else:  # the order of the events as they come, per user
        frame.insert(2, "timestamp", frame.groupby("user", sort=False).cumcount().astype(np.int64))
    if from_text:
        for column in frame.columns.difference(REQUIRED_COLUMNS):
            frame[column] = _side_column(frame[column], numeric=column != "title")
    if "title" in frame.columns:
        titles = frame["title"].where(frame["title"].astype(str).str.strip() != "")
        items = titles.groupby(frame["item"], sort=False).first().rename_axis("item").reset_index()
        frame = frame.drop(columns="title")
    else:
        items = pd.DataFrame({"item": frame["item"].unique()})
    return Interactions(frame.reset_index(drop=True), items, source, has_time=has_time)


def _renamed(frame: pd.DataFrame, mapping: dict[str, str], header_at: str) -> pd.DataFrame:
    """``frame`` (a copy) with the mapping's columns under our names."""
    absent = [(ours, theirs) for ours, theirs in mapping.items() if theirs not in frame.columns]
    if absent:
        named = ", ".join(f"{theirs!r} (data.columns.{ours})" for ours, theirs in absent)
        found = ", ".join(map(str, frame.columns))
        raise DataError(f"{header_at}: no column{'s' if len(absent) > 1 else ''} {named}; found: {found}")
    renamed = {theirs: ours for ours, theirs in mapping.items() if theirs != ours}
    shadowed = [c for c in frame.columns if c in mapping and mapping[c] != c and c not in renamed]
    if shadowed:
        log.info(
            "%s: column(s) %s left out: data.columns names other columns so", header_at, ", ".join(shadowed)
        )
    return frame.drop(columns=shadowed).rename(columns=renamed)


def _read_timestamps(
    values: pd.Series, from_text: bool, unit: str, where: Callable[[int], str]
) -> tuple[np.ndarray, np.ndarray | None]:
    """Timestamps as int64 Unix seconds ``[n]``, and their exact values (int64 ``[n]`` in the
    unit's resolution) when it is finer than seconds, else ``None``.

    Raises:
        DataError: the first value the unit does not read, with a hint when another unit would.
    """
    exact: np.ndarray | None = None
    if pd.api.types.is_datetime64_any_dtype(values):
        micros, bad = _utc_micros(pd.to_datetime(values, utc=True))
        seconds, exact = np.floor_divide(micros, 10**6), micros
    elif unit == "iso":
        text = values.astype(str).str.strip()
        numeric = not from_text and (
            pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values)
        )
        parsed = pd.to_datetime(text, format="ISO8601", utc=True, errors="coerce")
        micros, bad = _utc_micros(parsed)
        bad |= values.isna().to_numpy(bool) | numeric
        seconds, exact = np.floor_divide(micros, 10**6), micros
    else:
        seconds, bad = _integer_timestamps(values, from_text)
        if unit == "ms":
            seconds, exact = np.floor_divide(seconds, 1000), seconds
    if bad.any():
        row = int(np.argmax(bad))
        value = values.iloc[row]
        if unit == "iso":
            raise DataError(f"{where(row)}: timestamp '{value}' is not an ISO-8601 date and time")
        raise DataError(
            f"{where(row)}: timestamp '{value}' is not an integer (or is outside the int64 range)"
            + _unit_hint(value)
        )
    _check_magnitude(seconds, exact, unit)
    return seconds.astype(np.int64), exact


def _utc_micros(utc: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """UTC datetimes -> int64 microseconds since the epoch ``[n]`` and a bool mask of the missing."""
    micros = utc.dt.tz_localize(None).to_numpy(dtype="datetime64[us]")
    bad = np.isnat(micros)
    return np.where(bad, 0, micros.astype(np.int64)), bad


def _unit_hint(value: Any) -> str:
    """Why an integer timestamp failed, when the value reads as a date: the option to set."""
    text = str(value).strip()
    if text.isdigit() or pd.isna(pd.to_datetime(text, format="ISO8601", errors="coerce", utc=True)):
        return ""
    return "; it reads as an ISO-8601 date: give --timestamp-unit iso"


def _check_magnitude(seconds: np.ndarray, exact: np.ndarray | None, unit: str) -> None:
    """Logs a warning when integer timestamps look like another unit than the one given: a wrong
    unit shifts every time gap 1000-fold without any error."""
    if unit == "s" and len(seconds) and np.median(seconds) > SECONDS_LOOK_LIKE_MS:
        log.warning(
            "timestamps read as seconds are after the year 5138 (median %d): if they are "
            "milliseconds, give --timestamp-unit ms",
            int(np.median(seconds)),
        )
    elif unit == "ms" and exact is not None and len(exact) and 0 < np.median(exact) < SECONDS_LOOK_LIKE_MS:
        log.warning(
            "timestamps read as milliseconds are before March 1973 (median %d): if they are "
            "seconds, give --timestamp-unit s",
            int(np.median(exact)),
        )


def _exact_order_within_users(frame: pd.DataFrame, exact: np.ndarray) -> pd.DataFrame:
    """``frame`` with each user's rows put in the order of their exact times, on the rows that
    user already holds: whole seconds would tie events a millisecond apart, and ties keep the
    order of the rows (:func:`~retrieval.data.interactions.build_sequences`). Every user keeps
    the position of its first row, so users stay in order of appearance."""
    if (np.diff(exact) >= 0).all():  # a log in time order: so is every user's part of it
        return frame
    users = pd.factorize(frame["user"])[0]
    by_time = np.lexsort((exact, users))  # rows grouped by user, each user's by exact time
    slots = np.lexsort((np.arange(len(frame)), users))  # each user's rows, in row order
    order = np.empty(len(frame), np.int64)
    order[slots] = by_time
    if (order == np.arange(len(frame))).all():
        return frame
    return frame.take(order).reset_index(drop=True)


def _text_to_int(value: Any) -> int | None:
    """An int64 written as an integer (``-12``) or a whole number (``1e3``, ``5.0``); else ``None``.

    Numbers written with a decimal point or exponent are exact only below 2^53, so larger ones
    are refused rather than rounded.
    """
    text = str(value).strip()
    if INTEGER.fullmatch(text):
        number = int(text)
    else:
        try:
            real = float(text)
        except ValueError:
            return None
        if not math.isfinite(real) or not real.is_integer() or abs(real) >= 2**53:
            return None
        number = int(real)
    return number if INT64_MIN <= number <= INT64_MAX else None


def _integer_timestamps(values: pd.Series, from_text: bool) -> tuple[np.ndarray, np.ndarray]:
    """Timestamps as int64 ``[n]`` and a bool ``[n]`` mask of the values that are not integers.

    Args:
        values: the column as read.
        from_text: the values are CSV text (parsed exactly); else a typed column (Parquet, a
            DataFrame), where booleans are refused (datetimes are read before, whatever the unit).
    """
    n = len(values)
    if from_text:
        digits = _decimal_int64(values)
        if digits is not None:
            return digits, np.zeros(n, bool)
        values = values.astype(object)  # the rules below are pandas' for object text
    elif pd.api.types.is_bool_dtype(values):
        return np.zeros(n, np.int64), np.ones(n, bool)
    numeric = pd.to_numeric(values, errors="coerce")
    if pd.api.types.is_integer_dtype(numeric):
        bad = numeric.isna().to_numpy(bool).copy()
        if pd.api.types.is_unsigned_integer_dtype(numeric):
            bad |= (numeric > INT64_MAX).to_numpy(bool)
        return np.where(bad, 0, numeric.fillna(0).to_numpy()).astype(np.int64), bad
    if from_text:  # some value is not a plain integer: parse each one exactly
        parsed = [_text_to_int(v) for v in values.tolist()]
        bad = np.array([v is None for v in parsed], bool)
        return np.array([0 if v is None else v for v in parsed], np.int64), bad
    real = numeric.to_numpy(np.float64, na_value=np.nan)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(real) | (real % 1 != 0) | (real < INT64_MIN) | (real >= 2.0**63)
    return np.where(bad, 0, real).astype(np.int64), bad


def _side_column(text: pd.Series, numeric: bool) -> pd.Series | np.ndarray:
    """A side column read as text: numbers when every value is one (by pandas' rules, or Arrow's
    cast where all are ASCII digits, which gives the same), else Python strings, as the csv
    module gave them (whichever reader read the file)."""
    digits = _decimal_int64(text) if numeric else None
    if digits is not None:
        return digits
    values = text.astype(object)
    if numeric:
        with contextlib.suppress(ValueError, TypeError):  # not all numbers: keep the text
            return pd.to_numeric(values)
    return values


def _decimal_int64(text: pd.Series) -> np.ndarray | None:
    """Text that is all ASCII digits (the usual timestamps) -> int64 ``[n]``, read by Arrow; None
    when a value is anything else (a sign, a space, a decimal point, empty) or beyond int64."""
    values = pa.array(text)
    if not pa.types.is_string(values.type) and not pa.types.is_large_string(values.type):
        return None
    if not pc.all(pc.ascii_is_decimal(values), skip_nulls=False).as_py():
        return None
    try:
        return np.asarray(pc.cast(values, pa.int64()).to_numpy(), np.int64)
    except pa.ArrowInvalid:  # beyond int64
        return None


def _scalar_ids(values: pd.Series, column: str, where: Any) -> pd.Series:
    """A Parquet id column as text-ready values: whole floats lose their ``.0``; lists, bytes and
    other non-scalars are refused."""
    if pd.api.types.is_float_dtype(values):
        real = values.to_numpy(np.float64, na_value=np.nan)
        finite = np.isfinite(real)
        if (real[finite] % 1 == 0).all() and (np.abs(real[finite]) < 2**63).all():
            text = np.where(finite, np.where(finite, real, 0).astype(np.int64).astype(str), "")
            return pd.Series(text, index=values.index, dtype=object).where(finite)
        return values
    if pd.api.types.is_object_dtype(values):
        scalar = (str, int, float, np.number, type(None))
        odd = np.array([not isinstance(v, scalar) for v in values.tolist()], bool)
        if odd.any():
            row = int(np.argmax(odd))
            raise DataError(
                f"{where(row)}: {column} id {values.iloc[row]!r} is a {type(values.iloc[row]).__name__}, "
                "not text or a number"
            )
    return values


def _read_parquet(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(f"{path}: not a readable Parquet file: {e}") from None
