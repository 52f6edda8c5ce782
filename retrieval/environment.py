"""How loud TensorFlow is in a process: quiet for the tools, unless they are asked to be verbose;
and, for the native engine, how many threads it runs a graph on (:func:`single_threaded_tensorflow`).

TensorFlow writes C++ log lines to the process's stderr: on import, absl's notice "WARNING: All
log messages before absl::InitializeLog() is called are written to STDERR" and
"I0000 ... port.cc:153] oneDNN custom operations are on ..." (twice: two of its shared libraries
log them as they load), the CPU-features line; later XLA and runtime INFO/WARNING lines.
``TF_CPP_MIN_LOG_LEVEL=2`` hides all of them but the first two, which are logged while the
libraries load, before TensorFlow reads the variable (measured with TensorFlow 2.21: levels 1,
2 and 3 all keep them; absl reads no environment variable; ``TF_ENABLE_ONEDNN_OPTS=0`` would
silence the oneDNN line only by changing the kernels, so it is not used). So
:func:`quiet_tensorflow` also runs TensorFlow's first import with stderr captured, and writes
back every captured line but those the level hides.

Nothing here imports TensorFlow, and importing this module changes nothing: a tool calls
:func:`quiet_tensorflow` after parsing its arguments, before it imports the library.

Example:
    >>> quiet_tensorflow(verbose=False)  # doctest: +SKIP
    >>> import tensorflow  # no oneDNN or absl lines; its errors still show
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType

__all__ = [
    "LOG_LEVEL_ENV",
    "QUIET_LOG_LEVEL",
    "THREADS_ENV",
    "VERBOSE_HELP",
    "progress_verbosity",
    "quiet_tensorflow",
    "shown_log_lines",
    "single_threaded_tensorflow",
]

LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
"""TensorFlow's variable: C++ log lines below this severity are dropped (0 INFO, 1 WARNING,
2 ERROR, 3 FATAL)."""

QUIET_LOG_LEVEL = 2
"""The level of a quiet tool: errors only."""

VERBOSE_HELP = "TensorFlow's own log lines, as it prints them (default: its errors only)"
"""The help of the tools' ``--verbose`` flag, which they pass to :func:`quiet_tensorflow`."""

ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# absl's prefix: severity, MMDD hh:mm:ss.micros, thread, file:line]. Before absl is initialised, the
# date is 0000 and the seconds count from the epoch: "I0000 00:00:1796306716.951228 26527 port.cc:153] ".
ABSL_LINE = re.compile(r"([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^\]\s]+\] ")
SEVERITIES = "IWEF"

PYTHON_LOGGERS = ("absl", "tensorflow")
"""TensorFlow's Python loggers: their INFO lines (a SavedModel's "Function `endpoint` contains input
name(s) ...", "Assets written to ...") are dropped from a quiet tool's log."""


def quiet_tensorflow(verbose: bool = False) -> None:
    """Keeps TensorFlow's C++ logging to errors, its start-up lines included, and its Python
    loggers (:data:`PYTHON_LOGGERS`) to warnings; ``verbose``: leaves both at TensorFlow's
    defaults (changes nothing).

    Sets ``TF_CPP_MIN_LOG_LEVEL`` to 2 unless the environment sets it already (the user's
    setting wins), and has the first import of TensorFlow, if it is still to come, drop the
    start-up lines below that level. Call it before TensorFlow is first imported: once it is,
    the level can no longer change.
    """
    if verbose:
        return
    for name in PYTHON_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    level = _parse_level(os.environ.setdefault(LOG_LEVEL_ENV, str(QUIET_LOG_LEVEL)))
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietImport(level))


THREADS_ENV = ("TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS")
"""TensorFlow's variables: the threads of its pool running a graph's ops, and of the pool splitting
one op's work; each defaults to the number of cores."""


def single_threaded_tensorflow() -> None:
    """Has TensorFlow run each graph on one inter-op and one intra-op thread (:data:`THREADS_ENV`
    set to 1 unless the environment sets them already: the user's setting wins). Call it before
    TensorFlow runs its first op, which makes its thread pools; a child process inherits it.

    The native engine calls the user tower from one thread per process, as FAISS searches on one
    thread (``search_threads``): pools of one thread per core only add hand-offs and spin-waiting
    there. Measured at 1M items, batches of 32: the tower's CPU per request 0.046-0.048 ms on one
    thread each, 0.064-0.088 ms with the default pools (2 cores), the same outputs bit for bit
    (docs/benchmarks.md, "The native engine").
    """
    for name in THREADS_ENV:
        os.environ.setdefault(name, "1")


def progress_verbosity(quiet: bool) -> int:
    """Keras's ``verbose`` for a tool's training: 0 when ``quiet``; its progress bar (1) only on a
    terminal, else one line per epoch (2): a redirected log gets no carriage-return redraws."""
    if quiet:
        return 0
    return 1 if sys.stdout.isatty() else 2


def shown_log_lines(text: str, level: int) -> str:
    """The lines of ``text`` (what TensorFlow's import wrote to stderr) that log level ``level``
    keeps: absl's notice and absl-formatted lines below ``level`` go, every other line stays."""
    if level <= 0:
        return text
    kept = []
    for line in text.splitlines(keepends=True):
        match = ABSL_LINE.match(line)
        if line.rstrip("\r\n") == ABSL_NOTICE or (match and SEVERITIES.index(match[1]) < level):
            continue
        kept.append(line)
    return "".join(kept)


def _parse_level(value: str) -> int:
    """The level TensorFlow reads from ``value`` (like its parser, 0 for anything not a number)."""
    match = re.match(r"\s*[-+]?\d+", value)
    return int(match[0]) if match else 0


class _QuietImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: gives the first import of ``tensorflow`` a loader that runs it with
    stderr filtered, then leaves ``sys.meta_path`` (the other imports are TensorFlow's own)."""

    def __init__(self, level: int) -> None:
        self.level = level

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader, self.level)
        return spec


class _QuietLoader(importlib.abc.Loader):
    """Runs a module's loader with stderr filtered by :func:`shown_log_lines`; the module keeps
    the original loader."""

    def __init__(self, loader: importlib.abc.Loader, level: int) -> None:
        self.loader, self.level = loader, level

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        with _filtered_stderr(self.level):
            self.loader.exec_module(module)


@contextmanager
def _filtered_stderr(level: int) -> Iterator[None]:
    """Captures file descriptor 2 (where C++ code writes, whatever ``sys.stderr`` is) during the
    block, then writes back what ``level`` keeps, even when the block fails."""
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to capture
        yield
        return
    with tempfile.TemporaryFile() as captured:
        _flush_stderr()
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            _flush_stderr()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            shown = shown_log_lines(captured.read().decode(errors="replace"), level)
            if shown:
                with open(2, "wb", closefd=False) as stderr:
                    stderr.write(shown.encode())


def _flush_stderr() -> None:
    """Writes out what Python holds for stderr, so it lands on the right side of the capture."""
    if sys.stderr is not None:
        sys.stderr.flush()
