"""Malformed data files for every loader: a DataError naming the file and the line, never another
exception and never data silently read as something else.

Hand-written cases for each kind of damage (truncated lines, wrong column counts, non-numeric or
out-of-range fields, non-UTF-8 bytes, empty files, users without items, duplicates) in every
format (MovieLens, S3-Rec, SASRec pairs, CSV and Parquet tables under any column names and
timestamp units, RecBole atomic files), then a seeded property test that damages valid files at
random (truncation, flipped and inserted bytes) and checks that each either loads or is refused
with a DataError that names the file.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrieval.data.errors import DataError
from retrieval.data.interactions import Interactions
from retrieval.data.loaders import load_interactions
from retrieval.data.movielens import load_movielens
from retrieval.data.recbole import load_recbole
from retrieval.data.s3rec import load_s3rec, load_sasrec
from retrieval.data.tables import load_table
from tests.data.helpers import encoded, reproducible, write_files

ML100K = {
    "u.data": "1\t10\t4\t881250949\n1\t20\t5\t881250950\n2\t10\t3\t881250951\n",
    "u.genre": "unknown|0\nAction|1\nComedy|2\n",
    "u.item": "10|Ten (1995)|01-Jan-1995||http://x|0|1|0\n20|Twenty (1996)|01-Jan-1996||http://y|0|0|1\n",
}
ML1M = {
    "ratings.dat": "1::10::4::978300760\n1::20::3::978302109\n2::10::5::978298413\n",
    "movies.dat": "10::Ten (1995)::Drama\n20::Twenty (1996)::Comedy|Drama\n",
}
S3REC = {
    "Toy.txt": "1 10 20 30\n2 20 30\n3 10 30 40\n",
    "Toy_item2attributes.json": '{"10": [1], "20": [1, 2]}',
}
CSV = {"log.csv": "user,item,timestamp,rating\nu1,a,10,4\nu1,b,20,5\nu2,a,15,3\n"}
SASREC = {"pairs.txt": "1 10\n1 20\n2 10\n1 30\n2 40\n"}
RECBOLE = {
    "x.inter": "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    "1\t10\t4\t5\n1\t20\t3\t6\n2\t10\t5\t7\n",
    "x.item": "item_id:token\ttitle:token\tclass:token_seq\n10\tTen\tA B\n20\tTwenty\tB\n",
}
SHOP = {"shop.csv": "uid,sku,ts\nc1,a,2024-05-01T10:00:00Z\nc1,b,2024-05-01T10:00:01.5Z\nc2,a,2024-05-02\n"}
SHOP_COLUMNS = {"user": "uid", "item": "sku", "timestamp": "ts"}


def folder(tmp_path: Path, files: Mapping[str, str | bytes], **changes: str | bytes) -> Path:
    """Writes ``files`` with ``changes`` applied (a file's new content) into ``tmp_path``."""
    return write_files(tmp_path, {**files, **changes})


def refused(load: Callable[[], Interactions], pattern: str) -> str:
    with pytest.raises(DataError) as error:
        load()
    message = str(error.value)
    assert re.search(pattern, message), message
    return message


# --- MovieLens-100K ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "pattern"),
    [
        # truncated lines and wrong column counts
        ("u.data", "1\t10\t4\t881250949\n1\t20", r"u\.data, line 2: expected 4 fields .*found 2"),
        ("u.data", "1\t10\t4\t881250949\t7\n2\t20\t4\t881250950\t8\n", r"u\.data, line 1: .*found 5"),
        ("u.data", "1\t10\t4\t881250949\n1\t10\t4\t881250949\t9\n", r"u\.data, line 2: .*found 5"),
        # non-numeric, not quite integers, out of range
        ("u.data", "1\t10\t4.0\t881250949\n", r"u\.data, line 1: rating '4\.0' is not an integer"),
        ("u.data", "1\t10\t4\t881_250_949\n", r"u\.data, line 1: timestamp '881_250_949' is not an integer"),
        ("u.data", "1\t10\t4\t1\n1\t20\t4\t1.5\n", r"u\.data, line 2: timestamp '1\.5' is not an integer"),
        ("u.data", "1\tten\t4\t881250949\n", r"u\.data, line 1: item 'ten' is not an integer"),
        (
            "u.data",
            "1\t10\t4\t1\n\n1\tx\t4\t2\n",
            r"u\.data, line 3: item 'x' is not an integer",
        ),  # blank counted
        ("u.data", "1\t10\t4\t9223372036854775808\n", r"u\.data, line 1: timestamp .* is not an integer"),
        ("u.data", b"1\t1\xb20\t4\t881250949\n", r"u\.data, line 1: item '1²0' is not an integer"),
        ("u.data", b"\xef\xbb\xbf1\t10\t4\t881250949\n", r"u\.data, line 1: user .* is not an integer"),
        ("u.data", b"1\t10\x00\t4\t881250949\n", r"u\.data, line 1: item '10\\x00' is not an integer"),
        # empty files
        ("u.data", "", r"u\.data: empty file"),
        ("u.data", "\n \n\t\n", r"u\.data: empty file"),
        ("u.item", "", r"u\.item: empty file"),
        ("u.genre", "\n", r"u\.genre: empty file"),
        # duplicates
        (
            "u.item",
            ML100K["u.item"] + "10|Again|x||u|0|0|1\n",
            r"u\.item, line 3: movie id 10 already on line 1",
        ),
        (
            "u.genre",
            "unknown|0\nAction|1\nComedy|1\n",
            r"u\.genre, line 3: genre index 1 already used on line 2",
        ),
        ("u.genre", "unknown|0\nAction|2\n", r"u\.genre: genre indices must run 0\.\.1"),
        ("u.genre", "unknown|0\nAction|one\n", r"u\.genre, line 2: genre index 'one' is not an integer"),
        # item lines
        ("u.item", "10|Ten (1995)|x||http://x|0|1\n", r"u\.item, line 1: expected 8 fields .*found 7"),
        ("u.item", "10|Ten|x||u|0|0|1\n\n20|Twenty|x||u|0|1\n", r"u\.item, line 3: expected 8 fields"),
        ("u.item", "10|Ten|x||u|0|1|yes\n", r"u\.item, line 1: genre flags must be 0 or 1"),
        ("u.item", "1 0|Ten|x||u|0|1|0\n", r"u\.item, line 1: movie id '1 0' is not an integer"),
    ],
)
def test_movielens_100k(tmp_path: Path, name: str, content: str | bytes, pattern: str) -> None:
    refused(lambda: load_movielens(folder(tmp_path, ML100K, **{name: content})), pattern)


