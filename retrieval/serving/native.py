"""The native engine's Python side: :class:`NativeServer`, a C++ gRPC server (``native/``) serving a
:class:`~retrieval.serving.native_kernel.NativeServable` whose kernel it calls once per micro-batch.

The compiled module (``retrieval/serving/_native*.so``, built by ``make native``, never by ``pip
install``) is imported on first use, so importing this module needs nothing built; without it,
:func:`native_module` raises :class:`NativeEngineMissing`, whose message says what to run.

The C++ side takes every call through the Python engine's steps (docs/serving.md, "Admission"): the
call limit, the deadline, the caller's identity, permission and rate (the access file's identities
handed over by Python, again on each reload), the request read and parsed, its lengths, its cost
and admission (cheap calls micro-batched, heavy ones alone in chunks, within the heavy budget), its
checks and vocabulary lookups (the servable's vocabulary, categories and rankers, handed over once
per version), with the Python engine's messages. A worker thread forms batches and calls the
servable's kernel once per batch, holding the GIL only for it (:meth:`NativeKernel.search`: the
user tower and the index search); C++ then drops each row's excluded ids, merges (max-score,
round-robin, DIVERSITY with λ), reranks through the kernel's ranker, explains from the tower's
weights and answers with external ids. :meth:`NativeServer.swap` puts another version in service
between two calls; the calls already checked finish on theirs.

Example:
    >>> with NativeServer(native_servable(retriever)) as server:
    ...     RetrievalClient(f"127.0.0.1:{server.port}").retrieve(["B0001"], k=10)
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, Self, cast

import numpy as np

import retrieval.api.types as api_types
import retrieval.serving.admission as admission
from retrieval.serving.config import BatchingConfig, LimitsConfig, ServerConfig, TlsConfig
from retrieval.serving.memory import LARGE_REQUEST, trimmer
from retrieval.serving.metrics import BATCH_BUCKETS, LATENCY_BUCKETS

if TYPE_CHECKING:
    from retrieval.serving.access import AccessControl
    from retrieval.serving.auth import AccessFile, Identities
    from retrieval.serving.native_kernel import NativeServable
    from retrieval.serving.native_tls import CheckedCopies
    from retrieval.serving.reload import RetrieverSlot
    from retrieval.serving.retriever import Retriever

PACKAGES = ("libgrpc++-dev", "protobuf-compiler-grpc", "libprotobuf-dev", "cmake", "g++", "pkg-config")
"""The Debian packages ``make native`` installs when they are missing (and nanobind from PyPI)."""

LIMITS = {
    "max_k": api_types.MAX_K,
    "max_history": api_types.MAX_HISTORY,
    "max_per_interest_k": api_types.MAX_PER_INTEREST_K,
    "max_filter_ids": api_types.MAX_FILTER_IDS,
    "max_batch": api_types.MAX_BATCH,
    "max_user_id": api_types.MAX_USER_ID,
    "max_name": api_types.MAX_NAME,
    "default_rerank_candidates": api_types.DEFAULT_RERANK_CANDIDATES,
}
"""The API's limits as the engine checks them (their one definition is retrieval.api.types)."""

COST = {
    "id_unit": admission.ID_UNIT,
    "candidate_unit": admission.CANDIDATE_UNIT,
    "diversity_steps": admission.DIVERSITY_STEPS,
    "diversity_candidates": admission.DIVERSITY_CANDIDATES,
    "round_robin_picks": admission.ROUND_ROBIN_PICKS,
    "rerank_unit": admission.RERANK_UNIT,
    "explain_units": admission.EXPLAIN_UNITS,
}
"""The cost formula's constants (their one definition is retrieval.serving.admission)."""

MAX_QUEUE = 1024
"""Cheap queries waiting for a batch beyond which calls are refused (``batch_queue_full``): the
Python engine's micro-batcher's default (``MicroBatcher(max_queue=...)``; a test keeps them equal)."""

ACCESS_LOG_INTERVAL = 0.05
"""Seconds between two writes of the access log's lines (the engine keeps them meanwhile)."""

MAX_QUEUED = 128
"""Calls held at once when ``LimitsConfig.max_queued`` is 0 (the engine has no request threads
to count twice: the Python engine's default with its 64 threads)."""

