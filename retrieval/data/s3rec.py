"""Sequence files (``.txt``): S3-Rec's ``user item item ...`` lines and SASRec's ``user item`` pairs,
with ``<stem>_item2attributes.json`` beside them for item attributes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from retrieval.data.errors import DataError
from retrieval.data.interactions import Interactions
from retrieval.data.parsing import check_ids, log_blank_lines, numbered_lines, read_text


def load_s3rec(path: Path | str, attributes: Path | str | None = None) -> Interactions:
    """Loads the S3-Rec format: one ``user item item ...`` line per user, oldest item first.

    ``timestamp`` is the 0-based position of the item in its user's line. Attributes are read
    from ``attributes`` or, when ``None``, from ``<stem>_item2attributes.json`` beside the file
    if it exists (``{"<item_id>": [attr_id, ...]}``).

    Raises:
        DataError: a malformed line, a user on two lines, or a malformed attributes file.
    """
    path = Path(path)
    return _s3rec(path, _read_rows(path), attributes)


def load_sasrec(path: Path | str, attributes: Path | str | None = None) -> Interactions:
    """Loads SASRec's own format (its reference repository's ``data/*.txt``): one ``user item``
    pair per line, a user's lines in time order (users on many lines, not necessarily together).

    ``timestamp`` is the 0-based position of the item among its user's lines; attributes as in
    :func:`load_s3rec`.

    Raises:
        DataError: a line without exactly two fields, a non-numeric id, or a malformed
            attributes file.
    """
    path = Path(path)
    return _sasrec(path, _read_rows(path), attributes)


def load_sequence_file(path: Path | str, attributes: Path | str | None = None) -> Interactions:
    """Loads a ``.txt`` sequence file in either format, told apart by its content: SASRec's
    pairs (:func:`load_sasrec`) when every line holds two fields and some user is on several
    lines, else S3-Rec's lines (:func:`load_s3rec`).

    A file where every line holds two fields and no user repeats is both: one event per user,
    the same interactions either way.

    Raises:
        DataError: as the format's loader; a file whose users repeat on lines mostly of two
            fields is taken for SASRec's and its first line of another length is named.
    """
    path = Path(path)
    rows = _read_rows(path)
    pairs = sum(len(fields) == 2 for _, fields in rows)
    repeats = len({fields[0] for _, fields in rows}) < len(rows)
    if repeats and 2 * pairs > len(rows):
        return _sasrec(path, rows, attributes)
    return _s3rec(path, rows, attributes)


def _read_rows(path: Path) -> list[tuple[int, list[str]]]:
    """The non-blank lines of a sequence file, split on whitespace, with their line numbers."""
    text = read_text(path, "utf-8-sig")
    rows = [(lineno, line.split()) for lineno, line in numbered_lines(text)]
    log_blank_lines(path, text)
    if not rows:
        raise DataError(f"{path}: empty file")
    return rows


def _s3rec(path: Path, rows: list[tuple[int, list[str]]], attributes: Path | str | None) -> Interactions:
    first_line: dict[str, int] = {}
    for lineno, fields in rows:
        if len(fields) < 2:
            raise DataError(f"{path}, line {lineno}: expected 'user item [item ...]', found one field")
        if fields[0] in first_line:
            hint = ""
            if all(len(f) == 2 for _, f in rows):
                hint = "; 'user item' pairs with users on many lines are SASRec's format (format sasrec)"
            raise DataError(
                f"{path}, line {lineno}: user {fields[0]} already has a line (line {first_line[fields[0]]})"
                + hint
            )
        first_line[fields[0]] = lineno
    users = [fields[0] for _, fields in rows]
    items = [item for _, fields in rows for item in fields[1:]]
    lengths = np.array([len(fields) - 1 for _, fields in rows])
    lines = np.array([lineno for lineno, _ in rows])
    check_ids(path, "user id", users, lines)
    check_ids(path, "item id", items, np.repeat(lines, lengths))
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    events = pd.DataFrame(
        {"user": np.repeat(users, lengths), "item": items, "timestamp": np.arange(len(items)) - starts}
    )
    return _with_attributes(path, events, attributes)


def _sasrec(path: Path, rows: list[tuple[int, list[str]]], attributes: Path | str | None) -> Interactions:
    for lineno, fields in rows:
        if len(fields) != 2:
            raise DataError(
                f"{path}, line {lineno}: expected 2 fields (user item) as in SASRec's format, "
                f"found {len(fields)}"
            )
    users = [fields[0] for _, fields in rows]
    items = [fields[1] for _, fields in rows]
    lines = np.array([lineno for lineno, _ in rows])
    check_ids(path, "user id", users, lines)
    check_ids(path, "item id", items, lines)
    events = pd.DataFrame({"user": users, "item": items})
    events["timestamp"] = events.groupby("user", sort=False).cumcount().astype(np.int64)
    return _with_attributes(path, events, attributes)


def _with_attributes(path: Path, events: pd.DataFrame, attributes: Path | str | None) -> Interactions:
    """Order-only events with the items' attributes: ``attributes``, else the
    ``<stem>_item2attributes.json`` beside ``path`` when there is one."""
    seen = list(dict.fromkeys(events["item"].tolist()))
    if attributes is None and (path.parent / f"{path.stem}_item2attributes.json").is_file():
        attributes = path.parent / f"{path.stem}_item2attributes.json"
    if attributes is None:
        return Interactions(events, pd.DataFrame({"item": seen}), str(path), has_time=False)
    item_attributes = _read_item_attributes(Path(attributes))
    known = list(dict.fromkeys([*seen, *item_attributes]))
    frame = pd.DataFrame({"item": known, "attributes": [item_attributes.get(i) for i in known]})
    return Interactions(events, frame, str(path), has_time=False)


def _read_item_attributes(path: Path) -> dict[str, list[str]]:
    """``{"<item_id>": [attr_id, ...]}`` -> item id -> attribute ids as strings."""
    try:
        payload: Any = json.loads(read_text(path, "utf-8-sig"))
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