@pytest.mark.parametrize(
    ("name", "content", "pattern"),
    [
        (
            "ratings.dat",
            "1::10::4::978300760\n1::20::3",
            r"ratings\.dat, line 2: expected 4 fields .*found 3",
        ),
        ("ratings.dat", "1::10::4::978300760::1\n", r"ratings\.dat, line 1: .*found 5"),
        ("ratings.dat", "1\t10\t4\t978300760\n", r"ratings\.dat, line 1: expected 4 fields .*found 1"),
        ("ratings.dat", "1::10\t4::978300760\n", r"ratings\.dat, line 1: .*found 3"),
        ("ratings.dat", "1::10::four::978300760\n", r"ratings\.dat, line 1: rating 'four' is not an integer"),
        ("ratings.dat", "", r"ratings\.dat: empty file"),
        ("movies.dat", "", r"movies\.dat: empty file"),
        ("movies.dat", "10::Ten\n", r"movies\.dat, line 1: expected 3 fields .*found 2"),
        (
            "movies.dat",
            "10::A::Drama\n10::B::Comedy\n",
            r"movies\.dat, line 2: movie id 10 already on line 1",
        ),
        ("movies.dat", "x10::Ten::Drama\n", r"movies\.dat, line 1: movie id 'x10' is not an integer"),
    ],
)
def test_movielens_1m(tmp_path: Path, name: str, content: str | bytes, pattern: str) -> None:
    refused(lambda: load_movielens(folder(tmp_path, ML1M, **{name: content})), pattern)


