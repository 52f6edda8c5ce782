"""The command-line tools start light and quiet: ``--help`` loads no TensorFlow, Keras, FAISS or
pandas; a run prints none of TensorFlow's start-up lines unless ``--verbose``; the help reads as
written. And the demo's data: ``--data``, else the data root, else the download."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from retrieval.environment import ABSL_NOTICE, shown_log_lines

REPO = Path(__file__).resolve().parent.parent
TOOLS = sorted(p.stem for p in (REPO / "tools").glob("*.py"))
HEAVY = ("tensorflow", "keras", "faiss", "pandas")
STARTUP_NOISE = ("oneDNN", "absl::InitializeLog")

CHILD = """
import runpy, sys
sys.path.insert(0, {repo!r})
sys.argv = [{tool!r}, *sys.argv[1:]]
code = 0
try:
    runpy.run_path({tool!r}, run_name="__main__")
except SystemExit as e:
    code = e.code
print(sorted(m for m in {heavy!r} if m in sys.modules))
sys.exit(code)
"""
"""Runs a tool as ``python tools/<name>.py ARGS`` would, then prints which heavy libraries it loaded."""


def run_child(tool: str, *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``tools/<tool>.py ARGS`` in a fresh interpreter, with TensorFlow's logging variable unset
    (as on a user's machine): the result, and the heavy libraries it loaded."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["COLUMNS"] = "110"  # argparse wraps to it: the help fits the source's line length
    code = CHILD.format(repo=str(REPO), tool=str(REPO / "tools" / f"{tool}.py"), heavy=HEAVY)
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=300
    )
    loaded = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    return done, loaded


def load_tool(name: str) -> ModuleType:
    """``tools/<name>.py`` as a module, its ``main`` not run."""
    spec = importlib.util.spec_from_file_location(f"tools_{name}", REPO / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("tool", TOOLS)
def test_help_loads_no_heavy_library_and_reads_as_written(tool: str) -> None:
    done, loaded = run_child(tool, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {tool}.py"), done.stdout[:200]
    assert loaded == [], f"tools/{tool}.py --help loaded {loaded}"
    # Source lines are at most 110 columns: a longer line is two joined (a backslash-newline in
    # a docstring that is not raw).
    long = [line for line in done.stdout.splitlines()[:-1] if len(line) > 110]
    assert not long, f"joined lines in the help: {long}"


@pytest.mark.parametrize("tool", TOOLS)
def test_an_argument_error_loads_no_heavy_library(tool: str) -> None:
    done, loaded = run_child(tool, "--no-such-flag")
    assert done.returncode == 2 and f"{tool}.py: error: " in done.stderr, done.stderr
    assert loaded == []


def test_serve_and_deploy_help_keep_the_line_continuation() -> None:
    for tool, continued in [("serve", "--metrics-port 9090 \\\n"), ("deploy", "--root runs/live \\\n")]:
        done, _ = run_child(tool, "--help")
        assert continued in done.stdout, done.stdout


@pytest.mark.slow  # two runs of build_index in child processes loading TensorFlow: 8 s
def test_a_tool_starts_quiet_unless_verbose(
    model_versions: list[tuple[Path, Path, str]], synthetic_csv: Path, tmp_path: Path
) -> None:
    """``tools/build_index.py`` on a trained model (TensorFlow, FAISS and pandas loaded) prints
    its own lines only; ``--verbose`` adds TensorFlow's start-up lines as TensorFlow prints them."""
    args = ["--model", str(model_versions[0][0]), "--data", str(synthetic_csv)]
    quiet, loaded = run_child("build_index", *args, "--out", str(tmp_path / "quiet"))
    assert quiet.returncode == 0, quiet.stderr
    assert set(HEAVY) - {"keras"} <= set(loaded)
    own = ("memory estimate for Flat", "INFO build_index: tuning on 60 users")
    assert [line for line in quiet.stderr.splitlines() if not line.startswith(own)] == []
    verbose, _ = run_child("build_index", *args, "--out", str(tmp_path / "verbose"), "--verbose")
    assert verbose.returncode == 0, verbose.stderr
    if not any(noise in verbose.stderr for noise in STARTUP_NOISE):
        pytest.skip("this TensorFlow prints no start-up lines here: nothing to hide")


