"""RecBole's atomic files: ``<name>.inter`` (the interactions) and ``<name>.item`` beside it (the
items' attributes), as RecBole reads them from ``<data_path>/<name>/``.

Each file is tab-separated, unquoted, with a header of ``field:type`` names, the type being
``token``, ``token_seq`` (space-separated tokens), ``float`` or ``float_seq``::

    user_id:token   item_id:token   rating:float    timestamp:float
    196             242             3               881250949
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from retrieval.data.columns import check_columns
from retrieval.data.errors import DataError
from retrieval.data.interactions import Interactions
from retrieval.data.parsing import field_count_error, read_lines
from retrieval.data.tables import table_interactions

FIELD_TYPES = ("token", "token_seq", "float", "float_seq")
"""RecBole's field types, the part of a header name after its ``:``."""

RECBOLE_COLUMNS = {"user": "user_id", "item": "item_id", "timestamp": "timestamp"}
"""RecBole's default field names (``USER_ID_FIELD``, ``ITEM_ID_FIELD``, ``TIME_FIELD``); a
column mapping names others."""

TITLE_FIELDS = ("title", "movie_title")
"""``.item`` fields read as the title when the mapping names none (RecBole's Amazon and MovieLens files)."""


def load_recbole(
    path: Path | str,
    columns: Mapping[str, str] | None = None,
    timestamp_unit: str = "s",
    items: Path | str | None = None,
) -> Interactions:
    """Loads a RecBole ``.inter`` file (or a RecBole dataset folder ``<name>/`` holding
    ``<name>.inter``) and the ``.item`` file beside it when there is one.

    The fields are named without their type: ``user_id``, ``item_id`` and ``timestamp`` are the
    user, the item and the time unless ``columns`` (our name -> field name) names others; the
    other ``.inter`` fields are side columns (``rating`` is the action feature), read as a CSV
    table's are (:func:`~retrieval.data.tables.table_interactions`). Without a timestamp field
    the events are in file order (no time features), as RecBole orders them.

    From the ``.item`` file (``items``, else ``<name>.item`` beside the ``.inter``): the title
    (the field ``columns["title"]``, else ``title`` or ``movie_title``) and the attributes: the
    values of every other ``token`` and ``token_seq`` field, in field order (``float`` fields
    are left out).

    Raises:
        DataError: a missing file, a header field that is not ``name:type``, a line with another
            field count, a missing or empty id, a timestamp the unit does not read, or an item
            listed twice in the ``.item`` file; each naming the file and line.
    """
    path = Path(path)
    if path.is_dir():
        path = path / f"{path.name}.inter"
    try:
        mapping = {**RECBOLE_COLUMNS, **check_columns(columns)}
    except ValueError as e:
        raise DataError(f"{path}: {e}") from None
    names, _, frame, lines, header = _read_atomic(path)
    item_path = Path(items) if items is not None else path.with_suffix(".item")
    item_names = _read_header(item_path)[0] if item_path.is_file() else []
    _check_fields(f"{path}, line {header}", mapping, names, item_names)
    data = table_interactions(
        frame,
        str(path),
        f"{path}, line {header}",
        lambda row: f"{path}, line {lines[row]}",
        True,
        _inter_mapping(mapping, names, explicit_time="timestamp" in (columns or {})),
        timestamp_unit,
        need_time=False,
    )
    if not item_path.is_file():
        if items is not None:
            raise DataError(f"{item_path}: no such file")
        return data
    return _with_items(data, _read_items(item_path, mapping["item"], mapping.get("title")))


def _check_fields(where: str, mapping: Mapping[str, str], names: list[str], item_names: list[str]) -> None:
    """Refuses a column mapping naming a field that neither the ``.inter`` (``names``) nor the
    ``.item`` file has (RecBole's default names aside); ``where`` names the header."""
    unknown = [
        f"{theirs!r} (data.columns.{ours})"
        for ours, theirs in mapping.items()
        if ours not in RECBOLE_COLUMNS and theirs not in names and theirs not in item_names
    ]
    if unknown:
        raise DataError(f"{where}: no field {', '.join(unknown)}; found: {', '.join(names)}")


