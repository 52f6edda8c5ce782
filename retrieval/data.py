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

import contextlib
import csv
import io
import json
import logging
import math
import re
import shutil
import tempfile
import urllib.request
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from retrieval.artifacts import sha256_file
from retrieval.vocab import ItemVocab

log = logging.getLogger(__name__)

FORMATS = ("movielens", "s3rec", "table")
REQUIRED_COLUMNS = ("user", "item", "timestamp")

# Used when a MovieLens-100K folder has no u.genre; the order of the 19 flags in u.item.
ML100K_GENRES = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
    "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller",
    "War", "Western",
)  # fmt: skip

ML100K_URL = "https://files.grouplens.org/datasets/movielens/ml-100k.zip"
ML100K_SHA256 = {
    "u.item": "553841ebc7de3a0fd0d6b62a204ea30c1e651aacfb2814c7a6584ac52f2c5701",
    "u.user": "f120e114da2e8cf314fd28f99417c94ae9ddf1cb6db8ce0e4b5995d40e90e62c",
}
ML100K_EVENTS = 100_000

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")
"""An integer field: ASCII digits with an optional sign (no ``_`` separators, no other scripts' digits)."""
_BLANK_LINE = re.compile(r"^[^\S\n]*$", re.MULTILINE)


class DataError(ValueError):
    """Input data that cannot be read: the message names the file, the line and the problem."""


@dataclass(frozen=True)
class Interactions:
    """Interactions in one common form, whatever file format they came from.

    Attributes:
        events: one row per interaction, in file order: ``user`` (str), ``item`` (str),
            ``timestamp`` (int64; the 0-based position in the user's line for order-only
            formats) and any side columns (e.g. ``rating``).
        items: one row per known item: ``item`` (str), optionally ``title`` (str) and
            ``attributes`` (list of str, e.g. genres or categories; ``None`` when unknown).
        source: the path the data was read from.
        has_time: False when ``timestamp`` is only the order of events (S3-Rec files), so
            no time features can be derived from it.
    """

    events: pd.DataFrame
    items: pd.DataFrame
    source: str
    has_time: bool = True


@dataclass(frozen=True)
class SequenceData:
    """Per-user chronological sequences of dense item ids.

    Attributes:
        vocab: external item ids -> dense ``1..n`` (0 is padding), with titles when known.
        users: external user ids, in order of first appearance in the events.
        sequences: per user, int64 ``[len]`` dense item ids, oldest first.
        item_attributes: dense item id -> attributes, for items whose attributes are known;
            ``None`` when the data has no attributes.
        event_columns: ``timestamp`` and every side column of the events (e.g. ``rating``),
            per user, aligned with :attr:`sequences`.
        has_time: whether ``timestamp`` is real time (see :class:`Interactions`).
    """

    vocab: ItemVocab
    users: tuple[str, ...]
    sequences: tuple[np.ndarray, ...]
    item_attributes: dict[int, tuple[str, ...]] | None
    event_columns: dict[str, tuple[np.ndarray, ...]] = field(default_factory=dict)
    has_time: bool = True


@dataclass(frozen=True)
class LeaveOneOut:
    """Leave-one-out split: last item for test, second-to-last for validation.

    Users with fewer than 3 items train on their whole sequence and have no valid/test example.
    A refitted split (``leave_one_out(..., refit=True)``) trains on ``sequence[:-1]`` and has no
    validation users.

    Attributes:
        train: per user, ``sequence[:-2]`` (the whole sequence for users with < 3 items).
        valid_histories: ``sequence[:-2]`` per validation user.
        valid_targets: int64 ``[num_valid]``, ``sequence[-2]``.
        valid_users: int64 ``[num_valid]`` positions in :attr:`SequenceData.users`.
        test_histories: ``sequence[:-1]`` per test user.
        test_targets: int64 ``[num_test]``, ``sequence[-1]``.
        test_users: int64 ``[num_test]`` positions in :attr:`SequenceData.users`.
    """

    train: tuple[np.ndarray, ...]
    valid_histories: tuple[np.ndarray, ...]
    valid_targets: np.ndarray
    valid_users: np.ndarray
    test_histories: tuple[np.ndarray, ...]
    test_targets: np.ndarray
    test_users: np.ndarray


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


