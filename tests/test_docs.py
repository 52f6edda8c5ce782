"""The documentation: the site builds with warnings as errors, and the commands it shows work.

**The site**: ``mkdocs build --strict`` of ``mkdocs.yml`` into ``tmp_path``. Strict mode fails on
a broken link or anchor between pages, a page missing from the navigation, and any docstring of
the API reference that griffe cannot parse (the reference is generated from the docstrings of
every name the packages export).

**The commands**: every fenced code block of ``README.md`` and ``docs/**/*.md`` (and every inline
code span that starts a command, as in the tables of the tools page) is parsed: line
continuations joined, comments dropped, commands split at ``&&``, ``;``, ``|`` and ``&``, leading
``VAR=value`` assignments dropped, ``$MITT_DATA`` expanded.

Run for real, each in a fresh folder:

* ``--help`` of every command the docs name: ``mitt COMMAND`` (through ``python -m retrieval.cli``,
  the program the ``mitt`` script runs) and ``python tools/NAME.py`` (the scripts, including the
  older names the benchmark page records); ``mitt --help``;
* every ``mitt train``, ``mitt train-ranker`` and ``mitt build-index`` command (and their
  ``tools/`` forms) with ``--print-config`` appended: the whole configuration (preset,
  ``--config`` file, flags, every ``--set``) is resolved and checked, without TensorFlow, FAISS
  or data, against a data root laid out like the public datasets'. A ``> FILE`` redirection
  writes the output where a later command of the same block reads it, and a code block titled
  ``title="NAME"`` is written to ``NAME`` first.
  A command whose ``--config`` file exists nowhere (written by an earlier training run) is only
  checked;
* Python blocks: compiled, and every ``from MODULE import NAME`` resolved statically (griffe) to
  a name the module defines or exports.

Only checked: every other command (training, indexing, serving, querying, evaluating, deploying,
plotting, the demo): each ``--flag`` it passes exists in the command's ``--help``, and a value of
a flag with fixed choices is one of them. Those run in the end-to-end and tool tests and in the
examples. ``python -m bench.NAME`` commands: their flags exist in the benchmark's argparse
definitions (read from its source: its ``--help`` loads TensorFlow). ``make TARGET``: the target
exists in the Makefile (``DEMO_ARGS`` flags are checked against the demo's ``--help``).

**User docs**: no development paths and no issue references in ``README.md`` or ``docs/``, and
every relative link of ``README.md`` reaches a file (and heading) that exists.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

DOCS = REPO_ROOT / "docs"
PAGES = sorted([REPO_ROOT / "README.md", *DOCS.rglob("*.md")])
CLI = [sys.executable, "-m", "retrieval.cli"]
RUN_WITH_PRINT_CONFIG = {"train", "train-ranker", "build-index", "serve"}
"""Commands whose whole configuration --print-config resolves and checks without TensorFlow or data."""

TOOL_SCRIPTS = {
    "prepare_data": "prepare",
    "train": "train",
    "evaluate": "evaluate",
    "build_index": "build-index",
    "train_ranker": "train-ranker",
    "deploy": "deploy",
    "serve": "serve",
    "query": "query",
    "plot_attention": "plot-attention",
}
"""tools/NAME.py -> the mitt command running the same code."""

RETIRED_BENCHMARKS = {"bench.towers"}
"""Benchmark modules since folded into others: the benchmark page keeps the commands its recorded
runs used, each with today's equivalent beside it."""

FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
INLINE_COMMAND = re.compile(r"`((?:mitt|python tools/\w+\.py|tools/\w+\.py) [^`]*)`")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
PLACEHOLDER = re.compile(r"[A-Z]{2,}|[<…$\[|]")


@dataclass
class Command:
    """One shell command of a page: its words, where it is, and a ``> FILE`` redirection."""

    words: list[str]
    page: str
    block: int
    stdout: str | None = None
    inline: bool = False
    expected: str | None = None

    def __str__(self) -> str:
        return f"{self.page} (block {self.block}): {shlex.join(self.words)}"


