"""Prometheus metrics of one server, in their own registry, served over HTTP (optionally behind
basic authentication); a serving group's (:mod:`retrieval.serving.group`) summed over its workers
by prometheus_client's multiprocess mode."""

from __future__ import annotations

import base64
import hmac
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

if TYPE_CHECKING:  # a group's supervisor imports this module without the serving stack
    from retrieval.serving.auth import AccessFile
    from retrieval.serving.reload import RetrieverSlot
    from retrieval.serving.retriever import Retriever

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
"""Upper bounds (seconds) of ``retrieval_request_seconds``' buckets (the native engine's too)."""
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Upper bounds of ``retrieval_batch_size``'s buckets (the native engine's too)."""


@dataclass(frozen=True)
class BasicAuth:
    """The user and password of HTTP basic authentication.

    Example:
        >>> BasicAuth.parse("prometheus:s3cret").user
        'prometheus'
    """

    user: str
    password: str = field(repr=False)

    @classmethod
    def parse(cls, text: str, source: str = "credentials") -> BasicAuth:
        """Reads ``user:password`` (surrounding whitespace ignored), as a file or variable holds it.

        Raises:
            ValueError: no ``:``, or an empty user or password.
        """
        user, colon, password = text.strip().partition(":")
        if not (colon and user and password):
            raise ValueError(f"{source}: expected user:password")
        return cls(user, password)

    def allows(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries these credentials (compared in constant time)."""
        scheme, _, encoded = (header or "").partition(" ")
        try:
            given = base64.b64decode(encoded.strip(), validate=True)
        except ValueError:
            return False
        expected = f"{self.user}:{self.password}".encode()
        return scheme.lower() == "basic" and hmac.compare_digest(given, expected)

    def protect(self, app: WsgiApp) -> WsgiApp:
        """``app`` answering 401 to requests without these credentials."""

        def protected(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            if self.allows(environ.get("HTTP_AUTHORIZATION")):
                return app(environ, start_response)
            start_response(
                "401 Unauthorized",
                [("WWW-Authenticate", 'Basic realm="metrics"'), ("Content-Type", "text/plain")],
            )
            return [b"401 Unauthorized\n"]

        return protected


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Logs nothing: scrapes every few seconds would flood the log."""


class _HttpEndpoint:
    """``/metrics`` of a registry over HTTP, in a daemon thread."""

    registry: CollectorRegistry

    def __init__(self) -> None:
        self._http: Any = None
        self._before_scrape: list[Callable[[], None]] = []

    def before_scrape(self, hook: Callable[[], None]) -> None:
        """Registers ``hook()``, called before each ``/metrics`` answer (e.g. to read counts kept
        elsewhere: the native engine's)."""
        self._before_scrape.append(hook)

    def serve(self, port: int, host: str = "127.0.0.1", auth: BasicAuth | None = None) -> int:
        """Serves ``/metrics`` on ``host:port`` (0 picks a free port) in a daemon thread,
        asking for ``auth`` if given.

        Returns:
            The bound port.
        """
        exported = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            for hook in self._before_scrape:
                hook()
            return exported(environ, start_response)

        class Server(ThreadingWSGIServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        self._http = make_server(
            host.strip("[]"), port, app if auth is None else auth.protect(app), Server, _QuietHandler
        )
        # close() waits for the loop's next look at its stop flag: every 0.05 s, not socketserver's 0.5.
        threading.Thread(target=self._http.serve_forever, args=(0.05,), name="metrics", daemon=True).start()
        return int(self._http.server_port)

    def close(self) -> None:
        """Stops the HTTP server, if any."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


class _VersionMetrics:
    """``retrieval_model_info{model_version}`` and ``retrieval_reload_refusals_total``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.model = Gauge(
            "retrieval_model_info", "The served model (value 1)", ["model_version"], registry=registry
        )
        self.reload_refusals = Counter(
            "retrieval_reload_refusals",
            "Deployment versions refused: failed to load, warm up or answer",
            registry=registry,
        )

    def serves(self, old: str | None, new: str) -> None:
        """Moves ``retrieval_model_info`` from version ``old`` (``None``: none) to ``new``."""
        if old is not None and old != new:
            self.model.remove(old)
        self.model.labels(new).set(1)


class Metrics(_HttpEndpoint):
    """Prometheus metrics of one server, in their own registry, served over HTTP by :meth:`serve`.

    ``retrieval_requests_total`` and ``retrieval_request_seconds`` by ``method`` and ``code``
    (the gRPC status name), ``retrieval_refusals_total`` (every call that did not end OK) by
    ``method``, ``code``, ``reason`` and ``identity`` (of the access file; ``""`` when there is
    none), ``retrieval_queue_depth`` by ``queue`` (``calls`` held, of ``--max-queued``;
    queries waiting for a micro-``batch``; ``heavy`` calls waiting for cost units),
    ``retrieval_batch_size`` (queries per user-tower call: a micro-batch of ``Retrieve``
    calls, or one ``BatchRetrieve``), ``retrieval_index_search_seconds``,
    ``retrieval_access_file_errors_total`` (changes of the access file not applied) and
    ``retrieval_access_file_stale`` (1 while the identities in force are not the file's),
    ``retrieval_model_info{model_version}`` = 1 for the version in service, and
    ``retrieval_reload_refusals_total`` (deployment versions refused). The native engine's
    counts are moved in under the same names
    (:class:`~retrieval.serving.native_metrics.NativeMetrics`).

    A ``worker`` of a serving group (:mod:`retrieval.serving.group`, in a process started with
    ``PROMETHEUS_MULTIPROC_DIR`` set) keeps only the per-request metrics, which the group's
    :class:`GroupMetrics` sums over its workers; the model version and the refusals are the
    group's, kept by its supervisor (``version`` is then ``None``).
    """

    def __init__(self, worker: bool = False) -> None:
        super().__init__()
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "retrieval_requests", "Requests answered", ["method", "code"], registry=self.registry
        )
        self.latency = Histogram(
            "retrieval_request_seconds",
            "Time to answer a request",
            ["method", "code"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.refusals = Counter(
            "retrieval_refusals",
            "Calls that did not end OK, by why and who",
            ["method", "code", "reason", "identity"],
            registry=self.registry,
        )
        # Gauges of a group's workers are summed over the live ones (prometheus_client's
        # multiprocess mode; ignored in a single process).
        self.queue = Gauge(
            "retrieval_queue_depth",
            "Calls held (calls), queries waiting for a micro-batch (batch), heavy calls waiting (heavy)",
            ["queue"],
            multiprocess_mode="livesum",
            registry=self.registry,
        )
        self.access_file_errors = Counter(
            "retrieval_access_file_errors",
            "Changes of the access file not applied (unparsable, deleted, unreadable)",
            registry=self.registry,
        )
        self.access_file_stale = Gauge(
            "retrieval_access_file_stale",
            "1 while the identities in force are not the access file's (the last good file is kept)",
            multiprocess_mode="livemax",
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "retrieval_batch_size",
            "Queries per user-tower call",
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.search = Histogram(
            "retrieval_index_search_seconds",
            "Time of one batched index search",
            buckets=(0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0),
            registry=self.registry,
        )
        self.version = None if worker else _VersionMetrics(self.registry)

    def answered(
        self, method: str, code: str, seconds: float, reason: str | None = None, identity: str = ""
    ) -> None:
        """Counts a call of ``method`` that ended with status ``code`` after ``seconds``; one that
        did not end OK also by ``reason`` (why; the code in lower case by default) and
        ``identity`` (the caller's, ``""`` when unknown)."""
        self.requests.labels(method, code).inc()
        self.latency.labels(method, code).observe(seconds)
        if code != "OK":
            self.refusals.labels(method, code, reason or code.lower(), identity).inc()

    def follow_access(self, access_file: AccessFile) -> None:
        """Counts the changes of ``access_file`` not applied, and shows whether the identities in
        force are stale."""
        self.access_file_stale.set(access_file.stale is not None)
        access_file.on_reload(self._access_file_read)

    def _access_file_read(self, applied: bool) -> None:
        if not applied:
            self.access_file_errors.inc()
        self.access_file_stale.set(not applied)

    def follow(self, slot: RetrieverSlot) -> None:
        """Times the searches of every retriever ``slot`` serves, and (not in a worker) follows its
        version and counts its refusals, those before this call included."""
        slot.current.observe_search = self.search.observe  # a swap passes it on
        if self.version is not None:
            self.version.serves(None, slot.current.model_version)
            slot.on_swap(self.swapped)
            slot.on_refuse(self.refused)
            self.version.reload_refusals.inc(slot.refusals)

    def swapped(self, old: Retriever, new: Retriever) -> None:
        """Moves ``retrieval_model_info`` to the new version (a :class:`RetrieverSlot` hook)."""
        if self.version is not None:
            self.version.serves(old.model_version, new.model_version)

    def refused(self, folder: Path, reason: str) -> None:
        """Counts a refused version (a :class:`RetrieverSlot` hook)."""
        if self.version is not None:
            self.version.reload_refusals.inc()


class GroupMetrics(_HttpEndpoint):
    """A serving group's metrics, served by its supervisor: the workers' :class:`Metrics` summed
    over their processes (prometheus_client's multiprocess mode, from the files the workers
    write in ``directory``; a restarted worker's counts stay in the sums), the group's model
    version and refusals (as :class:`Metrics` names them), ``retrieval_workers``, the
    workers up and loaded, and ``retrieval_worker_up{worker}``, 1 for each worker up and
    loaded, 0 while it is down or being replaced (exited, or killed for missing heartbeats).
    """

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.registry = CollectorRegistry()
        MultiProcessCollector(self.registry, path=str(directory))  # type: ignore[no-untyped-call]
        self.directory = directory
        self.version = _VersionMetrics(self.registry)
        self.workers = Gauge("retrieval_workers", "Worker processes up and loaded", registry=self.registry)
        self.worker_up = Gauge(
            "retrieval_worker_up",
            "1 while the worker is up and loaded, 0 while it is down or being replaced",
            ["worker"],
            registry=self.registry,
        )

    def worker_gone(self, pid: int) -> None:
        """Drops the gauges of worker process ``pid``, which exited (its queue depths and
        access-file staleness, summed over the live workers); its counts stay in the sums."""
        mark_process_dead(pid, str(self.directory))  # type: ignore[no-untyped-call]