def test_movielens_files_are_latin_1_so_any_byte_is_text(tmp_path: Path) -> None:
    # Latin-1 decodes every byte: a title with 0xe9 is "é", never a decoding error.
    path = folder(tmp_path, ML1M, **{"movies.dat": b"10::Caf\xe9 (1995)::Drama\n20::Twenty::Comedy\n"})
    assert load_movielens(path).items["title"].tolist() == ["Café (1995)", "Twenty"]


# --- S3-Rec sequences and attributes ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "pattern"),
    [
        (
            "Toy.txt",
            "1 10 20\n2\n",
            r"Toy\.txt, line 2: expected 'user item \[item \.\.\.\]', found one field",
        ),
        ("Toy.txt", "1 10 20\n2 3", None),  # a truncated last line is still a user with an item
        ("Toy.txt", "1 10 20\n2 20 3x\n", r"Toy\.txt, line 2: item id '3x' is not a number"),
        ("Toy.txt", "1 10 20\n2 20\n\n3 20 x5\n", r"Toy\.txt, line 4: item id 'x5' is not a number"),
        ("Toy.txt", "1 10 20\nu2 20\n", r"Toy\.txt, line 2: user id 'u2' is not a number"),
        ("Toy.txt", "1 10 2.5\n", r"Toy\.txt, line 1: item id '2\.5' is not a number"),
        ("Toy.txt", "1 10 20\n1 30\n", r"Toy\.txt, line 2: user 1 already has a line \(line 1\)"),
        (
            "Toy.txt",
            b"1 10 20\n2 \xff\xfe 30\n",
            r"Toy\.txt, line 2: not UTF-8 text \(byte 0xff at offset 10\)",
        ),
        ("Toy.txt", "1 10 20\n".encode("utf-16"), r"Toy\.txt, line 1: not UTF-8 text"),
        ("Toy.txt", b"1 10\x0020\n", r"Toy\.txt, line 1: item id '10\\x0020' is not a number"),
        ("Toy.txt", "1 10 ٢٠\n", r"Toy\.txt, line 1: item id '٢٠' is not a number"),  # Arabic-Indic digits
        ("Toy.txt", "", r"Toy\.txt: empty file"),
        ("Toy_item2attributes.json", "", r"item2attributes\.json, line 1: invalid JSON"),
        (
            "Toy_item2attributes.json",
            '{"10": [1],\n"20": [1, 2',
            r"item2attributes\.json, line 2: invalid JSON",
        ),
        ("Toy_item2attributes.json", b'{"10": ["\xff"]}', r"item2attributes\.json, line 1: not UTF-8 text"),
        ("Toy_item2attributes.json", "[1, 2]", r"item2attributes\.json: expected a JSON object"),
        (
            "Toy_item2attributes.json",
            '{"10": [true]}',
            r"item2attributes\.json: item '10': attributes must be",
        ),
        (
            "Toy_item2attributes.json",
            '{"10": [NaN]}',
            r"item2attributes\.json: item '10': attributes must be",
        ),
        (
            "Toy_item2attributes.json",
            '{"10": [[1]]}',
            r"item2attributes\.json: item '10': attributes must be",
        ),
        ("Toy_item2attributes.json", '{"10": null}', r"item2attributes\.json: item '10': attributes must be"),
        ("Toy_item2attributes.json", "[" * 100_000, r"item2attributes\.json: JSON nested too deeply"),
    ],
)
def test_s3rec(tmp_path: Path, name: str, content: str | bytes, pattern: str | None) -> None:
    path = folder(tmp_path, S3REC, **{name: content}) / "Toy.txt"
    if pattern is None:
        assert load_s3rec(path).events["item"].tolist()[-1] == "3"
    else:
        refused(lambda: load_s3rec(path), pattern)