@dataclass
class Block:
    """A fenced code block: its language, title (``title="NAME"``) and text."""

    lang: str
    title: str | None
    body: str
    page: str
    index: int
    commands: list[Command] = field(default_factory=list)


def relative(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


def code_blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, indented ones (inside list items) included."""
    blocks = []
    for i, m in enumerate(FENCE.finditer(page.read_text())):
        info = m.group("info").strip()
        title = re.search(r'title="([^"]+)"', info)
        body = "".join(line[len(m.group("indent")) :] + "\n" for line in m.group("body").splitlines())
        lang = info.split()[0] if info else ""
        blocks.append(Block(lang, title.group(1) if title else None, body, relative(page), i))
    return blocks


def shell_commands(block: Block) -> list[Command]:
    """The commands of a shell block (see the module docstring for what is split and dropped).

    In a ``console`` block only lines after a ``$`` prompt are commands; the lines that follow
    one are its expected output.
    """
    commands: list[Command] = []
    pending = ""
    expected: list[str] = []
    text = re.sub(r"\\\n", " ", block.body)
    for line in text.splitlines():
        if block.lang == "console" and not pending:
            if not line.startswith("$ "):
                expected.append(line)
                continue
            if commands and expected:
                commands[-1].expected = "\n".join(expected).strip()
            expected, line = [], line[2:]
        pending += line
        try:
            words = split_command_line(pending)
        except ValueError:  # a quotation closes on a later line
            pending += "\n"
            continue
        pending = ""
        for command in words:
            commands.append(Command(command[0], block.page, block.index, command[1]))
    if commands and expected:
        commands[-1].expected = "\n".join(expected).strip()
    for command in commands:
        while command.words and re.match(r"^[A-Za-z_]\w*=", command.words[0]):
            del command.words[0]  # VAR=value before a command
    return [c for c in commands if c.words]


def split_command_line(line: str) -> list[tuple[list[str], str | None]]:
    """``(words, stdout file)`` of each command of a shell line.

    Raises:
        ValueError: an unclosed quotation.
    """
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|><")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out: list[tuple[list[str], str | None]] = []
    words: list[str] = []
    stdout: str | None = None
    redirect = False
    for token in [*lexer, ";"]:
        if token in {";", "&", "&&", "|", "||"}:
            if words:
                out.append((words, stdout))
            words, stdout = [], None
        elif token in {">", ">>"}:
            redirect = True
        elif redirect:
            stdout, redirect = token, False
        else:
            words.append(token)
    return out


def inline_commands(page: Path) -> list[Command]:
    """Commands written as inline code in the text and tables (``mitt train --data PATH …``)."""
    text = FENCE.sub("", page.read_text())
    return [
        Command(m.group(1).replace("\\|", "|").split(), relative(page), -1, inline=True)
        for m in INLINE_COMMAND.finditer(text)
    ]


def all_blocks() -> list[Block]:
    blocks = [b for page in PAGES for b in code_blocks(page)]
    for b in blocks:
        if b.lang in {"bash", "sh", "shell", "console"}:
            b.commands = shell_commands(b)
    return blocks


def all_commands() -> list[Command]:
    return [c for b in all_blocks() for c in b.commands] + [c for p in PAGES for c in inline_commands(p)]


def program(command: Command) -> tuple[str, list[str]] | None:
    """``(what, args)`` for the commands this test knows: ``mitt CMD``, ``tools/NAME.py``,
    ``bench.NAME`` and ``make``; None for any other program (awk, kill, grpcurl, pip, ...)."""
    words = command.words
    if words[:3] == ["python", "-m", "retrieval.cli"]:
        words = ["mitt", *words[3:]]
    if words[0] == "python" and len(words) > 1 and re.fullmatch(r"tools/\w+\.py", words[1]):
        words = words[1:]
    if words[0] == "mitt":
        if len(words) == 1 or words[1].startswith("-"):
            return "mitt", words[1:]
        if words[1].isupper():
            return None  # mitt COMMAND --help: a placeholder
        return f"mitt {words[1]}", words[2:]
    if re.fullmatch(r"tools/\w+\.py", words[0]):
        return words[0], words[1:]
    if words[0] == "python" and words[1:2] == ["-m"] and words[2].startswith("bench."):
        return words[2], words[3:]
    if words[0] == "make":
        return "make", words[1:]
    return None


@cache
def help_text(what: str) -> str:
    """``--help`` of a command (``mitt CMD`` or ``tools/NAME.py``), run for real."""
    if what == "mitt":
        argv = [*CLI, "--help"]
    elif what.startswith("mitt "):
        argv = [*CLI, what.split()[1], "--help"]
    else:
        argv = [sys.executable, what, "--help"]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stderr}"
    return done.stdout


@cache
def options(what: str) -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """The flags of a command and the choices of those that have fixed values.

    Read from the usage and the option list of its ``--help``, or for a benchmark module from
    the ``add_argument`` calls of its source.
    """
    if what.startswith("bench."):
        path = REPO_ROOT / what.replace(".", "/")
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]
        assert files and all(f.exists() for f in files), f"no benchmark module {what}"
        source = "".join(f.read_text() for f in files)
        return frozenset(re.findall(r"""add_argument\(\s*["'](--[\w-]+)""", source)), {}
    text = help_text(what)
    usage = text.split("\n\n", 1)[0]
    listed = "\n".join(line for line in text.splitlines() if re.match(r"^\s{2}-", line))
    flags = frozenset(FLAG.findall(usage + "\n" + listed))
    choices = {
        flag: frozenset(values.split(","))
        for flag, values in re.findall(r"(--[\w-]+) \{([^}]*)\}", " ".join(usage.split()))
    }
    return flags, choices


def check_flags(command: Command, what: str, args: list[str]) -> list[str]:
    """Problems with the flags (and fixed-choice values) a command passes."""
    flags, choices = options(what)
    problems = []
    for i, word in enumerate(args):
        if not word.startswith("--") or word == "--":
            continue
        flag, _, inline_value = word.partition("=")
        flag = FLAG.match(flag).group(1) if FLAG.match(flag) else flag
        if flag not in flags:
            problems.append(f"{command}: {what} has no option {flag}")
            continue
        value = inline_value or (args[i + 1] if i + 1 < len(args) else "")
        concrete = value and not command.inline and not PLACEHOLDER.search(value)
        if flag in choices and concrete and value not in choices[flag]:
            problems.append(f"{command}: {flag} {value!r} is not one of {sorted(choices[flag])}")
    return problems


def command_name(what: str) -> str | None:
    """The mitt command a ``mitt CMD`` or ``tools/NAME.py`` runs (None for the demo and others)."""
    if what.startswith("mitt "):
        return what.split()[1]
    match = re.fullmatch(r"tools/(\w+)\.py", what)
    return TOOL_SCRIPTS.get(match.group(1)) if match else None


# ---------------------------------------------------------------- the site


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_site_builds_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2.0
    argv = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=300)
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert done.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(warnings or [done.stderr])
    assert (tmp_path / "site" / "index.html").exists()
    reference = (tmp_path / "site" / "reference" / "retrieval-api" / "index.html").read_text()
    assert 'id="retrieval.api.RetrievalClient"' in reference  # names resolved through __all__


