"""The layout's rules, read from the code: which package may import which, what is public, what
stays light. Imports are read with ``ast`` (every import, in functions and under
``TYPE_CHECKING`` too), not by running or grepping the code."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

LAYERS: dict[str, set[str]] = {
    "storage": set(),
    "api": set(),
    "data": {"storage"},
    "artifacts": {"data", "storage"},
    # Serving and evaluation side by side over the artifacts: neither imports the other, and
    # training (which evaluates as it goes) never imports serving.
    "serving": {"api", "artifacts", "data", "storage"},
    "evaluation": {"api", "artifacts", "data", "storage"},
    "training": {"evaluation", "api", "artifacts", "data", "storage"},
    "ranking": {"training", "evaluation", "serving", "api", "artifacts", "data", "storage"},
    # The command lines: the top layer, which no other imports (only tools/ and the tests do).
    "cli": {"ranking", "training", "evaluation", "serving", "api", "artifacts", "data", "storage"},
}
"""Each subpackage of :mod:`retrieval` -> the subpackages it may import (besides itself)."""

BASE_MODULES = {"retrieval.config", "retrieval.environment"}
"""Modules at the top of :mod:`retrieval` that every layer may import; they import no layer."""

LIBRARIES = ("retrieval", "towers", "rankers", "index")


def python_files(*tops: str) -> Iterator[Path]:
    for top in tops:
        yield from sorted((REPO / top).rglob("*.py"))


def imported_modules(path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """``(line, module, names)`` of every import in ``path``; names are empty for ``import m``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import"
            yield node.lineno, node.module or "", [alias.name for alias in node.names]


def layer_of(module: str) -> str | None:
    """The layer of a ``retrieval.<layer>...`` module; ``None`` for anything else."""
    parts = module.split(".")
    return parts[1] if parts[0] == "retrieval" and len(parts) > 1 and parts[1] in LAYERS else None


