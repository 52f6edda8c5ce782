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


def mean_cell(mean: float | None, std: float | None, digits: int = 4) -> str:
    """A table cell for a mean over seeds: ``mean ± std``, the mean alone without ``std``, and
    ``–`` without a mean.

    Example:
        >>> mean_cell(0.31234, 0.0041), mean_cell(0.31234, None), mean_cell(12.0, 1.5, 0)
        ('0.3123 ± 0.0041', '0.3123', '12 ± 2')
    """
    if mean is None:
        return "–"
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
