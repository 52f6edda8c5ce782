"""S3-Rec/SASRec sequence files: ``user item item ...`` per line, with ``<stem>_item2attributes.json``."""

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
    """Loads the S3-Rec/SASRec format: one ``user item item ...`` line per user, oldest item first.

    ``timestamp`` is the 0-based position of the item in its user's line. Attributes are read
    from ``attributes`` or, when ``None``, from ``<stem>_item2attributes.json`` beside the file
    if it exists (``{"<item_id>": [attr_id, ...]}``).

    Raises:
        DataError: a malformed line, a user on two lines, or a malformed attributes file.
    """
    path = Path(path)
    text = read_text(path, "utf-8-sig")
    rows = [(lineno, line.split()) for lineno, line in numbered_lines(text)]
    log_blank_lines(path, text)
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
    check_ids(path, "user id", users, lines)
    check_ids(path, "item id", items, np.repeat(lines, lengths))
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
