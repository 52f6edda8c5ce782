"""The server's resident memory: measured, and given back to the system after large requests.

A request of a few MiB is parsed into many small allocations on whichever request thread got
it; glibc keeps the freed memory in that thread's arena, so a burst of large requests (even
refused ones) would leave the server hundreds of MiB larger for good. Two glibc settings undo
that: a fixed mmap threshold (large buffers are mapped and unmapped, never kept in the heap;
glibc otherwise raises the threshold after each large free) and ``malloc_trim`` once large
requests have passed. Elsewhere (musl, macOS) both are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

__all__ = ["MemoryTrimmer", "resident_bytes", "trimmer"]

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 128 * 1024
"""Allocations from this size are mapped on their own and unmapped when freed (glibc's
initial default, kept fixed)."""

LARGE_REQUEST = 1 << 20
"""Requests from this size (bytes) make the trimmer run after them."""


def resident_bytes() -> int | None:
    """This process's resident memory in bytes (Linux ``/proc``); ``None`` where unknown."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


class MemoryTrimmer:
    """Gives memory back after large requests: :meth:`note` each request's size; a daemon
    thread trims the heap ``delay`` seconds after the last large one (so a burst is trimmed
    once). Creating one fixes glibc's mmap threshold for the process: servers share the
    process's one, :func:`trimmer`."""

    def __init__(self, delay: float = 0.2) -> None:
        self._libc = _glibc()
        self._delay = delay
        self._large = threading.Event()
        if self._libc is not None:
            self._libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            threading.Thread(target=self._run, name="memory-trimmer", daemon=True).start()

    def note(self, size: int) -> None:
        """Records a request of ``size`` bytes (cheap: sets an event for large ones)."""
        if size >= LARGE_REQUEST and self._libc is not None:
            self._large.set()

    def trim(self) -> None:
        """Returns the heap's free memory to the system now."""
        if self._libc is not None:
            self._libc.malloc_trim(0)

    def _run(self) -> None:
        while True:
            self._large.wait()
            self._large.clear()
            while self._large.wait(self._delay):  # still arriving: wait for the burst to end
                self._large.clear()
            self.trim()


_TRIMMER: MemoryTrimmer | None = None
_TRIMMER_LOCK = threading.Lock()


def trimmer() -> MemoryTrimmer:
    """The process's one :class:`MemoryTrimmer` (created on first use)."""
    global _TRIMMER
    with _TRIMMER_LOCK:
        if _TRIMMER is None:
            _TRIMMER = MemoryTrimmer()
        return _TRIMMER
