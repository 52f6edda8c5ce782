"""Helpers of the artifact tests: child programs forked from one interpreter that has imported
TensorFlow once, for the kill -9 series that start a training or a deploy per run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import traceback
from multiprocessing.process import BaseProcess
from pathlib import Path

from retrieval.serving.group import worker_context
from tests.helpers import REPO_ROOT


def run_child(code: str, argv: list[str], out: str, err: str) -> None:
    """In the forked child: ``python -c code *argv`` in the checkout, its stdout and stderr to the
    files ``out`` and ``err``; exits with the program's status."""
    os.chdir(REPO_ROOT)
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.argv = ["-c", *argv]
    status = 0
    try:
        exec(compile(code, "<child>", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


class ForkedChild:
    """A child program forked by :class:`ForkServer`: the part of :class:`subprocess.Popen` the
    kill -9 tests use (``pid``, ``poll``, ``send_signal``, ``communicate``, ``returncode``)."""

    def __init__(self, process: BaseProcess, out: Path, err: Path) -> None:
        assert process.pid is not None, "not started"
        self.pid: int = process.pid
        self._process, self._out, self._err = process, out, err

    @property
    def returncode(self) -> int | None:
        """The exit code (``-signal`` when killed), or None while it runs."""
        return self._process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def communicate(self, timeout: float) -> tuple[str, str]:
        """Waits (at most ``timeout`` s) for the exit; its ``(stdout, stderr)``."""
        self._process.join(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout)
        return self._out.read_text(), self._err.read_text()


class ForkServer:
    """Child programs forked by multiprocessing's fork server as the serving group's workers are
    (:func:`retrieval.serving.group.worker_context`: an interpreter that has imported
    ``retrieval.serving.preload``, TensorFlow, Keras, FAISS and NumPy, no op run), one at a time:
    a child starts in ~0.02 s instead of the ~6 s of a fresh interpreter's imports.

    Example:
        >>> server = ForkServer(tmp_path)
        >>> child = server.start("import sys; print(sys.argv[1:])", "a", "b")
        >>> out, err = child.communicate(timeout=60)
    """

    def __init__(self, folder: Path) -> None:
        """``folder`` receives the children's stdout and stderr files."""
        self.folder = folder
        self._context = worker_context()
        self._started = 0
        self._child: ForkedChild | None = None

    def start(self, code: str, *argv: str) -> ForkedChild:
        """Forks a child that runs ``code`` as ``python -c code *argv`` would, in the checkout.

        Raises:
            AssertionError: if the child before it still runs (one at a time).
        """
        assert self._child is None or self._child.poll() is not None, "the previous child still runs"
        self._started += 1
        out, err = (self.folder / f"child-{self._started}.{name}" for name in ("out", "err"))
        process = self._context.Process(target=run_child, args=(code, list(argv), str(out), str(err)))
        process.start()
        self._child = ForkedChild(process, out, err)
        return self._child

    def run(self, code: str, *argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """:meth:`start`, then its exit: as :func:`subprocess.run` with ``capture_output``."""
        child = self.start(code, *argv)
        out, err = child.communicate(timeout)
        assert child.returncode is not None
        return subprocess.CompletedProcess(["-c", code, *argv], child.returncode, out, err)

    def close(self) -> None:
        """SIGKILLs a child left running (by a failed test)."""
        if self._child is not None and self._child.poll() is None:
            self._child.send_signal(signal.SIGKILL)
            self._child.communicate(timeout=60)