# --- CSV and Parquet tables ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        ("user,item,timestamp\nu,a,1\nu,b", r"log\.csv, line 3: expected 3 fields .*found 2"),
        ("user,item,timestamp\nu,a,1,extra\n", r"log\.csv, line 2: expected 3 fields .*found 4"),
        ('user,item,timestamp\nu,"a,1\nv,b,2\n', r"log\.csv, line 2: expected 3 fields .*found 2"),
        ("user,item,timestamp,user\nu,a,1,v\n", r"log\.csv, line 1: column\(s\) 'user' repeated"),
        ("\n\nuser,item\nu,a\n", r"log\.csv, line 3: missing column\(s\) timestamp; found: user, item"),
        ("user,item,timestamp\nu,a,soon\n", r"log\.csv, line 2: timestamp 'soon' is not an integer"),
        ("user,item,timestamp\nu,a,1.5\n", r"log\.csv, line 2: timestamp '1\.5' is not an integer"),
        # A quoted title over two lines and a blank line: the bad row starts on line 5.
        (
            'user,item,timestamp,title\nu,a,1,"Multi\nline"\n\nu,b,soon,B\n',
            r"log\.csv, line 5: timestamp 'soon' is not an integer",
        ),
        ("user,item,timestamp\nu,a,1e30\n", r"log\.csv, line 2: timestamp '1e30' is not an integer"),
        ("user,item,timestamp\nu,a,9223372036854775808\n", r"line 2: timestamp '9223372036854775808' is not"),
        ("user,item,timestamp\nu,a,-99999999999999999999\n", r"line 2: timestamp .* is not an integer"),
        ("user,item,timestamp\nu,a,nan\n", r"log\.csv, line 2: timestamp 'nan' is not an integer"),
        ("user,item,timestamp\nu,a,inf\n", r"log\.csv, line 2: timestamp 'inf' is not an integer"),
        ("user,item,timestamp\nu,a,0x10\n", r"log\.csv, line 2: timestamp '0x10' is not an integer"),
        ("user,item,timestamp\nu,a,1\nu,b,9007199254740993.0\n", r"line 3: timestamp '9007199254740993\.0'"),
        ("user,item,timestamp\nu,a,1\n,b,2\n", r"log\.csv, line 3: empty user id"),
        ("user,item,timestamp\nu, ,1\n", r"log\.csv, line 2: empty item id"),
        (b"user,item,timestamp\nu,\xe9t\xe9,1\n", r"log\.csv, line 2: not UTF-8 text \(byte 0xe9"),
        (
            "user,item,timestamp\nu," + "x" * 200_000 + ",1\n",
            r"log\.csv, line 2: field larger than field limit",
        ),
        ("", r"log\.csv: empty file"),
        ("\n\n", r"log\.csv: empty file"),
        ("user,item,timestamp\n", r"log\.csv: empty file \(no rows\)"),
    ],
)
def test_csv(tmp_path: Path, content: str | bytes, pattern: str) -> None:
    refused(lambda: load_table(folder(tmp_path, {"log.csv": content}) / "log.csv"), pattern)


def test_csv_integers_are_exact(tmp_path: Path) -> None:
    # A whole number written as 1e3 is 1000; large integers beside it are not rounded through float.
    path = folder(tmp_path, {"log.csv": "user,item,timestamp\nu,a,9007199254740993\nu,b,1e3\n"}) / "log.csv"
    assert load_table(path).events["timestamp"].tolist() == [9007199254740993, 1000]


@pytest.mark.parametrize(
    ("frame", "pattern"),
    [
        (
            pd.DataFrame({"user": ["u"], "item": ["a"], "timestamp": [1e30]}),
            r"row 1: timestamp '1e\+30' is not",
        ),
        (
            pd.DataFrame({"user": ["u", "v"], "item": ["a", "b"], "timestamp": [1.0, float("nan")]}),
            r"row 2: timestamp",
        ),
        (
            pd.DataFrame({"user": ["u", "v"], "item": ["a", "b"], "timestamp": [1.0, 2.5]}),
            r"log\.parquet, row 2: timestamp '2\.5' is not an integer",
        ),
        (
            pd.DataFrame({"user": ["u"], "item": ["a"], "timestamp": [True]}),
            r"row 1: timestamp 'True' is not",
        ),
        (
            pd.DataFrame({"user": ["u"], "item": ["a"], "timestamp": pd.Series([2**64 - 1], dtype="uint64")}),
            r"row 1: timestamp '18446744073709551615' is not",
        ),
        (
            pd.DataFrame({"user": [[1, 2]], "item": ["a"], "timestamp": [1]}),
            r"row 1: user id .* not text or a number",
        ),
        (
            pd.DataFrame({"user": ["u"], "item": [b"\x00a"], "timestamp": [1]}),
            r"row 1: item id .* not text or a number",
        ),
        (
            pd.DataFrame({"user": [1.0, None], "item": ["a", "b"], "timestamp": [1, 2]}),
            r"row 2: empty user id",
        ),
        (pd.DataFrame({"user": ["u"], "item": ["a"]}), r"log\.parquet: missing column\(s\) timestamp"),
        (pd.DataFrame({"user": [], "item": [], "timestamp": []}), r"log\.parquet: empty file \(no rows\)"),
    ],
)
def test_parquet(tmp_path: Path, frame: pd.DataFrame, pattern: str) -> None:
    frame.to_parquet(tmp_path / "log.parquet")
    refused(lambda: load_table(tmp_path / "log.parquet"), pattern)


