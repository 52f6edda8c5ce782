"""CSV and TSV files read by Arrow (``retrieval.data.delimited``) against the csv module's reading.

The oracle is :func:`reference`, a few lines of Python's :mod:`csv` module written here: the
records, their first lines and the blank lines skipped must be the same whether Arrow read the
file or the careful scan did, and a file Arrow reads must load into the same
:class:`~retrieval.data.interactions.Interactions` (values and dtypes) as with Arrow switched off.
"""

from __future__ import annotations

import csv
import io
import logging
import re
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrieval.data import delimited
from retrieval.data.delimited import DelimitedTable, read_delimited
from retrieval.data.errors import DataError
from retrieval.data.tables import load_table
from tests.data.helpers import reproducible


def reference(text: str, delimiter: str = ",") -> tuple[list[str], list[list[str]], list[int], int]:
    """The csv module's reading of a file's text: the header's names (stripped), the records
    after it, the line each starts on, and the blank lines before the last record."""
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=""), delimiter=delimiter)
    records: list[list[str]] = []
    lines: list[int] = []
    blank = pending = 0
    while (row := next(reader, None)) is not None:
        if not row:
            pending += 1
            continue
        records.append(row)
        lines.append(reader.line_num - sum(row_breaks(field) for field in row))
        blank, pending = blank + pending, 0
    return [h.strip() for h in records[0]], records[1:], lines[1:], blank


def row_breaks(field: str) -> int:
    """Line breaks inside a (quoted) field: the lines its record spans beyond the first."""
    return len(re.findall(r"\r\n|\r|\n", field))


class Scans:
    """Counts the careful scans: a file Arrow read is scanned only when a row's line is asked."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        scan = delimited._scan

        def counted(*args: object) -> DelimitedTable:
            self.count += 1
            return scan(*args)  # type: ignore[arg-type]

        monkeypatch.setattr(delimited, "_scan", counted)


def blank_lines_logged(caplog: pytest.LogCaptureFixture) -> list[int]:
    return [
        int(m.group(1)) for r in caplog.records if (m := re.search(r"skipped (\d+) blank", r.getMessage()))
    ]


TRICKY = {
    "quoted fields": 'user,item,timestamp,title\nu1,a,1,"Alpha, the ""first"""\nu2,"b,c",2,plain\n',
    "ids with leading zeros": "user,item,timestamp\n007,0042,1\n0,00,2\n-1,+5,3\n1e3,1.0,4\n",
    "blank lines": "\n\nuser,item,timestamp\n\nu,a,1\n\n\nu,b,2\n\n\n",
    "BOM": "\ufeffuser,item,timestamp\nu,a,1\n",
    "BOM inside a field": "user,item,timestamp\n\ufeffu,a,1\n",
    "CRLF": "user,item,timestamp\r\nu,a,1\r\n\r\nu,b,2\r\n",
    "lone CR": "user,item,timestamp\ru,a,1\r\ru,b,2",
    "unicode": "user,item,timestamp,title\nü,日本,1,Café ☕\n😀,a\u00a0,2,\u2028x\n",
    "line breaks in quoted fields": (
        'user,item,timestamp,title\nu,a,1,"one\ntwo"\nu,b,2,"\r\nx\r\n"\nu,c,3,t\n'
    ),
    "spaces kept in fields": 'user , item,timestamp\n u , a ,1\n"  ",b,2\n',
    "empty fields": "user,item,timestamp,rating,title\nu,a,1,,\nu,b,2,5,\n",
    "quote inside a field": 'user,item,timestamp\nu,a"b,1\nu,"c"d,2\n',
    "NUL": "user,item,timestamp\nu\x00,a,1\n",
    "header only": "user,item,timestamp\n",
    "no final line break": "user,item,timestamp\nu,a,1",
}


