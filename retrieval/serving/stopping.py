"""Bounded stops: a serving process that was asked to stop exits within a known time, whatever
is stuck in it.

A stop waits on many things: a drain, calls in flight, a deployment watcher's load, the
request threads that the interpreter joins at exit. Each is bounded where it is waited on, and
:class:`StopGuard` bounds them all together: its signal handlers only record the signal
(a handler runs between two bytecodes of the main thread, which may hold the very lock a stop
needs), and its daemon thread exits the process (code 1, an ERROR line) at a second SIGTERM or
SIGINT, or once the stop has outlived its deadline. :func:`exit_within` bounds the last steps
of a process whose stop is done.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, NoReturn, Self

__all__ = ["STOP_MARGIN", "StopGuard", "exit_now", "exit_within"]

logger = logging.getLogger(__name__)

STOP_MARGIN = 5.0
"""Seconds a stopping process gets beyond its drain and grace before it exits anyway."""

_TICK = 0.05
"""Seconds between two looks of a guard's thread at the signals and the deadline."""


def exit_now(reason: str, code: int = 1, cleanup: Callable[[], None] | None = None) -> NoReturn:
    """Logs ``reason`` as an error, runs ``cleanup``, and ends the process with ``code`` at
    once: no thread is joined, no ``atexit`` hook runs."""
    logger.error("%s: exiting now", reason)
    try:
        if cleanup is not None:
            cleanup()
    finally:
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def exit_within(seconds: float, code: int) -> None:
    """Ends the process with ``code`` if it is still running ``seconds`` from now: a thread
    stuck in a call, which the interpreter joins at exit, cannot keep it alive."""

    def wait_then_exit() -> None:
        time.sleep(seconds)
        exit_now(f"the process did not end within {seconds:.1f} s of its stop", code)

    threading.Thread(target=wait_then_exit, name="exit-within", daemon=True).start()


class StopGuard:
    """SIGTERM and SIGINT handlers that record the signal, and a daemon thread that ends the
    process at a second one, or once a stop outlives its deadline.

    The owner of the process reads :attr:`signals` and stops (outside the handler); the first
    signal, with ``budget``, arms the deadline ``budget`` seconds after it; :meth:`arm` arms it
    for a stop that no signal asked for. Leaving the ``with`` block restores the previous
    handlers and disarms the guard.

    Example:
        >>> with StopGuard(budget=grace + STOP_MARGIN) as guard:
        ...     while not guard.signals:
        ...         serve_a_little()
        ...     stop()
    """

    def __init__(self, budget: float | None = None, cleanup: Callable[[], None] | None = None) -> None:
        """``budget``: seconds the process may live after the first signal (``None``: only once
        armed); ``cleanup``: run before a forced exit (e.g. kill child processes)."""
        self.signals: list[tuple[int, float]] = []
        """``(signal number, time.monotonic())`` of each signal received, in order."""
        self._budget = budget
        self._cleanup = cleanup
        self._deadline: float | None = None
        self._closed = threading.Event()
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Self:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._record)
        threading.Thread(target=self._watch, name="stop-guard", daemon=True).start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closed.set()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append((signum, time.monotonic()))  # a list append never blocks

    @property
    def signal_name(self) -> str:
        """The first signal's name, e.g. ``"SIGTERM"`` (``""`` before any)."""
        return signal.Signals(self.signals[0][0]).name if self.signals else ""

    def arm(self, deadline: float) -> None:
        """Ends the process at ``deadline`` (a :func:`time.monotonic` time) if the guard is
        still in place then; the earliest deadline counts."""
        if self._deadline is None or deadline < self._deadline:
            self._deadline = deadline

    def _watch(self) -> None:
        while not self._closed.wait(_TICK):
            signals = list(self.signals)
            if len(signals) > 1:
                name = signal.Signals(signals[1][0]).name
                exit_now(f"{name} received while stopping", cleanup=self._cleanup)
            if signals and self._budget is not None:
                self.arm(signals[0][1] + self._budget)
            if self._deadline is not None and time.monotonic() >= self._deadline:
                exit_now("the stop did not finish in time", cleanup=self._cleanup)
