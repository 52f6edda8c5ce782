"""The scripts in examples/ run as a user runs them (``python examples/x.py``: ``__main__``, the
examples folder first on ``sys.path``, the repository as the working folder) on small data, so that
the documentation they are cannot rot. One fresh interpreter runs every case of this module, one
after the other: TensorFlow's import (~6 s of CPU) is paid once, not once per case."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.slow  # one interpreter runs the example scripts end to end: ~15 s of CPU

EXAMPLES = REPO_ROOT / "examples"
RECOMMENDED = re.compile(r"^ +(\S+) +score +-?\d+\.\d{3} +interest \d+$", re.MULTILINE)
"""A recommendation line: ``      p24  score  0.005  interest 2``."""

RUNNER = """
import contextlib, io, json, runpy, sys, traceback
results = []
for script, argv in json.loads(sys.argv[1]):
    sys.argv, sys.path[0] = [script, *argv], {examples!r}
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:  # the scripts end in sys.exit(main()); None is 0, as for the interpreter
            code = e.code or 0 if e.code is None or isinstance(e.code, int) else 1
        except Exception:  # the case fails on its own, with its traceback
            code = 1
            traceback.print_exc()
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""
"""Runs each ``[script, argv]`` of its JSON argument as ``python script *argv`` would, one after the
other; prints ``[exit code, stdout, stderr]`` of each as JSON."""


def missing_column_log(folder: Path) -> Path:
    """A log without the example's default user column (``uid``)."""
    log = folder / "visits.csv"
    log.write_text("visitor,page,seen_at\nv1,a,1\n")
    return log


def visits_log(folder: Path) -> Path:
    """12 visitors, 5 of 7 pages each, one a day, with columns of their own names and ISO times."""
    log = folder / "visits.csv"
    rows = [f"v{u},page{(u + s) % 7},2024-05-0{1 + s}T10:00:00Z" for u in range(12) for s in range(5)]
    log.write_text("visitor,page,seen_at\n" + "\n".join(rows) + "\n")
    return log


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, str, Path]]:
    """Every case of this module run in one fresh interpreter: case -> ``(exit code, stdout, stderr,
    its folder)``."""
    folders = {name: tmp_path_factory.mktemp(name) for name in ("csv", "columns", "missing", "api")}
    cases = {
        "csv": ["your_own_csv.py", "--workdir", str(folders["csv"]), "--epochs", "1"],
        "columns": [
            "your_own_csv.py", "--csv", str(visits_log(folders["columns"])),
            "--columns", "user=visitor,item=page,timestamp=seen_at", "--timestamp-unit", "iso",
            "--user", "v3", "--workdir", str(folders["columns"] / "run"), "--epochs", "1",
        ],
        "missing": [
            "your_own_csv.py", "--csv", str(missing_column_log(folders["missing"])),
            "--workdir", str(folders["missing"]),
        ],
        "api": ["python_api.py", "--workdir", str(folders["api"]), "--epochs", "1"],
    }  # fmt: skip
    plan = [[str(EXAMPLES / script), argv] for script, *argv in cases.values()]
    done = subprocess.run(
        [sys.executable, "-c", RUNNER.format(examples=str(EXAMPLES)), json.dumps(plan)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.splitlines()[-1])
    return {
        name: (code, out, err, folders[name]) for name, (code, out, err) in zip(cases, results, strict=True)
    }


def output(runs: dict[str, tuple[int, str, str, Path]], case: str) -> str:
    """The stdout of a case that succeeded (fails on exit != 0)."""
    code, out, err, _ = runs[case]
    assert code == 0, err
    return out


def test_your_own_csv_writes_its_log_and_recommends(runs: dict[str, tuple[int, str, str, Path]]) -> None:
    out, workdir = output(runs, "csv"), runs["csv"][3]
    assert re.search(r"^trained on .*clicks\.csv: test ndcg@10 \d\.\d{3}, most popular \d\.\d{3}$", out, re.M)
    assert re.search(r"^user c0, the last of \d+ items: ", out, re.M)
    items = RECOMMENDED.findall(out)
    assert len(items) == 10 and all(re.fullmatch(r"p\d+", i) for i in items)
    assert (workdir / "model" / "manifest.json").is_file() and (workdir / "index" / "manifest.json").is_file()


def test_your_own_csv_reads_your_columns(runs: dict[str, tuple[int, str, str, Path]]) -> None:
    out = output(runs, "columns")
    assert "user v3, the last of 5 items: page3 page4 page5 page6 page0" in out
    assert sorted(RECOMMENDED.findall(out)) == ["page1", "page2"]  # the 7 pages but the 5 seen


def test_your_own_csv_names_a_missing_column(runs: dict[str, tuple[int, str, str, Path]]) -> None:
    code, _, err, _ = runs["missing"]
    assert code == 2
    assert "visits.csv, line 1: no columns 'uid' (data.columns.user)" in err


def test_python_api_trains_on_a_dataframe_and_retrieves(runs: dict[str, tuple[int, str, str, Path]]) -> None:
    out, workdir = output(runs, "api"), runs["api"][3]
    assert re.search(r"^\d+ plays: test hr@10 \d\.\d{3}, ndcg@10 \d\.\d{3}$", out, re.M)
    assert "after track-10 track-11 track-12:" in out
    tracks = RECOMMENDED.findall(out)
    assert len(tracks) == 5 and not {"track-10", "track-11", "track-12"} & set(tracks)
    assert '"path": "<DataFrame ' in (workdir / "model" / "config.json").read_text()