def load_movielens(path: Path | str) -> Interactions:
    """Loads a MovieLens-100K or -1M folder (or its ``u.data`` / ``ratings.dat`` file).

    Events keep the ``rating`` (int64) as a side column. Items come from ``u.item`` /
    ``movies.dat`` (Latin-1) with ``title`` and genre ``attributes`` when the file is there,
    else they are the items seen in the events.

    Raises:
        DataError: no ratings file, or a malformed line.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    folder = path.parent if path.is_file() else path
    if (folder / "u.data").is_file():
        events = _read_int_records(folder / "u.data", None, ("user", "item", "rating", "timestamp"))
        items = _read_ml100k_items(folder) if (folder / "u.item").is_file() else None
    elif (folder / "ratings.dat").is_file():
        events = _read_int_records(folder / "ratings.dat", "::", ("user", "item", "rating", "timestamp"))
        items = _read_ml1m_items(folder / "movies.dat") if (folder / "movies.dat").is_file() else None
    else:
        raise DataError(f"{path}: no u.data or ratings.dat (expected a MovieLens-100K or -1M folder)")
    frame = pd.DataFrame(
        {
            "user": events["user"].astype(str),
            "item": events["item"].astype(str),
            "timestamp": events["timestamp"],
            "rating": events["rating"],
        }
    )
    if items is None:
        items = pd.DataFrame({"item": frame["item"].unique()})
    return Interactions(frame, items, str(path))


def load_s3rec(path: Path | str, attributes: Path | str | None = None) -> Interactions:
    """Loads the S3-Rec/SASRec format: one ``user item item ...`` line per user, oldest item first.

    ``timestamp`` is the 0-based position of the item in its user's line. Attributes are read
    from ``attributes`` or, when ``None``, from ``<stem>_item2attributes.json`` beside the file
    if it exists (``{"<item_id>": [attr_id, ...]}``).

    Raises:
        DataError: a malformed line, a user on two lines, or a malformed attributes file.
    """
    path = Path(path)
    text = _read_text(path, "utf-8-sig")
    rows = [(lineno, line.split()) for lineno, line in _lines(text)]
    _log_blank_lines(path, text)
    if not rows:
        raise DataError(f"{path}: empty file")
    first_line: dict[str, int] = {}
    for lineno, fields in rows:
        if len(fields) < 2:
            raise DataError(f"{path}, line {lineno}: expected 'user item [item ...]', found one field")
        if fields[0] in first_line:
            raise DataError(
                f"{path}, line {lineno}: user {fields[0]} already has a line (line {first_line[fields[0]]})"
            )
        first_line[fields[0]] = lineno
    users = [fields[0] for _, fields in rows]
    items = [item for _, fields in rows for item in fields[1:]]
    lengths = np.array([len(fields) - 1 for _, fields in rows])
    lines = np.array([lineno for lineno, _ in rows])
    _check_ids(path, "user id", users, lines)
    _check_ids(path, "item id", items, np.repeat(lines, lengths))
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    events = pd.DataFrame(
        {"user": np.repeat(users, lengths), "item": items, "timestamp": np.arange(len(items)) - starts}
    )
    seen = list(dict.fromkeys(items))
    if attributes is None and (path.parent / f"{path.stem}_item2attributes.json").is_file():
        attributes = path.parent / f"{path.stem}_item2attributes.json"
    if attributes is None:
        return Interactions(events, pd.DataFrame({"item": seen}), str(path), has_time=False)
    item_attributes = _read_item_attributes(Path(attributes))
    known = list(dict.fromkeys([*seen, *item_attributes]))
    frame = pd.DataFrame({"item": known, "attributes": [item_attributes.get(i) for i in known]})
    return Interactions(events, frame, str(path), has_time=False)


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


def build_sequences(data: Interactions) -> SequenceData:
    """Groups the events into per-user chronological sequences of dense item ids.

    Events are sorted by timestamp with a stable sort, so ties keep their file order. The
    vocabulary lists items in order of first appearance in the sorted events; items that are
    in ``data.items`` but have no events are left out.
    """
    events = data.events
    order = np.argsort(events["timestamp"].to_numpy(), kind="stable")
    codes, ids = pd.factorize(events["item"].to_numpy()[order])  # ids in order of first appearance
    dense = codes.astype(np.int64) + 1
    titles = None
    if "title" in data.items.columns:
        titles = {
            i: t
            for i, t in zip(data.items["item"].tolist(), data.items["title"].tolist(), strict=True)
            if isinstance(t, str)
        }
    vocab = ItemVocab.from_ids(ids, titles)
    user_codes, users = pd.factorize(events["user"])  # users in file order
    user_codes = user_codes[order]
    by_user = np.argsort(user_codes, kind="stable")
    ends = np.cumsum(np.bincount(user_codes, minlength=len(users))).tolist()
    spans = list(zip([0, *ends[:-1]], ends, strict=True))

    def per_user_sorted(values: np.ndarray) -> tuple[np.ndarray, ...]:
        """Values already in chronological order -> per-user slices of one grouped array."""
        grouped = values[by_user]
        return tuple(grouped[start:end] for start, end in spans)

    sequences = per_user_sorted(dense)
    columns = [c for c in events.columns if c not in ("user", "item")]
    event_columns = {c: per_user_sorted(events[c].to_numpy()[order]) for c in columns}
    item_attributes = None
    if "attributes" in data.items.columns:
        index = vocab.lookup(data.items["item"].astype(str).tolist())
        item_attributes = {
            int(i): tuple(a)
            for i, a in zip(index, data.items["attributes"], strict=True)
            if i != 0 and a is not None
        }
    return SequenceData(
        vocab, tuple(map(str, users.tolist())), sequences, item_attributes, event_columns, data.has_time
    )


def leave_one_out(data: SequenceData, refit: bool = False) -> LeaveOneOut:
    """Splits each sequence: last item for test, second-to-last for validation, the rest for training.

    With ``refit`` the validation event trains too (``sequence[:-1]``) and there are no
    validation users: the model for the test is fitted on every event before it, for a number
    of epochs chosen beforehand by a run without ``refit`` (nothing is left to validate on).
    """
    evaluated = [u for u, s in enumerate(data.sequences) if len(s) >= 3]
    held_out = [data.sequences[u] for u in evaluated]
    keep = 1 if refit else 2
    validated = [] if refit else held_out
    return LeaveOneOut(
        train=tuple(s if len(s) < 3 else s[:-keep] for s in data.sequences),
        valid_histories=tuple(s[:-2] for s in validated),
        valid_targets=np.array([s[-2] for s in validated], np.int64),
        valid_users=np.array([] if refit else evaluated, np.int64),
        test_histories=tuple(s[:-1] for s in held_out),
        test_targets=np.array([s[-1] for s in held_out], np.int64),
        test_users=np.array(evaluated, np.int64),
    )


def default_data_path() -> Path | None:
    """``<repo root>/../shared/data/ml-100k`` when that folder exists, else ``None``."""
    path = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "ml-100k"
    return path if path.is_dir() else None


def download_movielens_100k(dest: Path) -> Path:
    """Downloads and extracts MovieLens-100K into ``dest``, verified against the official release.

    The archive is extracted beside ``dest/ml-100k`` and renamed into place only once it
    verifies, so a failed or corrupted download never leaves a folder that looks complete.

    Returns:
        The ``dest/ml-100k`` folder (an existing one is verified and reused without downloading).

    Raises:
        DataError: the files do not match the official release.
    """
    folder = Path(dest) / "ml-100k"
    if (folder / "u.data").is_file():
        verify_movielens_100k(folder)
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        archive = Path(tmp) / "ml-100k.zip"
        with urllib.request.urlopen(ML100K_URL, timeout=60) as response, open(archive, "wb") as f:
            shutil.copyfileobj(response, f)
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(tmp)
        verify_movielens_100k(Path(tmp) / "ml-100k")
        (Path(tmp) / "ml-100k").rename(folder)
    return folder


def verify_movielens_100k(folder: Path) -> None:
    """Checks that ``folder`` holds the official MovieLens-100K files.

    Raises:
        DataError: a file is missing, has the wrong SHA-256, or ``u.data`` lacks 100,000 lines.
    """
    folder = Path(folder)
    for name, expected in ML100K_SHA256.items():
        if not (folder / name).is_file():
            raise DataError(f"{folder / name}: missing from the MovieLens-100K folder")
        actual = sha256_file(folder / name)
        if actual != expected:
            raise DataError(f"{folder / name}: SHA-256 {actual} differs from the official {expected}")
    if not (folder / "u.data").is_file():
        raise DataError(f"{folder / 'u.data'}: missing from the MovieLens-100K folder")
    with open(folder / "u.data", "rb") as f:
        lines = sum(1 for _ in f)
    if lines != ML100K_EVENTS:
        raise DataError(f"{folder / 'u.data'}: {lines} lines, the official file has {ML100K_EVENTS}")


def _read_text(path: Path, encoding: str) -> str:
    """The whole file as text; undecodable bytes are reported with their line."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}") from None
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(
            f"{path}, line {line}: not {encoding.removesuffix('-sig').upper()} text "
            f"(byte {raw[e.start]:#04x} at offset {e.start})"
        ) from None