def test_every_subpackage_of_retrieval_is_a_layer() -> None:
    folders = {p.name for p in (REPO / "retrieval").iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(LAYERS)
    modules = {f"retrieval.{p.stem}" for p in (REPO / "retrieval").glob("*.py") if p.stem != "__init__"}
    assert modules <= BASE_MODULES, f"modules outside a layer: {sorted(modules - BASE_MODULES)}"


def test_layers_import_only_the_layers_below_them() -> None:
    violations = []
    for path in python_files("retrieval"):
        own = layer_of(".".join(path.relative_to(REPO).with_suffix("").parts))
        for line, module, _ in imported_modules(path):
            if module == "retrieval" or (module.startswith("retrieval.") and layer_of(module) is None):
                if own is not None and module not in BASE_MODULES:
                    violations.append(f"{path.relative_to(REPO)}:{line} imports {module}")
                continue
            target = layer_of(module)
            if target is None or target == own:
                continue
            if own is None or target not in LAYERS[own]:
                violations.append(f"{path.relative_to(REPO)}:{line} ({own}) imports {module} ({target})")
    assert not violations, "\n".join(violations)


def test_base_modules_import_no_layer() -> None:
    for module in BASE_MODULES:
        path = REPO / (module.replace(".", "/") + ".py")
        if path.is_file():
            imported = [m for _, m, _ in imported_modules(path) if m.startswith("retrieval")]
            assert not imported, f"{module} imports {imported}"


@pytest.mark.parametrize("package", ["towers", "rankers", "index"])
def test_towers_rankers_and_index_never_import_retrieval(package: str) -> None:
    for path in python_files(package):
        for line, module, _ in imported_modules(path):
            assert module.split(".")[0] != "retrieval", f"{path.relative_to(REPO)}:{line} imports {module}"


def test_towers_and_index_do_not_import_each_other() -> None:
    for package, other in (("towers", "index"), ("index", "towers")):
        for path in python_files(package):
            for line, module, _ in imported_modules(path):
                assert module.split(".")[0] != other, f"{path.relative_to(REPO)}:{line} imports {module}"


def test_no_library_imports_tools_or_bench() -> None:
    for path in python_files(*LIBRARIES, "tools"):
        for line, module, _ in imported_modules(path):
            top = module.split(".")[0]
            assert top not in ("tools", "bench"), f"{path.relative_to(REPO)}:{line} imports {module}"


def test_only_tools_import_the_command_lines() -> None:
    """``retrieval.cli`` is the top layer: the layers below never import it (the test above), and
    neither do ``towers``, ``rankers``, ``index`` or the benchmarks."""
    for path in python_files("towers", "rankers", "index", "bench"):
        for line, module, _ in imported_modules(path):
            assert layer_of(module) != "cli", f"{path.relative_to(REPO)}:{line} imports {module}"


def public_names(package: str) -> set[str]:
    """The ``__all__`` of a package or base module, read from its source: a lazy package's stub
    (``__init__.pyi``, which ``lazy_loader`` reads too), else its ``__init__.py`` or module file."""
    folder = REPO / package.replace(".", "/")
    candidates = [folder / "__init__.pyi", folder / "__init__.py", folder.with_suffix(".py")]
    source = next(path for path in candidates if path.is_file())
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            assert isinstance(node.value, ast.List | ast.Tuple)
            return {ast.literal_eval(e) for e in node.value.elts}
    raise AssertionError(f"{source.relative_to(REPO)} declares no __all__")


def packages_of(top: str) -> list[str]:
    return sorted(".".join(p.parent.relative_to(REPO).parts) for p in (REPO / top).rglob("__init__.py"))


@pytest.mark.parametrize("package", [*packages_of("retrieval")[1:], "towers", "rankers", "index"])
def test_every_package_declares_its_public_api(package: str) -> None:
    names = public_names(package)
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(names)  # a stub's imports and its __all__ agree
    missing = [name for name in names if not hasattr(module, name)]  # loads every lazy name
    assert not missing, f"{package}.__all__ names what it does not define: {missing}"


LAZY: dict[str, str] = {
    "retrieval.artifacts": "mitt build-index --help",
    "retrieval.data": "mitt train --help",
    "retrieval.evaluation": "mitt evaluate --help",
    "retrieval.ranking": "mitt train-ranker --help",
    "retrieval.serving": "mitt serve --help",
    "retrieval.training": "mitt train --help",
}
"""The packages that load their names on first use (SPEC 1, ``lazy_loader.attach_stub``) -> a
light path (``tests/cli/test_tools.py`` keeps it light) that reads one of their names and that an eager
``__init__.py`` would make load TensorFlow, FAISS or pandas. Every other package is plain."""


@pytest.mark.parametrize("package", packages_of("retrieval")[1:])
def test_a_package_is_lazy_through_its_stub_or_plain(package: str) -> None:
    """A lazy package's ``__init__.py`` only attaches its stub, and its docstring names the path
    that needs it; a plain one imports exactly the names of its ``__all__`` (no stub beside it)."""
    init = REPO / package.replace(".", "/") / "__init__.py"
    tree = ast.parse(init.read_text())
    statements = [n for n in tree.body if not isinstance(n, ast.Expr)]
    if package in LAZY:
        assert init.with_suffix(".pyi").is_file(), f"{package} has no __init__.pyi"
        assert [ast.unparse(n) for n in statements] == [
            "import lazy_loader",
            "__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)",
        ]
        docstring = " ".join((ast.get_docstring(tree) or "").split())
        assert LAZY[package] in docstring, f"{package}'s docstring does not name {LAZY[package]}"
        return
    stub = init.with_suffix(".pyi")
    assert not stub.exists(), f"{package} is plain: type checkers would read {stub.name} instead"
    imports = [n for n in statements if isinstance(n, ast.ImportFrom)]
    assert [ast.unparse(n).split(" =")[0] for n in statements if n not in imports] == ["__all__"]
    assert sorted(a.asname or a.name for n in imports for a in n.names) == sorted(public_names(package))


@pytest.mark.parametrize("package", sorted(LAZY))
def test_a_lazy_package_would_load_something_heavy(package: str) -> None:
    """A stub pays only while an eager ``__init__.py`` (which runs what ``from package import *``
    runs) would load TensorFlow, FAISS or pandas; once it would not, the package becomes plain."""
    assert first_heavy_module(f"from {package} import *") is not None


def command_modules() -> set[str]:
    """The modules of the ``mitt`` commands, each declaring its public names (``main``...) in ``__all__``."""
    from retrieval.cli.dispatch import COMMANDS

    return {f"retrieval.cli.{command.module}" for command in COMMANDS.values()}


def test_tools_and_bench_import_only_public_names() -> None:
    """From a package's ``__all__``, a base module's, or (a tool running a command) the command's."""
    violations = []
    for path in python_files("tools", "bench"):
        for line, module, names in imported_modules(path):
            if module.split(".")[0] != "retrieval":
                continue
            where = f"{path.relative_to(REPO)}:{line}"
            init = REPO / module.replace(".", "/") / "__init__.py"
            if not names or not (init.is_file() or module in BASE_MODULES | command_modules()):
                violations.append(f"{where}: import from a package or a base module, not {module}")
                continue
            private = sorted(set(names) - public_names(module))
            if private:
                violations.append(f"{where}: {module} does not export {private}")
    assert not violations, "\n".join(violations)


HEAVY = ("tensorflow", "keras", "faiss", "pandas")

FIRST_HEAVY = """
import importlib.abc, importlib.machinery, os, sys

class Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):  # the module is in sys.modules: it is being loaded
        print(repr(module.__name__), flush=True)
        os._exit(0)

class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path) if name in {heavy!r} else None
        if spec is not None:
            spec.loader = Loader()
        return spec

sys.meta_path.insert(0, Finder())
{statement}
print(None)
"""
"""Runs a statement until it starts loading one of :data:`HEAVY` (then stops: loading TensorFlow
whole would cost seconds and tell nothing more); prints that module's name, else ``None``."""


def first_heavy_module(statement: str) -> str | None:
    """The first of :data:`HEAVY` that a fresh interpreter starts loading while it runs ``statement``."""
    code = FIRST_HEAVY.format(heavy=HEAVY, statement=statement)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    return ast.literal_eval(out.stdout.strip())


def loaded_heavy_modules(statement: str) -> list[str]:
    """Which of TensorFlow, Keras, FAISS and pandas a fresh interpreter has loaded after ``statement``."""
    code = f"import sys; {statement}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    return list(ast.literal_eval(out.stdout.strip()))


@pytest.mark.parametrize(
    "module", ["retrieval.api", "retrieval.api.client", "retrieval.storage", "retrieval.cli.query"]
)
def test_a_grpc_client_is_light(module: str) -> None:
    assert loaded_heavy_modules(f"import {module}") == []


def test_the_data_layer_loads_no_tensorflow() -> None:
    loaded = loaded_heavy_modules("import retrieval.data, retrieval.data.prepared")
    assert "tensorflow" not in loaded and "keras" not in loaded
