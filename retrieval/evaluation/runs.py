"""Runs side by side: the metrics files of several runs read into rows and rendered as a table."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.json"
_METRIC_KEY = re.compile(r"^([a-z_]+)@(\d+)$")


def load_run_rows(path: str | Path) -> list[dict[str, Any]]:
    """The comparison rows of one run: a folder holding ``metrics.json``, or a metrics JSON file.

    Reads both what ``tools/evaluate.py --out`` writes (one row) and a model artifact's
    training metrics (its ``test`` metrics, plus a row for its popularity baseline).

    Returns:
        rows ``{"run": str(path), "protocol", "split", "<metric>@<K>": value, ...}``.

    Raises:
        ValueError: the file is missing, not JSON, or holds neither kind of metrics.
    """
    path = Path(path)
    file = path / METRICS_FILE if path.is_dir() else path
    try:
        payload = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{file}: cannot read run metrics: {e}") from None

    def metrics_of(values: Mapping[str, Any]) -> dict[str, float]:
        return {
            k: float(v)
            for k, v in values.items()
            if _METRIC_KEY.match(k) and isinstance(v, int | float) and not isinstance(v, bool)
        }

    name = str(path)
    if isinstance(payload, dict) and "protocol" in payload and "split" in payload:  # tools/evaluate.py
        return [
            {"run": name, "protocol": payload["protocol"], "split": payload["split"], **metrics_of(payload)}
        ]
    if isinstance(payload, dict) and isinstance(payload.get("test"), dict):  # tools/train.py
        protocol = str(payload.get("protocol", "loo"))
        rows = [{"run": name, "protocol": protocol, "split": "test", **metrics_of(payload["test"])}]
        if isinstance(payload.get("baseline_popularity_test"), dict):
            baseline = metrics_of(payload["baseline_popularity_test"])
            rows.append({"run": f"{name} (most popular)", "protocol": protocol, "split": "test", **baseline})
        return rows
    raise ValueError(f"{file}: holds neither tools/evaluate.py nor tools/train.py metrics")


def markdown_table(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str] | None = None) -> str:
    """A Markdown table of runs (rows of :func:`load_run_rows` or :meth:`ProtocolResult.record`).

    Args:
        rows: one per run, with ``run``, ``protocol``, ``split`` and ``<metric>@<K>`` values.
        metrics: the metric columns, in order; default every metric of any row, grouped by
            metric in order of first appearance, each by ascending K. A run without a
            metric shows ``–``.
    """
    if metrics is None:
        families: dict[str, None] = {}
        keys: set[str] = set()
        for row in rows:
            for key in row:
                if match := _METRIC_KEY.match(key):
                    families.setdefault(match.group(1))
                    keys.add(key)
        order = {family: i for i, family in enumerate(families)}

        def position(key: str) -> tuple[int, int]:
            match = _METRIC_KEY.match(key)
            assert match is not None
            return order[match.group(1)], int(match.group(2))

        metrics = sorted(keys, key=position)
    header = ["run", "protocol", "split", *metrics]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [str(row.get(c, "")) for c in header[:3]]
        cells += [f"{row[m]:.4f}" if isinstance(row.get(m), int | float) else "–" for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def comparison_markdown(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str] | None = None) -> str:
    """Runs compared in Markdown: one :func:`markdown_table` per protocol (in order of first
    appearance), so that metrics of one name but different protocols (ComiRec's recall@50 and
    leave-one-out's) never share a column. A single protocol gives a single table, no heading."""
    protocols = list(dict.fromkeys(str(row.get("protocol", "")) for row in rows))
    tables = {
        p: markdown_table([r for r in rows if str(r.get("protocol", "")) == p], metrics) for p in protocols
    }
    if len(tables) == 1:
        return next(iter(tables.values()))
    return "\n\n".join(f"### {protocol}\n\n{table}" for protocol, table in tables.items())