def _lines(text: str) -> list[tuple[int, str]]:
    """Non-blank lines with their 1-based numbers (split on ``\\n`` only, unlike ``splitlines``)."""
    return [(n, line.rstrip("\r")) for n, line in enumerate(text.split("\n"), 1) if line.strip()]


def _log_blank_lines(path: Path, text: str) -> None:
    """Logs how many blank lines were skipped before the last non-blank one (trailing ones are
    the usual end of a file and not counted)."""
    body = text.rstrip()
    skipped = len(_BLANK_LINE.findall(body)) if body else 0
    if skipped:
        log.info("%s: skipped %d blank line(s)", path, skipped)


def _field_count_error(path: Path, lineno: int, names: Sequence[str], found: int) -> DataError:
    return DataError(
        f"{path}, line {lineno}: expected {len(names)} fields ({', '.join(names)}), found {found}"
    )


def _parse_int(path: Path, lineno: int, name: str, value: str) -> int:
    """A 64-bit integer field (ASCII digits, optional sign), or a DataError naming the line."""
    number = int(value) if _INTEGER.fullmatch(value) else None
    if number is None or not INT64_MIN <= number <= INT64_MAX:
        raise DataError(f"{path}, line {lineno}: {name} {value!r} is not an integer")
    return number


def _text_to_int(value: Any) -> int | None:
    """An int64 written as an integer (``-12``) or a whole number (``1e3``, ``5.0``); else ``None``.

    Numbers written with a decimal point or exponent are exact only below 2^53, so larger ones
    are refused rather than rounded.
    """
    text = str(value).strip()
    if _INTEGER.fullmatch(text):
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