__all__ = [
    "ACCESS_LOG_INTERVAL",
    "COST",
    "LIMITS",
    "MAX_QUEUE",
    "MAX_QUEUED",
    "PACKAGES",
    "NativeEngineMissing",
    "NativeServer",
    "check_native",
    "choose_engine",
    "native_module",
    "printable_table",
]


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


def _not_native(config: ServerConfig) -> dict[str, bool]:
    """Each option the native engine does not implement yet, named by its flag and key, and
    whether ``config`` sets it."""
    return {
        # No request threads: gRPC C++'s callback API runs no thread per call.
        "--threads (threads)": config.threads != ServerConfig().threads,
    }


def _unimplemented(config: ServerConfig) -> str | None:
    """The first option ``config`` sets that the native engine does not implement, if any."""
    return next((option for option, given in _not_native(config).items() if given), None)


def check_native(config: ServerConfig) -> None:
    """Checks that the native engine can serve ``config``: every option it sets is implemented,
    and the engine is built.

    Raises:
        ValueError: an option it does not implement yet (one line naming its flag and key, and
            ``--engine python``).
        NativeEngineMissing: the engine is not built.
    """
    option = _unimplemented(config)
    if option is not None:
        raise ValueError(f"the native engine does not implement {option} yet: serve with --engine python")
    native_module()


def choose_engine(config: ServerConfig) -> ServerConfig:
    """``config`` with the engine that serves it: ``auto`` becomes ``native`` where the engine is
    built and implements every option ``config`` sets, else ``python`` (logged with the reason);
    ``native`` is checked (:func:`check_native`); ``python`` stays.

    Raises:
        ValueError: ``native`` with an option it does not implement yet.
        NativeEngineMissing: ``native`` and the engine is not built.
    """
    if config.engine != "auto":
        if config.engine == "native":
            check_native(config)
        return config
    option = _unimplemented(config)
    try:
        if option is None:
            native_module()
            return dataclasses.replace(config, engine="native")
        why = f"the native engine does not implement {option}"
    except NativeEngineMissing as e:
        why = str(e)
    logging.getLogger(__name__).info("the Python engine serves (--engine auto): %s", why)
    return dataclasses.replace(config, engine="python")


def _identity_table(
    identities: Identities,
) -> list[tuple[str, list[str], float | None, float | None, list[bytes], list[str]]]:
    """An access file's identities as the engine takes them: ``(name, permissions, rate, burst,
    token SHA-256 digests, certificate names)`` each."""
    table: dict[str, tuple[str, list[str], float | None, float | None, list[bytes], list[str]]] = {}
    for credentials, field in ((identities.by_token, 4), (identities.by_certificate, 5)):
        for credential, identity in credentials.items():
            entry = table.setdefault(
                identity.name,
                (identity.name, sorted(identity.permissions), identity.rate, identity.burst, [], []),
            )
            cast(list[Any], entry[field]).append(credential)
    return list(table.values())


def _checked_copies(tls: TlsConfig | None) -> CheckedCopies | None:
    """The copies of ``tls``'s files the engine reads (:mod:`~retrieval.serving.native_tls`);
    ``None`` for plaintext.

    Raises:
        OSError: a file cannot be read.
        ValueError: the files do not load together.
    """
    if tls is None or tls.cert is None or tls.key is None:
        return None
    from retrieval.serving.native_tls import CheckedCopies

    return CheckedCopies(Path(tls.cert), Path(tls.key), None if tls.ca is None else Path(tls.ca))


@functools.cache
def printable_table() -> bytes:
    """One bit per code point (little-endian within each byte), set where ``str.isprintable``
    holds: the engine quotes client strings in its messages as Python's ``repr`` does, with
    Python's Unicode database."""
    printable = [chr(c).isprintable() for c in range(0x110000)]
    return np.packbits(np.array(printable, bool), bitorder="little").tobytes()


@functools.cache
def code_names() -> dict[int, str]:
    """A gRPC status code's number -> its name: the metrics' ``code`` label and the access log's
    ``code`` (gRPC is imported on first use: the group supervisor loads this module too)."""
    import grpc

    return {code.value[0]: code.name for code in grpc.StatusCode}