def test_the_start_up_lines_shown_follow_the_log_level() -> None:
    """TensorFlow 2.21's notice and oneDNN line as it writes them on import, with a warning, a
    Python warning and an error added: each level drops the absl lines below it, nothing else."""
    text = (
        f"{ABSL_NOTICE}\n"
        "I0000 00:00:1796306716.951228   26527 port.cc:153] oneDNN custom operations are on.\n"
        "W0000 00:00:1796306716.951300   26527 cpu_feature_guard.cc:40] a warning\n"
        "/venv/lib/x.py:3: DeprecationWarning: old\n"
        "E1203 14:05:01.000001   26527 dso_loader.cc:77] Could not load libcuda.so.1\n"
    )
    lines = text.splitlines(keepends=True)
    assert shown_log_lines(text, 0) == text
    assert shown_log_lines(text, 1) == "".join(lines[2:])
    assert shown_log_lines(text, 2) == "".join(lines[3:])
    assert shown_log_lines(text, 3) == lines[3]


def test_spelt_out_values_agree_with_the_library() -> None:
    import retrieval.data

    prepare = load_tool("prepare_data")
    for name in ("FORMATS", "MAX_PARTITIONS", "EVENTS_PER_PARTITION", "USERS_PER_ROW_GROUP", "BATCH_ROWS"):
        assert getattr(prepare, name) == getattr(retrieval.data, name), name


# --- the demo's data and index -------------------------------------------------------------------


@pytest.fixture
def data_root(tmp_path: Path, monkeypatch) -> Path:
    """A data root holding an (empty) ml-100k folder; ``MITT_DATA`` unset."""
    monkeypatch.delenv("MITT_DATA", raising=False)
    (tmp_path / "root" / "ml-100k").mkdir(parents=True)
    return tmp_path / "root"


def test_the_demo_reads_data_else_the_data_root_else_downloads(data_root: Path, tmp_path: Path, monkeypatch):
    from retrieval.data import DataError

    demo = load_tool("demo")
    downloads: list[Path] = []

    def download(dest: Path) -> Path:
        downloads.append(dest)
        return dest / "ml-100k"

    monkeypatch.setattr("retrieval.data.download_movielens_100k", download)
    given = tmp_path / "elsewhere"
    assert demo.demo_data(given, str(data_root)) == given  # --data wins
    assert demo.demo_data(None, str(data_root)) == data_root / "ml-100k"  # --data-root
    monkeypatch.setenv("MITT_DATA", str(data_root))
    assert demo.demo_data(None, None) == data_root / "ml-100k"  # MITT_DATA
    with pytest.raises(DataError, match="not found"):  # a root without it: no silent download
        demo.demo_data(None, str(tmp_path))
    assert downloads == []
    monkeypatch.delenv("MITT_DATA")
    assert demo.demo_data(None, None) == demo.DOWNLOADS / "ml-100k"
    assert downloads == [demo.DOWNLOADS]


def test_the_demo_builds_its_index_with_the_users_interactions(data_root: Path, monkeypatch) -> None:
    """So that build_index measures recall on real users' interest vectors and has no reason to
    warn that item vectors overstate it."""
    demo = load_tool("demo")
    calls: list[tuple[str, ...]] = []

    class Stop(Exception):
        pass

    def run_tool(name: str, *args: str) -> None:
        calls.append((name, *args))
        if name == "build_index.py":
            raise Stop

    monkeypatch.setattr(demo, "run_tool", run_tool)
    with pytest.raises(Stop):
        demo.main(["--data-root", str(data_root), "--workdir", "unused"])
    build = calls[-1]
    assert build[build.index("--data") + 1] == str(data_root / "ml-100k")