def _check_ids(path: Path, name: str, ids: list[str], lines: np.ndarray) -> None:
    """Numeric ids must be ASCII digits; ``lines[i]`` is the line of ``ids[i]``."""
    joined = "".join(ids)  # one C-level check for the whole file; the loop only locates a failure
    if not (joined.isascii() and joined.isdigit()):
        row = next(i for i, v in enumerate(ids) if not (v.isascii() and v.isdigit()))
        raise DataError(f"{path}, line {lines[row]}: {name} {ids[row]!r} is not a number")


def _read_int_records(path: Path, sep: str | None, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Lines of ``len(names)`` integer fields split on ``sep`` (whitespace when ``None``) -> int64 columns.

    pandas' C parser reads well-formed files fast; when it fails, or the file holds anything but
    digits, signs, separators and line breaks, or a line has another field count, the file is
    parsed line by line, which either reads it or names the line at fault.
    """
    text = _read_text(path, "latin-1")
    _log_blank_lines(path, text)
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
    for lineno, line in _lines(text):
        fields = line.strip().split(sep)
        if len(fields) != len(names):
            raise _field_count_error(path, lineno, names, len(fields))
        rows.append([_parse_int(path, lineno, n, v) for n, v in zip(names, fields, strict=True)])
    if not rows:
        raise DataError(f"{path}: empty file")
    columns = np.array(rows, np.int64).reshape(len(rows), len(names))
    return {name: columns[:, j] for j, name in enumerate(names)}


def _read_ml100k_items(folder: Path) -> pd.DataFrame:
    genres: tuple[str, ...] = ML100K_GENRES
    if (folder / "u.genre").is_file():
        path = folder / "u.genre"
        named: dict[int, str] = {}
        genre_lines: dict[int, int] = {}
        for lineno, line in _read_lines(path, "latin-1"):
            fields = line.split("|")
            if len(fields) != 2:
                raise DataError(f"{path}, line {lineno}: expected 'name|index', found {len(fields)} fields")
            index = _parse_int(path, lineno, "genre index", fields[1])
            if index in named:
                raise DataError(
                    f"{path}, line {lineno}: genre index {index} already used on line {genre_lines[index]}"
                )
            named[index], genre_lines[index] = fields[0], lineno
        if sorted(named) != list(range(len(named))):
            raise DataError(f"{path}: genre indices must run 0..{len(named) - 1}")
        genres = tuple(named[i] for i in range(len(named)))
    path = folder / "u.item"
    ids, titles, attributes = [], [], []
    first_line: dict[str, int] = {}
    for lineno, line in _read_lines(path, "latin-1"):
        fields = line.split("|")
        if len(fields) != 5 + len(genres):
            raise DataError(
                f"{path}, line {lineno}: expected {5 + len(genres)} fields "
                f"(id|title|release|video release|url|{len(genres)} genre flags), found {len(fields)}"
            )
        flags = fields[5:]
        if any(f not in ("0", "1") for f in flags):
            raise DataError(f"{path}, line {lineno}: genre flags must be 0 or 1")
        ids.append(_movie_id(path, lineno, fields[0], first_line))
        titles.append(fields[1])
        attributes.append([g for g, f in zip(genres, flags, strict=True) if f == "1"])
    return pd.DataFrame({"item": ids, "title": titles, "attributes": attributes})


def _read_ml1m_items(path: Path) -> pd.DataFrame:
    ids, titles, attributes = [], [], []
    first_line: dict[str, int] = {}
    for lineno, line in _read_lines(path, "latin-1"):
        fields = line.split("::")
        if len(fields) != 3:
            raise DataError(
                f"{path}, line {lineno}: expected 3 fields (id::title::genres), found {len(fields)}"
            )
        ids.append(_movie_id(path, lineno, fields[0], first_line))
        titles.append(fields[1])
        attributes.append(fields[2].split("|") if fields[2] else [])
    return pd.DataFrame({"item": ids, "title": titles, "attributes": attributes})


def _read_lines(path: Path, encoding: str) -> list[tuple[int, str]]:
    """:func:`_lines` of a file that must have at least one (else an "empty file" error)."""
    text = _read_text(path, encoding)
    lines = _lines(text)
    if not lines:
        raise DataError(f"{path}: empty file")
    _log_blank_lines(path, text)
    return lines


def _movie_id(path: Path, lineno: int, value: str, first_line: dict[str, int]) -> str:
    """A movie id field, refused when an earlier line (recorded in ``first_line``) has it."""
    item = str(_parse_int(path, lineno, "movie id", value))
    if item in first_line:
        raise DataError(f"{path}, line {lineno}: movie id {item} already on line {first_line[item]}")
    first_line[item] = lineno
    return item


def _read_item_attributes(path: Path) -> dict[str, list[str]]:
    """``{"<item_id>": [attr_id, ...]}`` -> item id -> attribute ids as strings."""
    try:
        payload: Any = json.loads(_read_text(path, "utf-8-sig"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}, line {e.lineno}: invalid JSON: {e.msg}") from None
    except RecursionError:
        raise DataError(f"{path}: JSON nested too deeply to be an attributes file") from None
    if not isinstance(payload, dict):
        raise DataError(f'{path}: expected a JSON object {{"<item_id>": [attribute ids]}}')
    attributes = {}
    for item, values in payload.items():
        if not isinstance(values, list) or not all(
            isinstance(v, str | int) and not isinstance(v, bool) for v in values
        ):
            raise DataError(f"{path}: item {item!r}: attributes must be a list of ids")
        attributes[str(item)] = [str(v) for v in values]
    return attributes


def _read_csv(path: Path) -> tuple[pd.DataFrame, list[int], int]:
    """A CSV with a header -> string columns, the 1-based line where each row starts, and the
    header's line (blank lines before it are skipped)."""
    reader = csv.reader(io.StringIO(_read_text(path, "utf-8-sig"), newline=""))
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
                raise _field_count_error(path, start, header, len(row))
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
