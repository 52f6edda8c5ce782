"""Markdown tables for the benchmarks' reports."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The lines of a Markdown table: ``header``, its rule, then a line per row of cells.

    Example:
        >>> table(["metric", "value"], [["recall@50", "0.31"]])
        ['| metric | value |', '|---|---|', '| recall@50 | 0.31 |']
    """
    return [_line(header), "|" + "---|" * len(header), *map(_line, rows)]


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