@pytest.mark.parametrize("damage", ["empty", "truncated", "zeroed"])
def test_damaged_parquet_file(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "log.parquet"
    pd.DataFrame({"user": ["u"] * 50, "item": ["a"] * 50, "timestamp": range(50)}).to_parquet(path)
    data = path.read_bytes()
    damaged = {
        "empty": b"",
        "truncated": data[: len(data) // 2],
        "zeroed": data[:100] + bytes(50) + data[150:],
    }
    path.write_bytes(damaged[damage])
    refused(lambda: load_table(path), r"log\.parquet: not a readable Parquet file")


# --- SASRec pairs, RecBole atomic files, tables under their own column names -----------------------


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        ("1 10\n1 20\n1\n", r"pairs\.txt, line 3: expected 2 fields \(user item\) .*found 1"),
        ("1 10\n1 20 30\n", r"pairs\.txt, line 2: expected 2 fields \(user item\) .*found 3"),
        ("1 10\n1 2x\n", r"pairs\.txt, line 2: item id '2x' is not a number"),
        ("1 10\nu 20\n", r"pairs\.txt, line 2: user id 'u' is not a number"),
        (b"1 10\n1 \xff\n", r"pairs\.txt, line 2: not UTF-8 text"),
        ("\n", r"pairs\.txt: empty file"),
    ],
)
def test_sasrec(tmp_path: Path, content: str | bytes, pattern: str) -> None:
    refused(lambda: load_sasrec(folder(tmp_path, SASREC, **{"pairs.txt": content}) / "pairs.txt"), pattern)


@pytest.mark.parametrize(
    ("name", "content", "pattern"),
    [
        (
            "x.inter",
            "user_id:token\titem_id\n1\t10\n",
            r"x\.inter, line 1: header field 'item_id' is not NAME:TYPE",
        ),
        ("x.inter", "user_id:token\titem_id:str\n1\t2\n", r"header field 'item_id:str' is not NAME:TYPE"),
        (
            "x.inter",
            "user_id:token\tuser_id:float\n1\t10\n",
            r"x\.inter, line 1: field\(s\) 'user_id' repeated",
        ),
        (
            "x.inter",
            "user_id:token\titem_id:token\n1\t10\n1\n",
            r"x\.inter, line 3: expected 2 fields .*found 1",
        ),
        ("x.inter", "user_id:token\titem_id:token\n1\t10\n \t20\n", r"x\.inter, line 3: empty user id"),
        ("x.inter", "user_id:token\titem_id:token\n\n1\t\n", r"x\.inter, line 3: empty item id"),
        (
            "x.inter",
            "user_id:token\titem_id:token\ttimestamp:float\n1\t10\tsoon\n",
            r"x\.inter, line 2: timestamp 'soon' is not an integer",
        ),
        (
            "x.inter",
            "user_id:token\titem_id:token\ttimestamp:float\n1\t2\t1.5\n",
            r"x\.inter, line 2: timestamp '1\.5' is not an integer",
        ),
        ("x.inter", b"user_id:token\titem_id:token\n1\t\xe9\n", r"x\.inter, line 2: not UTF-8 text"),
        ("x.inter", "", r"x\.inter: empty file"),
        ("x.inter", "user_id:token\titem_id:token\n", r"x\.inter: empty file \(no rows\)"),
        (
            "x.item",
            "item_id:token\ttitle:token\n10\tTen\n10\tAgain\n",
            r"x\.item, line 3: item id 10 already on line 2",
        ),
        ("x.item", "item_id:token\ttitle:token\n10\n", r"x\.item, line 2: expected 2 fields .*found 1"),
        ("x.item", "item_id:token\ttitle:token\n\tTen\n", r"x\.item, line 2: empty item id"),
        ("x.item", "id:token\tclass:token\n2\ta\n", r"x\.item, line 1: no field 'item_id' \(the item id"),
    ],
)
def test_recbole(tmp_path: Path, name: str, content: str | bytes, pattern: str) -> None:
    refused(lambda: load_recbole(folder(tmp_path, RECBOLE, **{name: content}) / "x.inter"), pattern)


