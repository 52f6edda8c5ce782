"""Checks shared by the text loaders: every problem is a :class:`DataError` naming the file and line."""

from __future__ import annotations

import csv
import io
import logging
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from retrieval.data.errors import DataError

log = logging.getLogger(__name__)


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")
"""An integer field: ASCII digits with an optional sign (no ``_`` separators, no other scripts' digits)."""

BLANK_LINE = re.compile(r"^[^\S\n]*$", re.MULTILINE)


def read_text(path: Path, encoding: str) -> str:
    """The whole file as text; undecodable bytes are reported with their line."""
    return decode_text(path, read_bytes(path), encoding)


def read_bytes(path: Path) -> bytes:
    """The whole file; a missing or unreadable one is a :class:`DataError`."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}") from None


def decode_text(path: Path, raw: bytes, encoding: str) -> str:
    """``raw`` (the bytes of ``path``) as text; undecodable bytes are reported with their line."""
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(
            f"{path}, line {line}: not {encoding.removesuffix('-sig').upper()} text "
            f"(byte {raw[e.start]:#04x} at offset {e.start})"
        ) from None


def numbered_lines(text: str) -> list[tuple[int, str]]:
    """Non-blank lines with their 1-based numbers (split on ``\\n`` only, unlike ``splitlines``)."""
    return [(n, line.rstrip("\r")) for n, line in enumerate(text.split("\n"), 1) if line.strip()]


def log_blank_lines(path: Path, text: str) -> None:
    """Logs how many blank lines were skipped before the last non-blank one (trailing ones are
    the usual end of a file and not counted)."""
    body = text.rstrip()
    skipped = len(BLANK_LINE.findall(body)) if body else 0
    if skipped:
        log.info("%s: skipped %d blank line(s)", path, skipped)


def field_count_error(path: Path, lineno: int, names: Sequence[str], found: int) -> DataError:
    return DataError(
        f"{path}, line {lineno}: expected {len(names)} fields ({', '.join(names)}), found {found}"
    )


def parse_int(path: Path, lineno: int, name: str, value: str) -> int:
    """A 64-bit integer field (ASCII digits, optional sign), or a DataError naming the line."""
    number = int(value) if INTEGER.fullmatch(value) else None
    if number is None or not INT64_MIN <= number <= INT64_MAX:
        raise DataError(f"{path}, line {lineno}: {name} {value!r} is not an integer")
    return number


def check_ids(path: Path, name: str, ids: list[str], lines: np.ndarray) -> None:
    """Numeric ids must be ASCII digits; ``lines[i]`` is the line of ``ids[i]``."""
    joined = "".join(ids)  # one C-level check for the whole file; the loop only locates a failure
    if not (joined.isascii() and joined.isdigit()):
        row = next(i for i, v in enumerate(ids) if not (v.isascii() and v.isdigit()))
        raise DataError(f"{path}, line {lines[row]}: {name} {ids[row]!r} is not a number")


def read_int_records(path: Path, sep: str | None, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Lines of ``len(names)`` integer fields split on ``sep`` (whitespace when ``None``) -> int64 columns.

    pandas' C parser reads well-formed files fast; when it fails, or the file holds anything but
    digits, signs, separators and line breaks, or a line has another field count, the file is
    parsed line by line, which either reads it or names the line at fault.
    """
    text = read_text(path, "latin-1")
    log_blank_lines(path, text)
    allowed = r"[0-9+\-\s]*" if sep is None else r"[0-9+\- \r\n:]*"  # a tab in a "::" file is an error
    try:
        if not re.fullmatch(allowed, text):
            raise ValueError("not only integers")
        # The C parser takes no multi-character separator, so "::" becomes a tab.
        fast = io.StringIO(text if sep is None else text.replace(sep, "\t"))
        frame = pd.read_csv(
            fast,
            sep=r"\s+" if sep is None else "\t",
            header=None,
            index_col=False,
            dtype=np.int64,
            quoting=csv.QUOTE_NONE,
            engine="c",
        )
        # Without names the first line sets the field count and any other count fails, so
        # every line has exactly len(names) fields (with names, extra fields became an index).
        if len(frame) and frame.shape[1] == len(names):
            return {name: frame[j].to_numpy() for j, name in enumerate(names)}
    except (ValueError, OverflowError, pd.errors.ParserError, pd.errors.EmptyDataError):
        pass  # malformed somewhere: the line-by-line parse below says where
    rows: list[list[int]] = []
    for lineno, line in numbered_lines(text):
        fields = line.strip().split(sep)
        if len(fields) != len(names):
            raise field_count_error(path, lineno, names, len(fields))
        rows.append([parse_int(path, lineno, n, v) for n, v in zip(names, fields, strict=True)])
    if not rows:
        raise DataError(f"{path}: empty file")
    columns = np.array(rows, np.int64).reshape(len(rows), len(names))
    return {name: columns[:, j] for j, name in enumerate(names)}


def read_lines(path: Path, encoding: str) -> list[tuple[int, str]]:
    """:func:`numbered_lines` of a file that must have at least one (else an "empty file" error)."""
    text = read_text(path, encoding)
    lines = numbered_lines(text)
    if not lines:
        raise DataError(f"{path}: empty file")
    log_blank_lines(path, text)
    return lines
