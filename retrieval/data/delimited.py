"""CSV and TSV files with a header -> a frame of text columns, and the line each row starts on.

Arrow's CSV reader (:func:`pyarrow.csv.read_csv`) reads a well-formed file some fifty times
faster than Python's :mod:`csv` module. The :mod:`csv` module's reading stays the reference: both
split fields, quotes and line breaks the same way (a test compares them on tricky inputs), and
wherever Arrow refuses a file (a wrong field count, bytes that are not UTF-8, an open quote) or
cannot say what the reference would (which line a row starts on, a field over the
:func:`csv.field_size_limit`, blank lines between quoted line breaks), the file is scanned with
the :mod:`csv` module, which either reads it or names the line at fault.

Example:
    >>> _ = Path("log.csv").write_text('user,item,timestamp\\nu1,007,5\\n\\nu2,"a, b",6\\n')
    >>> table = read_delimited(Path("log.csv"), None)
    >>> table.frame["item"].tolist(), table.line_of(1), table.header_line
    (['007', 'a, b'], 4, 1)
"""

from __future__ import annotations

import codecs
import csv
import functools
import io
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pv

from retrieval.data.errors import DataError
from retrieval.data.parsing import decode_text, field_count_error, read_bytes

if TYPE_CHECKING:
    import _csv

log = logging.getLogger(__name__)

HEAD_BYTES = 1 << 16
"""How much of a file is decoded to find its separator and header before Arrow reads it all: the
lines that end in its first 64 KiB."""


class DelimitedTable(NamedTuple):
    """A delimited text file as read.

    Attributes:
        frame: one text column per header field (names stripped), one row per record.
        line_of: row position -> the 1-based line where that row starts.
        header_line: the line of the header (blank lines before it are skipped).
    """

    frame: pd.DataFrame
    line_of: Callable[[int], int]
    header_line: int


def read_delimited(path: Path, delimiter: str | None) -> DelimitedTable:
    """Reads a UTF-8 file (an optional BOM) with a header line and one record per row.

    Fields are quoted as in CSV; blank lines are skipped and counted in the log (INFO) when they
    are not at the end. ``delimiter`` None: a comma, unless the header line holds none and a tab
    or a semicolon (:func:`sniff_delimiter`).

    Raises:
        DataError: a missing or unreadable file, bytes that are not UTF-8, no header, repeated
            column names, a record with another field count than the header or a field larger
            than :func:`csv.field_size_limit`; each naming the line.
    """
    raw = read_bytes(path)
    table = _read_with_arrow(path, raw, delimiter)
    return table if table is not None else _scan(path, raw, delimiter)


def sniff_delimiter(text: str) -> str:
    """A ``.csv`` file's separator, read from its header line (the first non-blank one): a comma,
    unless the line holds none and a tab or a semicolon (a tab first)."""
    header = next((line for line in text.split("\n") if line.strip()), "")
    if "," not in header:
        return next((d for d in ("\t", ";") if d in header), ",")
    return ","


def _read_with_arrow(path: Path, raw: bytes, delimiter: str | None) -> DelimitedTable | None:
    """``raw`` read by Arrow, or None where the :mod:`csv` module must read it (see the module)."""
    head = _head(raw)
    if head is None:
        return None
    delimiter = delimiter or sniff_delimiter(head)
    reader = csv.reader(io.StringIO(head, newline=""), delimiter=delimiter)
    try:
        header, header_line, blank = _header(path, reader)
    except (csv.Error, DataError):
        return None
    names = [h.strip() for h in header]
    if len(set(names)) < len(names):
        return None
    try:
        table = pv.read_csv(
            pa.py_buffer(raw),
            parse_options=pv.ParseOptions(delimiter=delimiter, newlines_in_values=True),
            convert_options=pv.ConvertOptions(column_types=dict.fromkeys(header, pa.string())),
        )
    except pa.ArrowException:
        return None
    longest = max((pc.max(pc.binary_length(c)).as_py() or 0 for c in table.columns), default=0)
    # The header as the csv module read it, so that Arrow read the same records after it.
    if table.column_names != header or longest > csv.field_size_limit():
        return None
    inner_blank = _inner_blank_lines(raw, table.num_rows)
    if inner_blank is None:
        return None
    _log_blank_lines(path, blank + inner_blank)
    frame = table.to_pandas()
    frame.columns = names
    lines = functools.cache(lambda: _scan(path, raw, delimiter).line_of)
    return DelimitedTable(frame, lambda row: lines()(row), header_line)