@pytest.mark.parametrize("text", TRICKY.values(), ids=TRICKY.keys())
def test_arrow_reads_what_the_csv_module_reads(
    tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "log.csv"
    path.write_bytes(text.encode())
    names, records, lines, blank = reference(text)
    scans = Scans(monkeypatch)
    with caplog.at_level(logging.INFO, logger="retrieval.data"):
        table = read_delimited(path, None)
    assert scans.count == 0  # Arrow read it
    assert list(table.frame.columns) == names
    assert table.frame.astype(object).to_numpy().tolist() == records
    assert blank_lines_logged(caplog) == ([blank] if blank else [])
    assert [table.line_of(row) for row in range(len(records))] == lines
    assert scans.count <= 1  # the lines come from one scan, on demand


@pytest.mark.parametrize("text", TRICKY.values(), ids=TRICKY.keys())
def test_a_table_read_by_arrow_loads_as_the_careful_scan_loads_it(
    tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log.csv"
    path.write_bytes(text.encode())
    for unit in ("s", "ms"):
        arrow = loaded(path, unit)
        with monkeypatch.context() as m:
            m.setattr(delimited, "_read_with_arrow", lambda *args: None)
            careful = loaded(path, unit)
        if isinstance(careful, str):
            assert arrow == careful
            continue
        assert not isinstance(arrow, str), arrow
        pd.testing.assert_frame_equal(arrow[0], careful[0])
        pd.testing.assert_frame_equal(arrow[1], careful[1])


def loaded(path: Path, unit: str) -> tuple[pd.DataFrame, pd.DataFrame] | str:
    """What :func:`load_table` gives: the events and items, or the DataError's message."""
    try:
        data = load_table(path, timestamp_unit=unit)
    except DataError as e:
        return str(e)
    return data.events, data.items


def test_ids_are_text_as_written(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    path.write_text("user,item,timestamp\n007,0042,1\n7,42,0002\n")
    data = load_table(path)
    assert data.events["user"].tolist() == ["007", "7"]
    assert data.events["item"].tolist() == ["0042", "42"]
    assert data.items["item"].tolist() == ["0042", "42"]
    assert data.events["timestamp"].tolist() == [1, 2]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["9223372036854775807", "0"], [2**63 - 1, 0]),  # int64's largest, exactly
        (["007", "1"], [7, 1]),
        (["-5", "+6"], [-5, 6]),  # signs: pandas' rules, not Arrow's digits path
        ([" 8", "9 "], [8, 9]),
        (["1e3", "12"], [1000, 12]),
    ],
)
def test_integer_timestamps_by_arrow_or_by_text(
    tmp_path: Path, values: list[str], expected: list[int]
) -> None:
    path = tmp_path / "log.csv"
    path.write_text("user,item,timestamp\n" + "".join(f"u,i{n},{v}\n" for n, v in enumerate(values)))
    assert load_table(path).events["timestamp"].tolist() == expected


def test_a_bad_value_in_a_file_arrow_read_names_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Past the first 64 KiB (the head read for the header), after a record over three lines and
    # two blank lines: the careful scan counts the lines, once an error needs one.
    records = [f"u{n % 50},i{n},{n},t" for n in range(5000)]
    records[10] = 'u10,i10,10,"three\nline\ntitle"'
    records[20] += "\n\n"
    records[4000] = "u0,i4000,soon,t"
    text = "user,item,timestamp,title\n" + "\n".join(records) + "\n"
    path = tmp_path / "log.csv"
    path.write_text(text)
    assert len(text) > delimited.HEAD_BYTES
    assert reference(text)[2][4000] == 4000 + 2 + 2 + 2  # the header, the title's lines, the blanks
    scans = Scans(monkeypatch)
    with pytest.raises(DataError, match=r"log\.csv, line 4006: timestamp 'soon' is not an integer"):
        load_table(path)
    assert scans.count == 1


