"""Where and when a benchmark ran, for the header of its report: commit, machine, load."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def commit() -> str:
    """The checkout's commit (short hash), or ``unknown``."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> str:
    """Cores and processor, e.g. ``2 cores, AMD EPYC ...``."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores, {model or platform.processor() or platform.machine()}"


def load_average(digits: int = 1) -> str:
    """The 1, 5 and 15 minute load averages, e.g. ``1.9, 2.0, 2.1``: other jobs inflate the times."""
    return ", ".join(f"{x:.{digits}f}" for x in os.getloadavg())


def run_meta(command: str, load_start: str | None = None) -> dict[str, Any]:
    """A report's ``meta`` as its benchmark starts: ``date`` (UTC), ``commit``, ``command``,
    ``machine`` and ``load_start`` (:func:`load_average` now, unless taken earlier); the
    benchmark adds ``load_end`` when it ends, and its own settings."""
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "command": command,
        "machine": machine(),
        "load_start": load_average(2) if load_start is None else load_start,
    }


def measured(meta: Mapping[str, Any]) -> list[str]:
    """The first lines of a report's ``results.md``, from its :func:`run_meta` and ``load_end``:
    when, where and under what load it was measured, then the command."""
    return [
        f"Measured {meta['date']} at commit `{meta['commit']}` on {meta['machine']} (load average "
        f"{meta['load_start']} at the start, {meta['load_end']} at the end: other jobs inflate the times).",
        "",
        f"```bash\n{meta['command']}\n```",
    ]


def write_report(
    out: Path, results: Mapping[str, Any], text: str, names: tuple[str, str] = ("results.json", "table.md")
) -> None:
    """Writes a benchmark's ``results`` (JSON) and its Markdown ``text`` to ``out`` under ``names``
    and prints the text."""
    out.mkdir(parents=True, exist_ok=True)
    (out / names[0]).write_text(json.dumps(results, indent=2))
    (out / names[1]).write_text(text + "\n")
    print(text)