def _inter_mapping(mapping: Mapping[str, str], names: list[str], explicit_time: bool) -> dict[str, str]:
    """The part of ``mapping`` the ``.inter`` file is read with: its fields, the user and the
    item, and the timestamp when it has one or the mapping names it (``explicit_time``)."""
    return {
        ours: theirs
        for ours, theirs in mapping.items()
        if theirs in names or ours in ("user", "item") or (ours == "timestamp" and explicit_time)
    }


def _with_items(data: Interactions, table: pd.DataFrame) -> Interactions:
    """``data`` with the ``.item`` file's items (``table``): every item of either, its attributes
    and its title (the ``.inter``'s when both have one)."""
    ids = list(dict.fromkeys([*data.items["item"].tolist(), *table["item"].tolist()]))
    attributes = dict(zip(table["item"], table["attributes"], strict=True))
    known = pd.DataFrame({"item": ids, "attributes": [attributes.get(i) for i in ids]})
    titles: dict[str, str] = {}
    for part in (data.items, table):  # a title in both files: the .inter's wins
        if "title" in part.columns:
            pairs = zip(part["item"], part["title"], strict=True)
            titles = {**{i: t for i, t in pairs if isinstance(t, str)}, **titles}
    if titles:
        known.insert(1, "title", [titles.get(i) for i in ids])
    return Interactions(data.events, known, data.source, data.has_time)


def _read_header(path: Path) -> tuple[list[str], list[str], list[tuple[int, str]]]:
    """The field names and types of an atomic file, and all its non-blank lines."""
    lines = read_lines(path, "utf-8-sig")
    lineno, header = lines[0]
    names, types = [], []
    for field in header.split("\t"):
        name, sep, kind = field.strip().rpartition(":")
        if not sep or not name or kind not in FIELD_TYPES:
            raise DataError(
                f"{path}, line {lineno}: header field {field.strip()!r} is not NAME:TYPE "
                f"(TYPE one of {', '.join(FIELD_TYPES)})"
            )
        names.append(name)
        types.append(kind)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise DataError(f"{path}, line {lineno}: field(s) {', '.join(map(repr, repeated))} repeated")
    return names, types, lines


def _read_atomic(path: Path) -> tuple[list[str], list[str], pd.DataFrame, list[int], int]:
    """An atomic file -> field names, their types, a frame of its values as text, the line of
    each row and the header's line."""
    names, types, lines = _read_header(path)
    rows, numbers = [], []
    for lineno, line in lines[1:]:
        fields = line.split("\t")
        if len(fields) != len(names):
            raise field_count_error(path, lineno, names, len(fields))
        rows.append(fields)
        numbers.append(lineno)
    if not rows:
        raise DataError(f"{path}: empty file (no rows)")
    return names, types, pd.DataFrame(rows, columns=names, dtype=object), numbers, lines[0][0]


def _read_items(path: Path, id_field: str, title_field: str | None) -> pd.DataFrame:
    """A ``.item`` file -> one row per item: ``item``, ``title`` (when there is one) and ``attributes``."""
    names, types, frame, lines, header = _read_atomic(path)
    if id_field not in names:
        raise DataError(
            f"{path}, line {header}: no field {id_field!r} (the item id, data.columns.item); "
            f"found: {', '.join(names)}"
        )
    if title_field is None:
        title_field = next((f for f in TITLE_FIELDS if f in names), None)
    ids = frame[id_field].str.strip()
    empty = (ids == "").to_numpy()
    if empty.any():
        raise DataError(f"{path}, line {lines[int(np.argmax(empty))]}: empty item id")
    repeated = ids.duplicated().to_numpy()
    if repeated.any():
        row = int(np.argmax(repeated))
        first = lines[int(np.argmax((ids == ids.iloc[row]).to_numpy()))]
        raise DataError(f"{path}, line {lines[row]}: item id {ids.iloc[row]} already on line {first}")
    fields = [
        (name, kind)
        for name, kind in zip(names, types, strict=True)
        if kind in ("token", "token_seq") and name not in (id_field, title_field)
    ]
    attributes = [
        list(
            dict.fromkeys(
                value
                for name, kind in fields
                for value in (row[name].split(" ") if kind == "token_seq" else [row[name]])
                if value.strip()
            )
        )
        for row in frame[[name for name, _ in fields]].to_dict("records")
    ]
    table = pd.DataFrame({"item": ids.tolist(), "attributes": attributes})
    if title_field is not None and title_field in names:
        titles = frame[title_field].str.strip()
        table.insert(1, "title", titles.where(titles != "").tolist())
    return table
