"""The command lines start light and quiet, as ``mitt COMMAND`` and as ``tools/<name>.py``:
``--help`` loads no TensorFlow, Keras, FAISS or pandas (and ``mitt --help`` no command at all); a
run prints none of TensorFlow's start-up lines unless ``--verbose``; the help reads as written; a
command whose extra is not installed says which in one line. And the demo's data: ``--data``,
else the data root, else the download."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from retrieval.cli.dispatch import COMMANDS, DISTRIBUTION, missing_library
from retrieval.environment import ABSL_NOTICE, shown_log_lines
from tests.helpers import REPO_ROOT

TOOLS = sorted(p.stem for p in (REPO_ROOT / "tools").glob("*.py"))
SCRIPTS = [tool for tool in TOOLS if tool != "demo"]
"""The tools that run a ``mitt`` command (the demo runs them all, in a checkout)."""
ENTRIES = [*(f"tools/{tool}.py" for tool in TOOLS), *(f"mitt {name}" for name in COMMANDS)]
"""Every command line, as a user types it."""
HEAVY = ("tensorflow", "keras", "faiss", "pandas")
STARTUP_NOISE = ("oneDNN", "absl::InitializeLog")
NOT_IN_CLIENT = ("tensorflow", "keras", "faiss", "pandas", "pyarrow", "yaml", "tqdm", "matplotlib")
NOT_IN_CLIENT += ("retrieval.serving._native",)
"""Libraries a client-only install (``pip install 'mitt-retrieval[client]'``) does not have, and the
native engine, which no ``pip install`` builds."""

CHILD = """
import json, runpy, sys
sys.path.insert(0, {repo!r})
for name in {blocked!r}:
    sys.modules[name] = None  # as if not installed: importing it raises ModuleNotFoundError
code = 0
try:
    if {tool!r}:
        sys.argv = [{tool!r}, *sys.argv[1:]]
        runpy.run_path({tool!r}, run_name="__main__")
    else:
        sys.argv[0] = "mitt"
        from retrieval.cli import main
        code = main()
except SystemExit as e:
    code = e.code
print(json.dumps({{
    "heavy": sorted(m for m in {heavy!r} if sys.modules.get(m) is not None),
    "commands": sorted(m for m in {commands!r} if m in sys.modules),
}}))
sys.exit(code)
"""
"""Runs ``python tools/<name>.py ARGS`` or ``mitt ARGS`` (the console script's function), then
prints which heavy libraries and which command modules it loaded."""


def run_child(
    entry: str, *args: str, blocked: tuple[str, ...] = ()
) -> tuple[subprocess.CompletedProcess[str], list[str], list[str]]:
    """``entry`` (``tools/<name>.py`` or ``mitt COMMAND``, see :data:`ENTRIES`; ``mitt`` alone for
    the dispatcher) with ``args`` in a fresh interpreter, TensorFlow's logging variable unset (as
    on a user's machine) and the ``blocked`` modules missing: the result, the heavy libraries and
    the command modules it loaded."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["COLUMNS"] = "110"  # argparse wraps to it: the help fits the source's line length
    tool = str(REPO_ROOT / entry) if entry.startswith("tools/") else ""
    argv = list(args) if tool else [*entry.split()[1:], *args]
    commands = [f"retrieval.cli.{command.module}" for command in COMMANDS.values()]
    code = CHILD.format(repo=str(REPO_ROOT), tool=tool, heavy=HEAVY, blocked=blocked, commands=commands)
    done = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=300,
    )
    *printed, last = done.stdout.splitlines(keepends=True)
    done.stdout = "".join(printed)  # what the command printed, without the child's report
    loaded = json.loads(last)
    return done, loaded["heavy"], loaded["commands"]


def prog(entry: str) -> str:
    """What argparse calls ``entry`` in its usage and errors: ``train.py``, ``mitt train``."""
    return Path(entry).name if entry.startswith("tools/") else entry


