"""CSV and Parquet tables of ``user, item, timestamp`` (+ ``title`` and side columns)."""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from retrieval.data.errors import DataError
from retrieval.data.interactions import Interactions
from retrieval.data.parsing import INT64_MAX, INT64_MIN, INTEGER, field_count_error, read_text

log = logging.getLogger(__name__)


REQUIRED_COLUMNS = ("user", "item", "timestamp")


def load_table(path: Path | str) -> Interactions:
    """Loads a CSV (UTF-8, with a header) or Parquet table with columns ``user, item, timestamp``.

    Other columns are kept in the events as they are (CSV columns that are all numbers become
    numeric); a ``title`` column moves to the items (the first non-empty title of each item).
    Timestamps are integers (Unix seconds by convention; ``1e3`` is read as 1000); a Parquet
    datetime column is converted to Unix seconds (naive times taken as UTC). Parquet ids that are
    whole floats (integer columns with gaps become float) are written without ``.0``.

    Raises:
        DataError: unreadable file, missing or duplicate columns, wrong field count, empty or
            non-scalar ids, or a timestamp that is not an integer in the int64 range.
    """
    path = Path(path)
    if path.suffix.lower() == ".parquet":
        frame, lines = _read_parquet(path), None
        header_at = str(path)
    else:
        frame, lines, header_line = _read_csv(path)
        header_at = f"{path}, line {header_line}"
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(
            f"{header_at}: missing column(s) {', '.join(missing)}; "
            f"found: {', '.join(map(str, frame.columns))}"
        )
    if frame.empty:
        raise DataError(f"{path}: empty file (no rows)")

    def where(row: int) -> str:
        return f"{path}, line {lines[row]}" if lines is not None else f"{path}, row {row + 1}"

    for column in ("user", "item"):
        if lines is None:
            frame[column] = _scalar_ids(frame[column], column, where)
        values = frame[column].astype(str).str.strip()
        bad = frame[column].isna().to_numpy() | (values == "").to_numpy()
        if bad.any():
            raise DataError(f"{where(int(np.argmax(bad)))}: empty {column} id")
        frame[column] = values
    timestamps, bad = _integer_timestamps(frame["timestamp"], from_text=lines is not None)
    if bad.any():
        row = int(np.argmax(bad))
        raise DataError(
            f"{where(row)}: timestamp '{frame['timestamp'].iloc[row]}' is not an integer "
            "(or is outside the int64 range)"
        )
    frame["timestamp"] = timestamps
    if lines is not None:
        for column in frame.columns.difference([*REQUIRED_COLUMNS, "title"]):
            with contextlib.suppress(ValueError, TypeError):  # not all numbers: keep the text
                frame[column] = pd.to_numeric(frame[column])
    if "title" in frame.columns:
        titles = frame["title"].where(frame["title"].astype(str).str.strip() != "")
        items = titles.groupby(frame["item"], sort=False).first().rename_axis("item").reset_index()
        frame = frame.drop(columns="title")
    else:
        items = pd.DataFrame({"item": frame["item"].unique()})
    return Interactions(frame.reset_index(drop=True), items, str(path))


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
        from_text: the values are CSV text (parsed exactly); else a Parquet column, where
            datetimes become Unix seconds and booleans are refused.
    """
    n = len(values)
    if not from_text and pd.api.types.is_bool_dtype(values):
        return np.zeros(n, np.int64), np.ones(n, bool)
    if not from_text and pd.api.types.is_datetime64_any_dtype(values):
        utc = pd.to_datetime(values, utc=True)
        bad = utc.isna().to_numpy()
        seconds = (utc - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(seconds=1)
        return np.where(bad, 0, seconds.fillna(0).to_numpy()).astype(np.int64), bad
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


def _read_csv(path: Path) -> tuple[pd.DataFrame, list[int], int]:
    """A CSV with a header -> string columns, the 1-based line where each row starts, and the
    header's line (blank lines before it are skipped)."""
    reader = csv.reader(io.StringIO(read_text(path, "utf-8-sig"), newline=""))
    rows: list[list[str]] = []
    lines: list[int] = []
    blank, pending = -1, 0  # blank lines before the last row (the loop below counts the header)
    try:
        header: list[str] | None = []
        while header == []:  # blank lines before the header
            header = next(reader, None)
            blank += 1
        if header is None:
            raise DataError(f"{path}: empty file")
        header_line = reader.line_num
        header = [h.strip() for h in header]
        repeated = sorted({h for h in header if header.count(h) > 1})
        if repeated:
            raise DataError(
                f"{path}, line {header_line}: column(s) {', '.join(map(repr, repeated))} repeated"
            )
        while True:
            start = reader.line_num + 1
            row = next(reader, None)
            if row is None:
                break
            if not row:
                pending += 1
                continue
            if len(row) != len(header):
                raise field_count_error(path, start, header, len(row))
            rows.append(row)
            lines.append(start)
            blank, pending = blank + pending, 0
    except csv.Error as e:
        raise DataError(f"{path}, line {reader.line_num}: {e}") from None
    if blank:
        log.info("%s: skipped %d blank line(s)", path, blank)
    return pd.DataFrame(rows, columns=header, dtype=object), lines, header_line


def _read_parquet(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(f"{path}: not a readable Parquet file: {e}") from None