MAPPING = {"user": "uid", "item": "product_id", "timestamp": "ts"}


@pytest.mark.parametrize(
    ("content", "columns", "unit", "pattern"),
    [
        (
            "uid,sku,ts\nc1,a,1\n",
            {"user": "customer"},
            "iso",
            r"shop\.csv, line 1: no column 'customer' \(data\.columns\.user\); found: uid, sku, ts",
        ),
        # Without a mapping, a missing column says how to name yours.
        (
            "uid,item,timestamp\nc1,a,1\n",
            {},
            "s",
            r"line 1: missing column\(s\) user; .*data\.columns\.user=COLUMN",
        ),
        ("uid,product_id,ts\nc1,a,1\n,b,2\n", MAPPING, "s", r"shop\.csv, line 3: empty user id"),
        (
            "uid,sku,ts\nc1,a,2024-05-01\nc1,,2024-05-02\n",
            SHOP_COLUMNS,
            "iso",
            r"shop\.csv, line 3: empty item id",
        ),
        ("uid,product_id,ts\nc1,a,1\nc1,b,1,2\n", MAPPING, "s", r"shop\.csv, line 3: expected 3 fields"),
        (
            "uid,sku,ts\nc1,a,2024-05-01,x\n",
            SHOP_COLUMNS,
            "iso",
            r"shop\.csv, line 2: expected 3 fields \(uid, sku, ts\)",
        ),
        (
            "uid,product_id,ts\nc1,a,1\nc1,b,x\n",
            MAPPING,
            "s",
            r"shop\.csv, line 3: timestamp 'x' is not an integer",
        ),
        # timestamps the unit does not read
        (
            "user,item,timestamp\nu,a,2024-05-01\n",
            {},
            "s",
            r"line 2: timestamp '2024-05-01' is not an integer .*: give --timestamp-unit iso$",
        ),
        ("user,item,timestamp\nu,a,1.5\n", {}, "ms", r"line 2: timestamp '1\.5' is not an integer"),
        (
            "user,item,timestamp\nu,a,2024-13-01\n",
            {},
            "iso",
            r"line 2: timestamp '2024-13-01' is not an ISO-8601 date and time",
        ),
        (
            "user,item,timestamp\nu,a,1700000000\n",
            {},
            "iso",
            r"line 2: timestamp '1700000000' is not an ISO-8601 date",
        ),
        ("user,item,timestamp\nu,a,\n", {}, "iso", r"line 2: timestamp '' is not an ISO-8601 date"),
        (
            "uid,sku,ts\nc1,a,2024-05-01\nc1,b,May 2\n",
            SHOP_COLUMNS,
            "iso",
            r"line 3: timestamp 'May 2' is not an ISO-8601",
        ),
        (
            "uid,sku,ts\nc1,a,2024-05-01\nc1,b,1714600000\n",
            SHOP_COLUMNS,
            "iso",
            r"line 3: timestamp '1714600000' is not",
        ),
    ],
)
def test_tables_under_their_own_names_and_units(
    tmp_path: Path, content: str, columns: dict[str, str], unit: str, pattern: str
) -> None:
    path = folder(tmp_path, {"shop.csv": content}) / "shop.csv"
    refused(lambda: load_table(path, columns, unit), pattern)


# --- documented skips ---------------------------------------------------------------------------