# ---------------------------------------------------------------- the commands


def test_the_docs_show_commands() -> None:
    """The parser finds the commands (a regression here would make the checks below vacuous)."""
    found = {p[0] for c in all_commands() if (p := program(c))}
    for expected in ("mitt train", "mitt build-index", "mitt serve", "mitt query", "make", "bench.quality"):
        assert expected in found, f"no {expected} command found in the docs"


def test_commands_name_existing_programs_and_flags() -> None:
    problems = []
    for command in all_commands():
        parsed = program(command)
        if parsed is None:
            continue
        what, args = parsed
        if what == "make":
            targets = set(re.findall(r"^([\w-]+):", (REPO_ROOT / "Makefile").read_text(), re.M))
            goals = [a for a in args if "=" not in a]
            problems += [f"{command}: no make target {g}" for g in goals if g not in targets]
            for a in args:
                if a.startswith("DEMO_ARGS="):
                    demo = Command(shlex.split(a.partition("=")[2]), command.page, command.block)
                    problems += check_flags(demo, "tools/demo.py", demo.words)
            continue
        if what in RETIRED_BENCHMARKS:
            continue
        if what.startswith("tools/") and not (REPO_ROOT / what).exists():
            problems.append(f"{command}: no script {what}")
            continue
        if what.startswith("mitt ") and what.split()[1] not in help_text("mitt"):
            problems.append(f"{command}: no command {what}")
            continue
        problems += check_flags(command, what, args)
    assert not problems, "\n".join(problems)


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_quick_commands_run(tmp_path: Path) -> None:
    """``--help`` of every named command, and training configurations through ``--print-config``."""
    root = tmp_path / "data-root"  # the public datasets' layout, empty: --print-config reads no data
    (root / "ml-100k").mkdir(parents=True)
    for path in ("amazon-beauty/Beauty.txt", "amazon-sports/Sports_and_Outdoors.txt"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).touch()
    env = {**os.environ, "MITT_DATA": str(root), "PYTHONPATH": str(REPO_ROOT)}
    ran, problems = 0, []
    helped = {"mitt"}  # each command's --help runs once: a page names some dozens of times
    help_text("mitt")
    blocks = all_blocks()
    for n, block in enumerate(blocks):
        if not block.commands:
            continue
        cwd = tmp_path / f"block-{n}"
        cwd.mkdir()
        for titled in blocks:
            if titled.title:
                (cwd / titled.title).write_text(titled.body)
        for command in block.commands:
            parsed = program(command)
            if parsed is None or parsed[0] in {"make", "mitt"} or parsed[0].startswith("bench."):
                continue
            what, args = parsed
            if not what.startswith("mitt ") and not (REPO_ROOT / what).exists():
                continue  # reported by the test above
            if what not in helped:
                helped.add(what)
                help_text(what)
            name = command_name(what)
            if name not in RUN_WITH_PRINT_CONFIG or "--help" in args:
                continue
            args = [os.path.expandvars(a.replace("$MITT_DATA", str(root))) for a in args]
            if "--data-root" in args:
                args[args.index("--data-root") + 1] = str(root)
            config = args[args.index("--config") + 1] if "--config" in args else None
            if config and not (cwd / config).exists():
                continue  # a run's config.json: only its flags are checked
            script = [*CLI, name] if what.startswith("mitt ") else [sys.executable, str(REPO_ROOT / what)]
            argv = [*script, *args, *([] if "--print-config" in args else ["--print-config"])]
            done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env, timeout=120)
            ran += 1
            printed = done.stdout + done.stderr
            if command.expected is not None:  # a console block shows what it prints
                if command.expected not in printed:
                    problems.append(f"{command}: printed\n{printed}\nnot\n{command.expected}")
            elif done.returncode != 0:
                problems.append(f"{command}: exit {done.returncode}\n{done.stderr.strip()}")
            elif command.stdout:
                (cwd / command.stdout).write_text(done.stdout)
    assert not problems, "\n".join(problems)
    assert ran >= 10, f"only {ran} training commands ran through --print-config"


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_python_blocks_compile_and_import_what_exists() -> None:
    griffe = pytest.importorskip("griffe")
    loader = griffe.GriffeLoader(search_paths=[str(REPO_ROOT)])
    loaded: set[str] = set()  # loading a module parses its whole package: each package once
    problems = []
    for block in all_blocks():
        if block.lang != "python":
            continue
        try:
            tree = ast.parse(block.body)
        except SyntaxError as e:
            problems.append(f"{block.page} (block {block.index}): {e}")
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            package = node.module.split(".")[0]
            if package not in {"retrieval", "index", "towers", "rankers"}:
                continue
            if package not in loaded:
                loader.load(package)
                loaded.add(package)
            module = loader.modules_collection.get_member(node.module)
            for alias in node.names:
                if alias.name not in module.members and alias.name not in (module.exports or ()):
                    problems.append(f"{block.page} (block {block.index}): {node.module} has no {alias.name}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- user docs


def test_user_docs_name_no_development_paths_or_issues() -> None:
    forbidden = re.compile(r"/work/|\.\./shared|\bissues?\b|\btarget of the issue", re.I)
    hits = [
        f"{relative(page)}:{n}: {line.strip()}"
        for page in PAGES
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if forbidden.search(line)
    ]
    assert not hits, "\n".join(hits)


def test_readme_links_reach_files_and_headings() -> None:
    slugify = pytest.importorskip("markdown.extensions.toc").slugify  # what MkDocs names headings by
    readme = (REPO_ROOT / "README.md").read_text()
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", readme):
        if re.match(r"^[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = REPO_ROOT / path
        if not file.exists():
            problems.append(f"README.md links to a missing {path}")
        elif anchor:
            text = FENCE.sub("", file.read_text())
            slugs = {slugify(h, "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}
            if anchor not in slugs:
                problems.append(f"README.md links to {target}: no such heading")
    assert not problems, "\n".join(problems)


def test_readme_results_stand_in_the_benchmark_sections_they_link() -> None:
    """Every number of a README results row (its "ours" and "peer" cells) is written in the
    benchmarks section the row links to, so the README cannot drift from its sources."""
    slugify = pytest.importorskip("markdown.extensions.toc").slugify
    readme = (REPO_ROOT / "README.md").read_text()
    table = readme.split("## Results", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in table.splitlines() if r.startswith("| [")]
    assert len(rows) >= 4, table
    problems = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        sections = " ".join(
            benchmark_section(slugify, anchor) for anchor in re.findall(r"benchmarks\.md#([\w-]+)", row)
        )
        for number in re.findall(r"\d+\.\d+", " ".join(cells[1:3])):
            if number not in sections:
                problems.append(f"{number} ({cells[0][:50]}...) is not in the sections the row links")
    assert not problems, "\n".join(problems)


def test_the_tower_count_the_docs_give_is_the_registry_s() -> None:
    """ "(N towers)" in the request diagrams and "N user towers" in the prose match ``towers``."""
    from towers import tower_names

    words = {"seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}
    found = []
    for page in (REPO_ROOT / "README.md", DOCS / "index.md", DOCS / "architecture.md", DOCS / "towers.md"):
        text = page.read_text()
        found += [(page.name, int(n)) for n in re.findall(r"\((\d+) towers\)", text)]
        found += [(page.name, words[w.lower()]) for w in re.findall(r"\b([A-Za-z]+) user towers", text, re.I)
                  if w.lower() in words]  # fmt: skip
    assert len(found) >= 5, found
    assert {n for _, n in found} == {len(tower_names())}, found


def benchmark_section(slugify: object, anchor: str) -> str:
    """The text of the benchmarks page's section whose heading slug is ``anchor``, up to the next
    heading of the same or a higher level."""
    lines = (DOCS / "benchmarks.md").read_text().splitlines()
    for start, line in enumerate(lines):
        heading = re.match(r"^(#+) (.+)$", line)
        if heading and slugify(heading.group(2), "-") == anchor:  # type: ignore[operator]
            level = len(heading.group(1))
            end = next(
                (i for i in range(start + 1, len(lines)) if re.match(rf"^#{{1,{level}}} ", lines[i])),
                len(lines),
            )
            return "\n".join(lines[start:end])
    raise AssertionError(f"docs/benchmarks.md has no heading {anchor!r}")
