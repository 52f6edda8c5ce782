"""Where and when a benchmark ran, for the header of its report: commit, machine, load."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path

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
