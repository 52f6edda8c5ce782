"""The native engine's Python side: :class:`NativeServer`, a C++ gRPC server (``native/``) that
calls a Python batch kernel once per micro-batch.

The compiled module (``retrieval/serving/_native*.so``, built by ``make native``, never by ``pip
install``) is imported on first use, so importing this module needs nothing built; without it,
:func:`native_module` raises :class:`NativeEngineMissing`, whose message says what to run.

The C++ side parses and checks each ``Retrieve``/``BatchRetrieve`` request, looks its history up in
the vocabulary handed over once, and queues it; a worker thread forms batches (up to
``max_batch`` queries, waiting at most ``max_wait_us`` for them) and makes one call of the kernel
per batch, holding the GIL only for it::

    kernel(histories int32 [B, L], fetch int32 [B]) -> (ids int64 [B, K, n], scores float32 [B, K, n])

``histories`` are the queries' known dense ids (``vocabulary[i]`` is id ``i + 1``), the last
``max_len`` of each, left-padded with 0; ``fetch[b]`` is how many candidates each interest of
query ``b`` needs (``max(k, per_interest_k)`` plus its excluded ids). The kernel answers per
interest its candidates best first (id -1: an empty slot), as C-contiguous arrays of those
dtypes (others are converted, at tens of microseconds per batch); C++ then merges them (max
score, the history and ``exclude_ids`` dropped, top-k, as :func:`index.merge.max_score`) and
answers with external ids. Fields it does not answer yet are refused with ``UNIMPLEMENTED`` naming the
field and ``--engine python``.

Example:
    >>> def kernel(histories, fetch):
    ...     return ids, scores  # e.g. the user tower and one FAISS search
    >>> with NativeServer(kernel, vocabulary, max_len=50) as server:
    ...     RetrievalClient(f"127.0.0.1:{server.port}").retrieve(["B0001"], k=10)
"""

from __future__ import annotations

import importlib
import os
import sys
import weakref
from collections.abc import Callable, Sequence
from types import ModuleType, TracebackType
from typing import Self

import numpy as np

from retrieval.api.types import MAX_BATCH, MAX_FILTER_IDS, MAX_HISTORY, MAX_K, MAX_PER_INTEREST_K, MAX_USER_ID

PACKAGES = ("libgrpc++-dev", "protobuf-compiler-grpc", "libprotobuf-dev", "cmake", "g++", "pkg-config")
"""The Debian packages ``make native`` installs when they are missing (and nanobind from PyPI)."""

Kernel = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
"""``(histories int32 [B, L], fetch int32 [B]) -> (ids int64 [B, K, n], scores float32 [B, K, n])``."""

LIMITS = {
    "max_k": MAX_K,
    "max_history": MAX_HISTORY,
    "max_per_interest_k": MAX_PER_INTEREST_K,
    "max_filter_ids": MAX_FILTER_IDS,
    "max_batch": MAX_BATCH,
    "max_user_id": MAX_USER_ID,
}
"""The API's limits as the engine checks them (their one definition is retrieval.api.types)."""

__all__ = ["LIMITS", "PACKAGES", "Kernel", "NativeEngineMissing", "NativeServer", "native_module"]


class NativeEngineMissing(RuntimeError):
    """The compiled module is not built (or does not load); the message says what to run."""


def native_module() -> ModuleType:
    """The compiled module ``retrieval.serving._native``.

    Raises:
        NativeEngineMissing: it is not built, or does not load (one line: run ``make native``,
            which needs :data:`PACKAGES`; and why the import failed).
    """
    # RTLD_DEEPBIND: the module's references to the shared libraries it needs (Debian's protobuf,
    # re2, Abseil, OpenSSL, zlib) bind to those, never to the copies TensorFlow exports into the
    # process's global scope (it loads some of its libraries with RTLD_GLOBAL; protobuf calls
    # bound to its copy crash). gRPC itself is linked in, hidden (native/README.md).
    flags = sys.getdlopenflags()
    sys.setdlopenflags(os.RTLD_NOW | os.RTLD_LOCAL | os.RTLD_DEEPBIND)
    try:
        return importlib.import_module("retrieval.serving._native")
    except ImportError as e:
        raise NativeEngineMissing(
            f"the native engine is not built ({e}): run `make native` (it installs the Debian "
            f"packages {' '.join(PACKAGES)} when missing)"
        ) from None
    finally:
        sys.setdlopenflags(flags)


class NativeServer:
    """A native gRPC server for ``retrieval.v1.RetrievalService`` (``Retrieve``, ``BatchRetrieve``),
    gRPC health (``SERVING`` once started) and server reflection.

    Example:
        >>> server = NativeServer(kernel, ["B0001", "B0042"], max_len=50)
        >>> port = server.start("127.0.0.1:0")
        >>> server.stop(grace=5.0)
    """

    def __init__(
        self,
        kernel: Kernel,
        vocabulary: Sequence[str],
        *,
        max_len: int,
        model_version: str = "",
        max_batch: int = 32,
        max_wait_us: int = 0,
    ) -> None:
        """Hands the kernel and the vocabulary over to the engine (nothing is served yet).

        Args:
            kernel: called once per batch, see :data:`Kernel`.
            vocabulary: the external item ids; dense id ``i + 1`` is ``vocabulary[i]`` (0 is padding).
            max_len: the width ``L`` of the histories handed to the kernel.
            model_version: reported in every response.
            max_batch: queries per kernel call at most (a larger ``BatchRetrieve`` is one batch).
            max_wait_us: how long a batch waits for more queries after its first (0: the queries
                queued while the previous batch computed form the next one, no waiting).

        Raises:
            NativeEngineMissing: the engine is not built.
            ValueError: a repeated vocabulary id, ``max_len``/``max_batch`` < 1 or ``max_wait_us`` < 0.
        """
        self._server = native_module().NativeServer(
            kernel, list(vocabulary), max_len, model_version, LIMITS, max_batch, max_wait_us
        )
        # Stopped at the latest when the interpreter exits: the batcher's thread must not be
        # waiting for the GIL of an interpreter being torn down.
        self._finalizer = weakref.finalize(self, self._server.stop, 0.0)

    def start(self, address: str = "127.0.0.1:0") -> int:
        """Binds ``address`` (port 0: a free port) and serves; returns the bound port.

        Raises:
            RuntimeError: it cannot bind, or was started before.
        """
        return int(self._server.start(address))

    @property
    def port(self) -> int:
        """The bound port (0 before :meth:`start`)."""
        return int(self._server.port)

    def stop(self, grace: float = 5.0) -> None:
        """Reports NOT_SERVING, takes no new calls, lets the calls in flight finish for ``grace``
        seconds, cancels the rest; returns when all are finished. Idempotent."""
        self._server.stop(grace)

    def counters(self) -> dict[str, int]:
        """``calls``, ``rows`` (queries) and ``batches`` (kernel calls) answered, the largest
        batch's rows (``max_batch_rows``), ``kernel_errors`` and ``cancelled`` calls; and the queries
        ``queued`` for a batch now."""
        return dict(self._server.counters())

    def __enter__(self) -> Self:
        if not self.port:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