class NativeServer:
    """A native gRPC server for ``retrieval.v1.RetrievalService`` (``Retrieve``, ``BatchRetrieve``,
    ``GetModelInfo``), gRPC health (``SERVING`` once started) and server reflection.

    Example:
        >>> server = NativeServer(native_servable(retriever))
        >>> port = server.start("127.0.0.1:0")
        >>> server.stop(grace=5.0)
    """

    def __init__(
        self,
        servable: NativeServable,
        *,
        batching: BatchingConfig | None = None,
        limits: LimitsConfig | None = None,
        access: AccessControl | None = None,
        reflection: bool = True,
        tls: TlsConfig | None = None,
    ) -> None:
        """Hands the servable over to the engine (nothing is served yet).

        Args:
            servable: the version to serve (:func:`~retrieval.serving.native_kernel.native_servable`).
            batching: the micro-batches' bounds (``max_batch`` queries per kernel call, a larger
                ``BatchRetrieve`` being one batch; ``max_wait_ms``); ``None`` for the defaults.
            limits: what one call may cost: the message sizes, the calls held at once
                (``max_queued``, 0 = :data:`MAX_QUEUED`) and the cost admission's bounds; ``None``
                for the defaults.
            access: who may call and how often: its access file's identities (re-read while
                serving, :meth:`AccessFile.check` in a thread of the engine's) and its rate limit's
                rate and burst, checked by the engine with its own buckets; ``None``: anyone,
                anything, no limit; its access log's lines are written every
                :data:`ACCESS_LOG_INTERVAL` seconds.
            reflection: serve gRPC server reflection (its calls checked as the retrieval
                service's, from their metadata, with ``access``).
            tls: the PEM files of TLS (with ``ca``: mutual TLS, client certificates required), read
                again when they change (new connections get the new certificate; files that do not
                load together are not taken, :mod:`~retrieval.serving.native_tls`); ``None`` or no
                ``cert``: plaintext.

        Raises:
            NativeEngineMissing: the engine is not built.
            ValueError: a repeated vocabulary id, an inconsistent servable, TLS files that do not
                load together.
            OSError: a TLS file cannot be read.
        """
        from retrieval.serving.auth import METHOD_PERMISSIONS

        batching = batching or BatchingConfig()
        limits = limits or LimitsConfig()
        rate_limit = None if access is None or access.rate_limit is None else access.rate_limit
        log = None if access is None else access.access_log
        self._tls = _checked_copies(tls)
        options: dict[str, Any] = {
            "limits": LIMITS,
            "cost": COST,
            "admission": {
                "cheap_cost": limits.cheap_cost,
                "batch_cost": limits.batch_cost,
                "cheap_bytes": limits.cheap_bytes,
                "max_cost": limits.max_cost,
                "max_waiting": limits.max_waiting,
                "heavy_wait": limits.heavy_wait,
                "chunk_cost": limits.chunk_cost,
                "max_memory_bytes": limits.max_memory_bytes or 0,
            },
            "access": {
                "rate_limit": None if rate_limit is None else (rate_limit.rate, rate_limit.burst),
                "method_permissions": METHOD_PERMISSIONS,
            },
            "max_batch": batching.max_batch,
            "max_wait_us": round(batching.max_wait * 1e6),
            "max_queue": MAX_QUEUE,
            "max_queued": limits.max_queued or MAX_QUEUED,
            "reflection": reflection,
            "access_log": None if log is None else (log.sample, log.user_ids),
            "tls": None if self._tls is None else self._tls.files(),
            "large_request_bytes": LARGE_REQUEST,
            "max_request_bytes": limits.max_request_bytes,
            "max_response_bytes": limits.max_response_bytes,
            "explain_top": api_types.EXPLAIN_TOP,
            "printable": printable_table(),
            "latency_buckets": [float(b) for b in LATENCY_BUCKETS],
            "batch_buckets": [float(b) for b in BATCH_BUCKETS],
        }
        try:
            self._server = native_module().NativeServer(servable, options)
        except BaseException:
            if self._tls is not None:
                self._tls.remove()
            raise
        self._info_lock = threading.Lock()
        self._model_info = servable.model_info
        self._access_file_error = ""
        self._stopping = threading.Event()
        self.set_model_info(servable.model_info)
        if access is not None and access.identities is not None:
            self._follow_access(access.identities)
        if self._tls is not None:
            self._every(1.0, self._tls.check, "native-tls")
        self._access_log = log
        if log is not None:
            self._every(ACCESS_LOG_INTERVAL, self._write_access_log, "native-access-log")
        # The handover's copies (a million ids at 1M items) are freed: give their pages back, and
        # fix glibc's mmap threshold as the Python engine's server does (large requests).
        self._trimmer = trimmer()
        self._trimmer.trim()
        # Stopped at the latest when the interpreter exits: the batcher's thread must not be
        # waiting for the GIL of an interpreter being torn down.
        self._finalizer = weakref.finalize(self, self._server.stop, 0.0)

    def start(
        self, address: str | Sequence[str] = "127.0.0.1:0", *, serving: bool = True, reuse_port: bool = False
    ) -> int:
        """Binds ``address`` (port 0: a free port), or every one of several (all or none, on one
        port), and serves; returns the bound port.

        Args:
            serving: report SERVING on the health service at once; ``False`` leaves it
                NOT_SERVING until :meth:`set_serving` (a serving group's worker waits for its group).
            reuse_port: share the port with other servers that set it (``SO_REUSEPORT``: a
                serving group's workers); without it a port already served is refused.

        Raises:
            RuntimeError: an address cannot be bound, or the server was started before.
        """
        addresses = [address] if isinstance(address, str) else list(address)
        return int(self._server.start(addresses, serving, reuse_port))

    def start_health(self, address: str | Sequence[str], *, reuse_port: bool = False) -> int:
        """Also serves the health service alone, in plaintext, on ``address`` (or every one of
        several, all or none, on one port), with the main port's status, until :meth:`stop`:
        for probes that cannot present a client certificate. Returns the bound port.

        Raises:
            RuntimeError: an address cannot be bound (the server keeps serving), or the server is
                not serving.
        """
        addresses = [address] if isinstance(address, str) else list(address)
        return int(self._server.start_health(addresses, reuse_port))

    @property
    def health_port(self) -> int:
        """The bound health port (0 without one)."""
        return int(self._server.health_port)

    def set_serving(self, serving: bool) -> None:
        """Sets the health status of the server and of the retrieval service (not once stopping)."""
        self._server.set_serving(serving)

    @property
    def port(self) -> int:
        """The bound port (0 before :meth:`start`)."""
        return int(self._server.port)

    def swap(self, servable: NativeServable) -> None:
        """Serves ``servable`` from the next call on (hot reload); the calls already checked
        finish on the version they were checked with.

        Raises:
            ValueError: a repeated vocabulary id, an inconsistent servable.
        """
        with self._info_lock:
            self._model_info = servable.model_info
            self._server.swap(servable, *self._model_infos())
        self._trimmer.trim()

    def follow(self, slot: RetrieverSlot, search_threads: int | None = 1) -> None:
        """Keeps serving what ``slot`` serves (hot reload): each swap of the slot (a
        :class:`~retrieval.serving.reload.DeploymentWatcher`'s) hands the engine the new version,
        each refused version the ``ModelInfo`` that counts it. The engine should serve the slot's
        current version already (``NativeServer(native_servable(slot.current, slot.model_info()))``).

        Args:
            search_threads: FAISS's threads per search of each new version's kernel.
        """
        from retrieval.api.convert import model_info_message
        from retrieval.serving.native_kernel import native_servable

        def swapped(old: Retriever, new: Retriever) -> None:
            self.swap(native_servable(new, slot.model_info(), search_threads))
            self._trimmer.trim()  # the servable's Python vocabulary is gone by now

        def refused(folder: Path, reason: str) -> None:
            self.set_model_info(model_info_message(slot.model_info()).SerializeToString())

        slot.on_swap(swapped)
        slot.on_refuse(refused)

    def set_model_info(self, model_info: bytes) -> None:
        """What ``GetModelInfo`` answers from now on (a serialized ``ModelInfo``: the same version
        with a refused reload counted, say), with the access file's error as the Python engine
        sets it (:meth:`_model_infos`)."""
        with self._info_lock:
            self._model_info = model_info
            self._server.set_model_info(*self._model_infos())

    def _model_infos(self) -> tuple[bytes, bytes]:
        """``GetModelInfo``'s answers, as the Python engine's servicer makes them: the model info
        with ``access_file_error`` (why the access file in force is stale), whole for callers with
        the ``admin`` permission (every caller without an access file), and as the others see it
        (``last_refusal`` and ``access_file_error`` cut by ``public_refusal``)."""
        from retrieval.api.v1 import retrieval_pb2
        from retrieval.serving.server import public_refusal

        info = retrieval_pb2.ModelInfo.FromString(self._model_info)
        info.access_file_error = self._access_file_error
        whole = info.SerializeToString()
        info.last_refusal = public_refusal(info.last_refusal)
        info.access_file_error = public_refusal(info.access_file_error)
        return whole, info.SerializeToString()

    def _follow_access(self, access_file: AccessFile) -> None:
        """Serves ``access_file``'s identities, and after each change of the file those in force
        (a change not applied keeps the last good file's and sets ``access_file_error``), read by
        a thread checking the file every ``check_interval`` seconds until :meth:`stop`."""

        def read(applied: bool) -> None:
            if applied:
                self._server.set_identities(_identity_table(access_file.identities))
            with self._info_lock:
                self._access_file_error = access_file.stale or ""
                self._server.set_model_info(*self._model_infos())

        access_file.on_reload(read)
        read(True)

        self._every(access_file.check_interval, access_file.check, "native-access-file")

    def _write_access_log(self) -> None:
        """Writes the lines of the calls the engine logged since the last time, as the Python
        engine writes them (:class:`~retrieval.serving.access_log.AccessLog`)."""
        from retrieval.serving.access_log import logger

        log = self._access_log
        assert log is not None
        records, dropped = self._server.access_records()
        for rid, identity, method, read, history_len, k, batch, users, code, seconds, version in records:
            fields: dict[str, Any] = {"request_id": rid, "identity": identity, "method": method}
            if read:
                fields.update(history_len=history_len, k=k, **({} if batch is None else {"batch": batch}))
                if log.user_ids:
                    fields["user_id"] = users if batch is not None else users[0]
            fields["code"] = code_names()[code]
            fields["latency_ms"] = round(seconds * 1000, 3)
            fields["model_version"] = version
            log.write(fields)
        if dropped:
            logger.warning("%d access log lines dropped: the log was not written fast enough", dropped)

    def _every(self, interval: float, check: Callable[[], None], name: str) -> None:
        """Calls ``check`` every ``interval`` seconds in a thread called ``name``, until :meth:`stop`."""

        def every(stopping: threading.Event) -> None:
            while not stopping.wait(interval):
                check()

        threading.Thread(target=every, args=(self._stopping,), name=name, daemon=True).start()

    def stop(self, grace: float = 5.0) -> None:
        """Reports NOT_SERVING, takes no new calls, lets the calls in flight finish for ``grace``
        seconds, cancels the rest; returns when all are finished. Idempotent."""
        self._stopping.set()
        self._server.stop(grace)
        if self._access_log is not None:
            self._write_access_log()  # the last calls' lines
        if self._tls is not None:
            self._tls.remove()

    def counters(self) -> dict[str, int]:
        """``calls``, ``rows`` (queries) and ``batches`` (kernel calls) answered, the largest
        batch's rows (``max_batch_rows``), ``kernel_errors``, ``cancelled`` calls, rows answered
        ``alone`` (their batched search came back short), calls past their ``deadline_exceeded``
        while computing; the queries ``queued`` for a batch now; and the nanoseconds spent in
        each stage since the start (wall time on the thread running it): requests parsed
        (``parse_ns``), checked and looked up (``checks_ns``), batches' kernel calls
        (``kernel_ns``), merges (``merge_ns``), answers built and serialised (``response_ns``)."""
        return dict(self._server.counters())

    def metrics(self) -> dict[str, Any]:
        """Everything the engine counted since it started, as the metrics endpoint exports it
        (:class:`~retrieval.serving.native_metrics.NativeMetrics` reads it): ``latency``
        ``(method, code number) -> (bucket counts, sum of seconds)`` over ``LATENCY_BUCKETS``
        then +inf, ``refusals`` ``(method, code number, reason, identity) -> calls``
        (reason ``""``: the code's name; identity ``""``: none known), ``batches`` ``(bucket
        counts, sum of rows)`` over ``BATCH_BUCKETS`` then +inf, and ``queues`` ``{"calls",
        "batch", "heavy"} -> depth now``."""
        return dict(self._server.metrics())

    def __enter__(self) -> Self:
        if not self.port:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
