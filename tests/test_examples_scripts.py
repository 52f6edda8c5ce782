"""The scripts in examples/ run as a user runs them (``python examples/x.py``, in a subprocess) on
small data, so that the documentation they are cannot rot."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.slow  # each runs an example script end to end: 5-8 s

EXAMPLES = REPO_ROOT / "examples"
RECOMMENDED = re.compile(r"^ +(\S+) +score +-?\d+\.\d{3} +interest \d+$", re.MULTILINE)
"""A recommendation line: ``      p24  score  0.005  interest 2``."""


def run_example(name: str, *args: str) -> str:
    """Runs ``examples/<name>`` from the repository root; returns its stdout (fails on exit != 0)."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_your_own_csv_writes_its_log_and_recommends(tmp_path: Path) -> None:
    out = run_example("your_own_csv.py", "--workdir", str(tmp_path), "--epochs", "1")
    assert re.search(r"^trained on .*clicks\.csv: test ndcg@10 \d\.\d{3}, most popular \d\.\d{3}$", out, re.M)
    assert re.search(r"^user c0, the last of \d+ items: ", out, re.M)
    items = RECOMMENDED.findall(out)
    assert len(items) == 10 and all(re.fullmatch(r"p\d+", i) for i in items)
    assert (tmp_path / "model" / "manifest.json").is_file() and (
        tmp_path / "index" / "manifest.json"
    ).is_file()


def test_your_own_csv_reads_your_columns(tmp_path: Path) -> None:
    log = tmp_path / "visits.csv"
    rows = [f"v{u},page{(u + s) % 7},2024-05-0{1 + s}T10:00:00Z" for u in range(12) for s in range(5)]
    log.write_text("visitor,page,seen_at\n" + "\n".join(rows) + "\n")
    args = ["--csv", str(log), "--columns", "user=visitor,item=page,timestamp=seen_at"]
    args += ["--timestamp-unit", "iso", "--user", "v3", "--workdir", str(tmp_path / "run"), "--epochs", "1"]
    out = run_example("your_own_csv.py", *args)
    assert "user v3, the last of 5 items: page3 page4 page5 page6 page0" in out
    assert sorted(RECOMMENDED.findall(out)) == ["page1", "page2"]  # the 7 pages but the 5 seen


def test_your_own_csv_names_a_missing_column(tmp_path: Path) -> None:
    log = tmp_path / "visits.csv"
    log.write_text("visitor,page,seen_at\nv1,a,1\n")
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "your_own_csv.py"), "--csv", str(log), "--workdir", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert "visits.csv, line 1: no columns 'uid' (data.columns.user)" in done.stderr


def test_python_api_trains_on_a_dataframe_and_retrieves(tmp_path: Path) -> None:
    out = run_example("python_api.py", "--workdir", str(tmp_path), "--epochs", "1")
    assert re.search(r"^\d+ plays: test hr@10 \d\.\d{3}, ndcg@10 \d\.\d{3}$", out, re.M)
    assert "after track-10 track-11 track-12:" in out
    tracks = RECOMMENDED.findall(out)
    assert len(tracks) == 5 and not {"track-10", "track-11", "track-12"} & set(tracks)
    assert '"path": "<DataFrame ' in (tmp_path / "model" / "config.json").read_text()