def load_tool(name: str) -> ModuleType:
    """``tools/<name>.py`` as a module, its ``main`` not run."""
    spec = importlib.util.spec_from_file_location(f"tools_{name}", REPO_ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("entry", ENTRIES)
def test_help_loads_no_heavy_library_and_reads_as_written(entry: str) -> None:
    done, loaded, commands = run_child(entry, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {prog(entry)} "), done.stdout[:200]
    assert loaded == [], f"{entry} --help loaded {loaded}"
    if entry.startswith("mitt "):  # the chosen command's module only
        assert commands == [f"retrieval.cli.{COMMANDS[entry.split()[1]].module}"]
    # Source lines are at most 110 columns: a longer line is two joined (a backslash-newline in
    # a docstring that is not raw).
    long = [line for line in done.stdout.splitlines() if len(line) > 110]
    assert not long, f"joined lines in the help: {long}"


@pytest.mark.parametrize("entry", ENTRIES)
def test_an_argument_error_loads_no_heavy_library(entry: str) -> None:
    done, loaded, _ = run_child(entry, "--no-such-flag")
    assert done.returncode == 2 and f"{prog(entry)}: error: " in done.stderr, done.stderr
    assert loaded == []


def test_serve_and_deploy_help_keep_the_line_continuation() -> None:
    for entry, continued in [
        ("tools/serve.py", "--metrics-port 9090 \\\n"),
        ("mitt serve", "--metrics-port 9090 \\\n"),
        ("tools/deploy.py", "--root runs/live \\\n"),
        ("mitt deploy", "--root runs/live \\\n"),
    ]:
        done, _, _ = run_child(entry, "--help")
        assert continued in done.stdout, done.stdout


# --- the mitt command ------------------------------------------------------------------------------


def test_mitt_help_lists_every_command_and_imports_none() -> None:
    done, loaded, commands = run_child("mitt", "--help")
    assert done.returncode == 0, done.stderr
    listed = [line.split(maxsplit=1) for line in done.stdout.split("commands:\n", 1)[1].splitlines()[:-2]]
    assert listed == [[name, command.summary] for name, command in COMMANDS.items()]
    assert (loaded, commands) == ([], [])


def test_mitt_refuses_an_unknown_or_missing_command() -> None:
    for args, message in [(["nope"], "invalid choice: 'nope'"), ([], "required: COMMAND")]:
        done, _, commands = run_child("mitt", *args)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert commands == []


def test_mitt_version_is_the_installed_distributions() -> None:
    done, _, commands = run_child("mitt", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{DISTRIBUTION} {importlib.metadata.version(DISTRIBUTION)}"
    assert commands == []


def test_the_installed_console_script_runs_the_dispatcher() -> None:
    """``pip install`` (``make install``: editable) puts ``mitt`` beside the interpreter."""
    (entry_point,) = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "mitt"]
    assert entry_point.value == "retrieval.cli:main"
    script = Path(sys.executable).parent / "mitt"
    done = subprocess.run([script, "query", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("usage: mitt query "), done.stderr


def test_the_commands_start_through_one_module() -> None:
    """A command's parser and log format come from ``retrieval/cli/startup.py``: no command module
    builds its own (the dispatcher parses ``mitt`` itself)."""
    calls = {"ArgumentParser", "basicConfig"}
    found = []
    for command in COMMANDS.values():
        path = REPO_ROOT / "retrieval" / "cli" / f"{command.module}.py"
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(node, "func", None)
            if isinstance(node, ast.Call) and getattr(name, "attr", getattr(name, "id", "")) in calls:
                found.append(f"{path.name}:{node.lineno}")
    assert len(COMMANDS) == 10 and not found, found


def test_each_summary_is_its_commands_first_docstring_line() -> None:
    """``mitt --help`` reads them from its table, never from the modules (which it does not import)."""
    for name, command in COMMANDS.items():
        source = (REPO_ROOT / "retrieval" / "cli" / f"{command.module}.py").read_text()
        docstring = ast.get_docstring(ast.parse(source))
        assert docstring is not None and docstring.splitlines()[0] == command.summary, name


def test_every_tool_but_the_demo_runs_a_command() -> None:
    """``tools/<name>.py`` is ``mitt <name with dashes>`` (prepare_data: ``mitt prepare``)."""
    modules = {command.module for command in COMMANDS.values()}
    assert {"prepare" if tool == "prepare_data" else tool for tool in SCRIPTS} == modules
    for tool in SCRIPTS:
        command = importlib.import_module(f"retrieval.cli.{'prepare' if tool == 'prepare_data' else tool}")
        assert load_tool(tool).main is command.main, tool


def test_a_missing_extra_is_one_line_naming_it(tmp_path: Path) -> None:
    """As on a client-only install: the commands of other extras fail in one line naming theirs;
    query works, but its --titles (which reads a model folder) needs the serve extra."""
    out = str(tmp_path / "out")
    (tmp_path / "x.csv").touch()  # inputs that exist: the missing extra is all that is wrong
    for entry, extra, args in [
        ("mitt train", "train", ["--data", str(tmp_path / "x.csv"), "--out", out]),
        ("mitt build-index", "train", ["--model", str(tmp_path), "--out", out]),
        ("mitt serve", "serve", ["--model", str(tmp_path), "--index", str(tmp_path)]),
    ]:
        done, loaded, _ = run_child(entry, *args, blocked=NOT_IN_CLIENT)
        assert done.returncode == 2, done.stderr
        assert loaded == []
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("error: this command needs the ") and line.endswith(
            f"pip install '{DISTRIBUTION}[{extra}]'"
        ), line
    done, _, _ = run_child("mitt query", "--help", blocked=NOT_IN_CLIENT)
    assert done.returncode == 0, done.stderr
    done, _, _ = run_child("mitt query", "--history", "a", "--titles", str(tmp_path), blocked=NOT_IN_CLIENT)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --titles (reading a model folder) needs the serve extra (import of pandas halted; None in "
        f"sys.modules): pip install '{DISTRIBUTION}[serve]'"
    ]


MISSING_INPUT = {
    "prepare": ["--data", "{missing}", "--out", "{tmp}/out"],
    "train": ["--data", "{missing}", "--out", "{tmp}/out"],
    "evaluate": ["--model", "{missing}", "--data", "{tmp}"],
    "build-index": ["--model", "{missing}", "--out", "{tmp}/out"],
    "train-ranker": ["--model", "{missing}", "--index", "{tmp}", "--data", "{tmp}", "--ranker", "din",
                     "--out", "{tmp}/out"],
    "deploy": ["--model", "{tmp}", "--index", "{missing}", "--root", "{tmp}/root"],
    "add-items": ["--root", "{tmp}", "--items", "{missing}"],
    "serve": ["--model", "{tmp}", "--index", "{tmp}", "--tls-cert", "{missing}", "--tls-key", "{tmp}",
              "--processes", "1"],
    "query": ["--history", "a", "--titles", "{missing}"],
    "plot-attention": ["--model", "{missing}", "--data", "{tmp}", "--user", "1", "--out", "{tmp}/u.png"],
}  # fmt: skip
"""Per command, arguments naming one input that does not exist (the first path argument after
the flag shown in the error) and otherwise existing folders."""


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_missing_input_is_refused_before_any_heavy_import(command: str, tmp_path: Path) -> None:
    """Exit 2 and one line naming the flag and the path, without the seconds of importing
    TensorFlow, FAISS or pandas first."""
    missing = tmp_path / "no-such-input"
    args = [a.format(missing=missing, tmp=tmp_path) for a in MISSING_INPUT[command]]
    done, loaded, _ = run_child(f"mitt {command}", *args)
    flag = args[args.index(str(missing)) - 1]
    assert (done.returncode, done.stderr.strip()) == (
        2,
        f"error: {flag} {missing}: no such file or directory",
    )
    assert loaded == [], f"mitt {command} loaded {loaded} before refusing"


def test_a_missing_module_of_our_own_is_not_an_extra() -> None:
    """A module of this distribution missing is a broken install or a bug: the traceback stays."""
    ours = ModuleNotFoundError("No module named 'retrieval.nope'", name="retrieval.nope")
    assert missing_library(ours, "this command", "train") is None
    theirs = ModuleNotFoundError("No module named 'faiss'", name="faiss")
    assert missing_library(theirs, "this command", "serve") == (
        f"this command needs the serve extra (No module named 'faiss'): pip install '{DISTRIBUTION}[serve]'"
    )


@pytest.mark.slow  # two runs of build_index in child processes loading TensorFlow: 8 s
def test_a_tool_starts_quiet_unless_verbose(
    model_versions: list[tuple[Path, Path, str]], synthetic_csv: Path, tmp_path: Path
) -> None:
    """``tools/build_index.py`` on a trained model (TensorFlow, FAISS and pandas loaded) prints
    its own lines only; ``--verbose`` adds TensorFlow's start-up lines as TensorFlow prints them."""
    args = ["--model", str(model_versions[0][0]), "--data", str(synthetic_csv)]
    quiet, loaded, _ = run_child("tools/build_index.py", *args, "--out", str(tmp_path / "quiet"))
    assert quiet.returncode == 0, quiet.stderr
    assert set(HEAVY) - {"keras"} <= set(loaded)
    own = ("memory estimate for Flat", "INFO build_index: tuning on 60 users")
    assert [line for line in quiet.stderr.splitlines() if not line.startswith(own)] == []
    verbose, _, _ = run_child("mitt build-index", *args, "--out", str(tmp_path / "verbose"), "--verbose")
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
    import retrieval.cli.prepare as prepare
    import retrieval.data

    names = ("FORMATS", "TIMESTAMP_UNITS", "MAX_PARTITIONS", "EVENTS_PER_PARTITION", "USERS_PER_ROW_GROUP")
    for name in (*names, "BATCH_ROWS"):
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
