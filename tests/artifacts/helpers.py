"""Helpers of the artifact tests: child programs forked from one interpreter that has imported
TensorFlow once, for the kill -9 series that start a training or a deploy per run."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.helpers import REPO_ROOT

FORK_SERVER = """
import json, os, sys, traceback
sys.path.insert(0, {repo!r})
import retrieval.serving.preload  # TensorFlow, Keras, FAISS imported, no op run: safe to fork
def run(code, argv, out, err):
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the requests are the server's, not the child's
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.argv = ["-c", *argv]
    status = 0
    try:
        exec(compile(code, "<child>", "exec"), {{"__name__": "__main__"}})
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
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        run(*json.loads(line))
    print(pid, flush=True)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


class ForkedChild:
    """A child program forked by :class:`ForkServer`: the part of :class:`subprocess.Popen` the
    kill -9 tests use (``pid``, ``poll``, ``send_signal``, ``communicate``, ``returncode``)."""

    def __init__(self, pid: int, statuses: queue.Queue[int], out: Path, err: Path) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._statuses, self._out, self._err = statuses, out, err

    def poll(self) -> int | None:
        """The exit code (``-signal`` when killed), or None while it runs."""
        if self.returncode is None:
            with contextlib.suppress(queue.Empty):
                self.returncode = self._statuses.get_nowait()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def communicate(self, timeout: float) -> tuple[str, str]:
        """Waits (at most ``timeout`` s) for the exit; its ``(stdout, stderr)``."""
        if self.returncode is None:
            try:
                self.returncode = self._statuses.get(timeout=timeout)
            except queue.Empty:
                raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout) from None
        return self._out.read_text(), self._err.read_text()


class ForkServer:
    """An interpreter that imports what a serving worker imports (``retrieval.serving.preload``:
    TensorFlow, Keras, FAISS, NumPy, no op run) once, then forks each child program asked of it,
    one at a time: a child starts in ~0.02 s instead of the ~6 s of a fresh interpreter's imports.

    Example:
        >>> with ForkServer(tmp_path) as server:
        ...     child = server.start("import sys; print(sys.argv[1:])", "a", "b")
        ...     out, err = child.communicate(timeout=60)
    """

    def __init__(self, folder: Path) -> None:
        """``folder`` receives the children's stdout and stderr files, and the server's log."""
        self.folder = folder
        self._lines: queue.Queue[int] = queue.Queue()
        self._started = 0
        self._child: ForkedChild | None = None

    def __enter__(self) -> ForkServer:
        self._log = (self.folder / "fork-server.log").open("w")
        self._process = subprocess.Popen(
            [sys.executable, "-c", FORK_SERVER.format(repo=str(REPO_ROOT))],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(int(line))

    def start(self, code: str, *argv: str) -> ForkedChild:
        """Forks a child that runs ``code`` as ``python -c code *argv`` would, in the checkout.

        Raises:
            AssertionError: if the child before it still runs (one at a time).
        """
        assert self._child is None or self._child.poll() is not None, "the previous child still runs"
        assert self._process.stdin is not None
        self._started += 1
        out, err = (self.folder / f"child-{self._started}.{name}" for name in ("out", "err"))
        self._process.stdin.write(json.dumps([code, list(argv), str(out), str(err)]) + "\n")
        self._process.stdin.flush()
        pid = self._lines.get(timeout=60)
        self._child = ForkedChild(pid, self._lines, out, err)
        return self._child

    def run(self, code: str, *argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """:meth:`start`, then its exit: as :func:`subprocess.run` with ``capture_output``."""
        child = self.start(code, *argv)
        out, err = child.communicate(timeout)
        assert child.returncode is not None
        return subprocess.CompletedProcess(["-c", code, *argv], child.returncode, out, err)

    def __exit__(self, *exc: object) -> None:
        if self._child is not None:
            self._child.send_signal(signal.SIGKILL)  # a child left running by a failed test
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()