def test_blank_lines_are_skipped_and_counted_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = {
        "u.data": "1\t10\t4\t881250949\n\n\n1\t20\t5\t881250950\n\n",  # 2 inside, 1 at the end
        "Toy.txt": "1 10 20\n \n2 20\n",
        "log.csv": "user,item,timestamp\n\nu,a,1\n\n\n",
    }
    folder(tmp_path, files)
    with caplog.at_level(logging.INFO, logger="retrieval.data"):
        assert len(load_movielens(tmp_path).events) == 2
        assert len(load_s3rec(tmp_path / "Toy.txt").events) == 3
        assert len(load_table(tmp_path / "log.csv").events) == 1
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.endswith("u.data: skipped 2 blank line(s)") for m in messages), messages
    assert any(m.endswith("Toy.txt: skipped 1 blank line(s)") for m in messages), messages
    assert any(m.endswith("log.csv: skipped 1 blank line(s)") for m in messages), messages


# --- random damage: load or a DataError naming the file, nothing else -----------------------------

VALID = {
    "movielens": ML100K,
    "ml-1m": ML1M,
    "s3rec": S3REC,
    "csv": CSV,
    "sasrec": SASREC,
    "recbole": RECBOLE,
    "shop": SHOP,
}
TARGET = {
    "movielens": "u.data",
    "ml-1m": "ratings.dat",
    "s3rec": "Toy.txt",
    "csv": "log.csv",
    "sasrec": "pairs.txt",
    "recbole": "x.inter",
    "shop": "shop.csv",
}
LOADERS: dict[str, Callable[[Path], Interactions]] = {
    "movielens": load_movielens,
    "ml-1m": load_movielens,
    "s3rec": lambda p: load_s3rec(p / "Toy.txt"),
    "csv": lambda p: load_table(p / "log.csv"),
    "sasrec": lambda p: load_interactions(p / "pairs.txt"),  # detected: pairs, or S3-Rec once damaged
    "recbole": lambda p: load_recbole(p / "x.inter"),
    "shop": lambda p: load_table(p / "shop.csv", SHOP_COLUMNS, "iso"),
}


@st.composite
def damaged_files(draw: st.DrawFn) -> tuple[str, str, bytes]:
    """A valid file of one format, damaged by truncation, byte flips, insertions or deletions."""
    fmt = draw(st.sampled_from(sorted(VALID)))
    name = draw(st.sampled_from([n for n in VALID[fmt] if n != "u.genre"]))
    data = bytearray(encoded(name, VALID[fmt][name]))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(["truncate", "flip", "insert", "delete"]))
        if action == "truncate":
            del data[at:]
        elif action == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif action == "insert":
            data[at:at] = draw(
                st.one_of(
                    st.binary(min_size=1, max_size=4), st.sampled_from([b"\t", b"\n", b"::", b",", b"|"])
                )
            )
        elif action == "delete":
            del data[at : at + draw(st.integers(1, 4))]
    return fmt, name, bytes(data)


@reproducible(max_examples=250)
@given(damaged=damaged_files())
def test_randomly_damaged_files_load_or_name_the_file(
    tmp_path_factory: pytest.TempPathFactory, damaged: tuple[str, str, bytes]
) -> None:
    fmt, name, data = damaged
    path = folder(tmp_path_factory.mktemp(fmt), VALID[fmt], **{name: data})
    try:
        loaded = LOADERS[fmt](path)
    except DataError as e:
        message = str(e)
        assert message.startswith(str(path / name)), message
        line = re.match(r".*?, line (\d+):", message)
        if line:  # the line named exists
            assert 1 <= int(line.group(1)) <= data.count(b"\n") + 1, message
        return
    # Loaded: every event has a user, an item and an int64 timestamp.
    events = loaded.events
    assert len(events) and events["timestamp"].dtype == "int64"
    assert (events["user"].str.len() > 0).all() and (events["item"].str.len() > 0).all()


def test_load_interactions_reports_the_same_errors(tmp_path: Path) -> None:
    path = folder(tmp_path, {"log.csv": "user,item,timestamp\nu,a,x\n"}) / "log.csv"
    refused(lambda: load_interactions(path), r"log\.csv, line 2: timestamp 'x' is not an integer")
    attributes = tmp_path / "a.json"
    attributes.write_text(json.dumps({"10": {"not": "a list"}}))
    refused(lambda: load_s3rec(folder(tmp_path, S3REC) / "Toy.txt", attributes), r"a\.json: item '10'")
