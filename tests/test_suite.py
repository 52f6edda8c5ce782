"""Rules of the test suite itself, read from the code (AST).

Shared helpers come from ``tests/helpers.py`` (or a package folder's own ``helpers.py``, such as
``tests/serving/helpers.py``), never from ``tests/conftest.py`` (pytest loads a
conftest itself; importing it as a module runs it a second time, with copies of its fixtures)
nor from another test file (which ties two test files together and runs the other one's module
code). The code strings a test runs in a child process (``python -c CODE``) follow the same rule.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

TESTS = REPO_ROOT / "tests"


def imports(tree: ast.AST, first_line: int = 1) -> Iterator[tuple[int, str]]:
    """``(line, name)`` of every import in ``tree``: ``import a.b`` gives ``a.b``; ``from a import
    b`` gives ``a`` and ``a.b`` (``b`` may be a module)."""
    for node in ast.walk(tree):
        line = first_line + getattr(node, "lineno", 1) - 1
        if isinstance(node, ast.Import):
            yield from ((line, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield line, node.module
            yield from ((line, f"{node.module}.{alias.name}") for alias in node.names)


def string_imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """The imports in the string constants of ``tree``, one line at a time: the code of child
    processes is often a ``str.format`` template, which does not parse whole, while its import
    lines do. Prose ("from the start ...") does not parse and is skipped."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for offset, text in enumerate(node.value.splitlines()):
                statement = text.strip()
                if not statement.startswith(("import ", "from ")):
                    continue
                try:
                    parsed = ast.parse(statement)
                except SyntaxError:
                    continue
                yield from imports(parsed, node.lineno + offset)


def forbidden(name: str) -> str | None:
    """The test module ``name`` reaches into (``tests.conftest``, ``tests.serving.test_x``), or None."""
    parts = name.split(".")
    if parts[0] == "conftest":
        return "conftest"
    if parts[0] != "tests":
        return None
    for depth, part in enumerate(parts[1:], start=2):
        if part == "conftest" or part.startswith("test_"):
            return ".".join(parts[:depth])
    return None


def bad_imports(source: str, filename: str) -> list[str]:
    """``filename:line: module`` for each import of a conftest or a test module in ``source``,
    in its own code or in the code strings it runs in child processes."""
    tree = ast.parse(source, filename=filename)
    found = {
        (line, module)
        for line, name in [*imports(tree), *string_imports(tree)]
        if (module := forbidden(name))
    }
    return [f"{filename}:{line}: {module}" for line, module in sorted(found)]


def test_no_test_file_imports_the_conftest_or_another_test_file() -> None:
    files = sorted(TESTS.rglob("*.py"))
    assert TESTS / "conftest.py" in files and TESTS / "helpers.py" in files
    offenders = [
        bad
        for path in files
        if path.name != Path(__file__).name  # this file's examples below are the offences
        for bad in bad_imports(path.read_text(), str(path.relative_to(REPO_ROOT)))
    ]
    assert not offenders, "import shared helpers from tests.helpers:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from tests.conftest import run_tool", ["x.py:1: tests.conftest"]),
        ("import tests.conftest", ["x.py:1: tests.conftest"]),
        ("from tests import conftest", ["x.py:1: tests.conftest"]),
        ("import conftest", ["x.py:1: conftest"]),
        ("import os\nfrom tests.serving.test_server import f", ["x.py:2: tests.serving.test_server"]),
        ("from tests import helpers, test_server", ["x.py:1: tests.test_server"]),
        ("from tests.serving import test_server", ["x.py:1: tests.serving.test_server"]),
        ("def f():\n    from tests.ranking.test_rerank import g", ["x.py:2: tests.ranking.test_rerank"]),
        # The code a test runs in a child process: a str.format template that does not parse whole.
        ('CHILD = """\nimport sys\nsys.path.insert(0, {r!r})\nfrom tests.artifacts.test_faults import X"""',
         ["x.py:4: tests.artifacts.test_faults"]),
        ("from tests.helpers import run_tool, make_model", []),
        ("import tests.helpers\nfrom tests import helpers", []),
        ('NOTE = "from the conftest, the import of tests.conftest is refused"', []),  # prose, not code
    ],
)  # fmt: skip
def test_the_rule_sees_every_spelling(source: str, expected: list[str]) -> None:
    assert bad_imports(source, "x.py") == expected


MIRRORED = {
    "towers",
    "rankers",
    "index",
    "bench",
    *(p.parent.name for p in (REPO_ROOT / "retrieval").glob("*/__init__.py")),
}
"""The folders of ``tests/``: one per package (``retrieval``'s layers by their own names) beside the
suite-wide tests (layout, docs, packaging, configuration) at the top."""


def test_the_tests_mirror_the_packages() -> None:
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= MIRRORED, f"test folders naming no package: {sorted(folders - MIRRORED)}"
    assert all((TESTS / folder / "__init__.py").is_file() for folder in folders)
    assert {"serving", "data", "towers", "index"} <= folders