def _head(raw: bytes) -> str | None:
    """The lines of ``raw`` that end in its first :data:`HEAD_BYTES` (all of a smaller file),
    decoded (a BOM dropped), or None when they hold only whitespace or do not decode: the
    separator and the header are then read from all of it."""
    end = len(raw) if len(raw) <= HEAD_BYTES else raw.rfind(b"\n", 0, HEAD_BYTES) + 1
    try:
        head = raw[:end].decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    return head if head.strip() else None


def _inner_blank_lines(raw: bytes, rows: int) -> int | None:
    """The blank lines between the header and the last of its ``rows`` records, or None when
    only parsing tells them from line breaks inside quoted fields."""
    start = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    end = len(raw)
    while start < end and raw[start] in b"\r\n":
        start += 1
    while end > start and raw[end - 1] in b"\r\n":
        end -= 1
    breaks = _line_breaks(raw, start, end)
    if breaks == rows:  # one line break before each record: no blank line, no multi-line field
        return 0
    if raw.find(b'"', start, end) < 0:  # one record per line
        return breaks - rows
    if all(raw.find(pair, start, end) < 0 for pair in (b"\n\n", b"\r\r", b"\n\r")):
        return 0  # no line break follows another (\r\n is one): every extra one is quoted
    return None


def _line_breaks(raw: bytes, start: int, end: int) -> int:
    """Line breaks in ``raw[start:end]`` as the :mod:`csv` module counts lines: ``\\r\\n`` is one
    and ``\\r`` alone is one."""
    codes = np.frombuffer(raw, np.uint8, end - start, start)
    newlines = int(np.count_nonzero(codes == ord("\n")))
    if raw.find(b"\r", start, end) < 0:
        return newlines
    returns = codes == ord("\r")
    pairs = np.count_nonzero(returns[:-1] & (codes[1:] == ord("\n")))
    return newlines + int(np.count_nonzero(returns)) - int(pairs)


def _scan(path: Path, raw: bytes, delimiter: str | None) -> DelimitedTable:
    """``raw`` read by the :mod:`csv` module, record by record: the reference reading."""
    text = decode_text(path, raw, "utf-8-sig")
    delimiter = delimiter or sniff_delimiter(text)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    rows: list[list[str]] = []
    lines: list[int] = []
    try:
        header, header_line, blank = _header(path, reader)
        names = [h.strip() for h in header]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            listed = ", ".join(map(repr, repeated))
            raise DataError(f"{path}, line {header_line}: column(s) {listed} repeated")
        pending = 0  # blank lines since the last row: counted once a row follows them
        while True:
            start = reader.line_num + 1
            row = next(reader, None)
            if row is None:
                break
            if not row:
                pending += 1
                continue
            if len(row) != len(names):
                raise field_count_error(path, start, names, len(row))
            rows.append(row)
            lines.append(start)
            blank, pending = blank + pending, 0
    except csv.Error as e:
        raise DataError(f"{path}, line {reader.line_num}: {e}") from None
    _log_blank_lines(path, blank)
    return DelimitedTable(pd.DataFrame(rows, columns=names, dtype=object), lines.__getitem__, header_line)


def _header(path: Path, reader: _csv.Reader) -> tuple[list[str], int, int]:
    """The header's fields as written, its line and the blank lines before it.

    Raises:
        DataError: nothing but blank lines.
    """
    blank = 0
    header = next(reader, None)
    while header == []:
        blank += 1
        header = next(reader, None)
    if header is None:
        raise DataError(f"{path}: empty file")
    return header, reader.line_num, blank


def _log_blank_lines(path: Path, count: int) -> None:
    if count:
        log.info("%s: skipped %d blank line(s)", path, count)