def test_line_breaks_in_quoted_fields_across_arrows_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Arrow parses a file in blocks of 1 MiB; a quoted field over lines must not end one.
    records = [f'u{n % 7},i{n},{n},"title {n}\n{"x" * (1 + n % 97)}\r\n,end"' for n in range(30_000)]
    text = "user,item,timestamp,title\n" + "\n".join(records) + "\n"
    path = tmp_path / "log.csv"
    path.write_text(text)
    assert len(text) > 2 * 2**20
    names, expected, lines, _ = reference(text)
    scans = Scans(monkeypatch)
    table = read_delimited(path, None)
    assert scans.count == 0
    assert list(table.frame.columns) == names
    assert table.frame.astype(object).to_numpy().tolist() == expected
    assert [table.line_of(row) for row in (0, 1, 29_999)] == [lines[0], lines[1], lines[-1]] == [2, 5, 89_999]


def test_a_header_longer_than_the_head_is_read_whole(tmp_path: Path) -> None:
    # The header's last name runs past the first 64 KiB, over lines: the csv module reads it whole.
    long_name = "x\n" * delimited.HEAD_BYTES
    text = f'user,item,timestamp,"{long_name}"\nu,a,1,t\n'
    path = tmp_path / "log.csv"
    path.write_text(text)
    table = read_delimited(path, None)
    assert list(table.frame.columns) == ["user", "item", "timestamp", long_name.strip()]
    assert table.frame.to_numpy().tolist() == [["u", "a", "1", "t"]]
    assert table.line_of(0) == reference(text)[2][0] == 2 + delimited.HEAD_BYTES


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        (
            "uid,item,timestamp\nu,a,1\n",
            r"log\.csv, line 1: missing column\(s\) user; found: uid, item, timestamp",
        ),
        ("\n\nuser,item\r\nu,a\r\n", r"log\.csv, line 3: missing column\(s\) timestamp"),
        (
            "\ufeffuser,item,ts\nu,a,1\n",
            r"log\.csv, line 1: missing column\(s\) timestamp; found: user, item, ts",
        ),
        ("user,item,timestamp\nu,a,1\n\nu,,2\n", r"log\.csv, line 4: empty item id"),
        ("user,item,timestamp\r\nu,a,1\r\nu,b,x\r\n", r"log\.csv, line 3: timestamp 'x' is not an integer"),
        (
            "user,item,timestamp\nü,a,1\n日,b,2024-05-01\n",
            r"line 3: timestamp '2024-05-01' is not an integer .*reads as an ISO-8601 date",
        ),
    ],
)
def test_errors_in_files_arrow_reads_name_the_line(tmp_path: Path, text: str, pattern: str) -> None:
    path = tmp_path / "log.csv"
    path.write_bytes(text.encode())
    assert delimited._read_with_arrow(path, path.read_bytes(), None) is not None
    with pytest.raises(DataError, match=pattern):
        load_table(path)


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        (
            "user,item,timestamp\nu,a,1\nu,b\n",
            r"line 3: expected 3 fields \(user, item, timestamp\), found 2",
        ),
        ('user,item,timestamp\nu,"a,1\nv,b,2\n', r"line 2: expected 3 fields .*found 2"),
        ("user,item,timestamp,user\nu,a,1,v\n", r"line 1: column\(s\) 'user' repeated"),
        (b"user,item,timestamp\nu,\xe9,1\n", r"line 2: not UTF-8 text \(byte 0xe9 at offset 22\)"),
        ("\n\n", r"log\.csv: empty file"),
        # Blank lines beside line breaks in quoted fields: only parsing tells them apart.
        ('user,item,timestamp,title\nu,a,1,"x\n\ny"\n\nu,b,2,z\n', None),
    ],
)
def test_files_arrow_does_not_read_are_scanned(
    tmp_path: Path, text: str | bytes, pattern: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log.csv"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert delimited._read_with_arrow(path, path.read_bytes(), None) is None
    scans = Scans(monkeypatch)
    if pattern is not None:
        with pytest.raises(DataError, match=rf"log\.csv, {pattern}" if "line" in pattern else pattern):
            read_delimited(path, None)
    else:
        assert isinstance(text, str)
        table = read_delimited(path, None)
        names, records, lines, _ = reference(text)
        assert list(table.frame.columns) == names and table.frame.to_numpy().tolist() == records
        assert [table.line_of(row) for row in range(len(records))] == lines == [2, 6]
    assert scans.count == 1


def test_tab_separated_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = 'uid\tsku\tts\nc1\t"p\t1"\t1\nc1\tp,2\t2\n'
    path = tmp_path / "log.tsv"
    path.write_text(text)
    scans = Scans(monkeypatch)
    table = read_delimited(path, "\t")
    assert scans.count == 0
    names, records, _, _ = reference(text, "\t")
    assert (list(table.frame.columns), table.frame.astype(object).to_numpy().tolist()) == (names, records)


# --- random files: whatever reads them, the csv module's records and lines ------------------------

FIELDS = ["u", "007", "", " x ", "é", 'a"b', "1,2", "l1\nl2", "l1\r\nl2", "\n\n", "\x00", "\ufeff", "\t", ";"]


@st.composite
def csv_texts(draw: st.DrawFn) -> str:
    """A header and records of mostly the header's width, fields quoted where they must be (and
    some where they need not), blank lines, any line break, an optional BOM."""
    width = draw(st.integers(1, 4))
    eol = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    lines = [",".join(f"c{k}" for k in range(width))]
    for _ in range(draw(st.integers(0, 6))):
        row = []
        for _ in range(width + draw(st.sampled_from([0] * 19 + [1]))):
            field = draw(st.sampled_from(FIELDS))
            if any(c in field for c in ',"\r\n') or draw(st.booleans()):
                field = '"' + field.replace('"', '""') + '"'
            row.append(field)
        lines.append(",".join(row))
        lines.extend([""] * draw(st.sampled_from([0, 0, 0, 1, 2])))
    bom = draw(st.sampled_from(["", "\ufeff"]))
    return bom + eol * draw(st.integers(0, 2)) + eol.join(lines) + eol * draw(st.integers(0, 2))


@reproducible(max_examples=200)
@given(text=csv_texts())
def test_random_files_read_as_the_csv_module_reads_them(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    path = tmp_path_factory.mktemp("csv") / "log.csv"
    path.write_bytes(text.encode())
    names, records, lines, _ = reference(text)
    if any(len(r) != len(names) for r in records):
        with pytest.raises(DataError, match=r"log\.csv, line \d+: "):
            read_delimited(path, ",")
        return
    table = read_delimited(path, ",")  # the comma given: a tab in a field could make the header sniffed so
    assert list(table.frame.columns) == names
    assert table.frame.astype(object).to_numpy().tolist() == records
    assert [table.line_of(row) for row in range(len(records))] == lines


# --- typing the text: Arrow's cast where it gives what pandas gives --------------------------------


@pytest.mark.parametrize(
    "values",
    [
        ["5", "4", "007"],  # ASCII digits: cast by Arrow
        ["5", "4.5", "3"],
        ["5", "", "3"],
        ["-1", "+2", " 3 "],
        ["18446744073709551615", "1"],  # beyond int64
        ["1e3", "inf", "nan"],
        ["x", "1"],
        ["٣", "1"],  # an Arabic-Indic digit
    ],
)
def test_side_columns_are_typed_as_pandas_types_text(tmp_path: Path, values: list[str]) -> None:
    path = tmp_path / "log.csv"
    path.write_text(
        "user,item,timestamp,rating\n" + "".join(f"u,i{n},{n},{v}\n" for n, v in enumerate(values))
    )
    text = pd.Series(values, dtype=object, name="rating")
    try:
        expected = pd.to_numeric(text)
    except ValueError:
        expected = text
    pd.testing.assert_series_equal(load_table(path).events["rating"], expected)
