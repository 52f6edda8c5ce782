"""The standard gRPC health service (``grpc.health.v1.Health``), safe to change under watchers.

grpcio-health-checking's ``HealthServicer`` sends each watcher its new status while holding the
lock that a closing ``Watch`` stream's callback takes on gRPC's event thread, and a send waits
for that same thread to complete it: a status change that meets a closing watcher (a client
going away while the server stops) hangs both, and the server never stops. Here no lock is held
across a send on it: the statuses and the watchers are read under ``_lock``; sends go out one
round at a time under ``_send_lock``, each round carrying the newest status, so the last
message a watcher gets is the current status. The rounds run in a thread of their own, never
in the caller of :meth:`HealthServicer.set`: a send that never completes (a watcher that stopped
reading) cannot hold a server's stop, which starts by setting NOT_SERVING.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

__all__ = ["HealthServicer"]

_Send = Callable[[Any], None]
"""gRPC's callback for a non-blocking server stream: a message, or ``None`` to end it."""


class HealthServicer(health_pb2_grpc.HealthServicer):
    """``Check`` and ``Watch`` over statuses set with :meth:`set`; the whole server (service
    ``""``) starts SERVING, as grpcio-health-checking's does.

    Example:
        >>> servicer = HealthServicer()
        >>> health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        >>> servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _status and _watchers; never held across a send
        self._send_lock = threading.Lock()  # one round of sends at a time
        self._status: dict[str, int] = {"": health_pb2.HealthCheckResponse.SERVING}
        self._watchers: dict[str, set[_Send]] = {}
        self._changed: set[str] = set()  # services whose watchers the next round tells
        self._sending = False  # a thread is sending rounds

    def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext) -> Any:
        with self._lock:
            status = self._status.get(request.service)
        if status is None:
            context.set_code(grpc.StatusCode.NOT_FOUND)
            return health_pb2.HealthCheckResponse()
        return health_pb2.HealthCheckResponse(status=status)

    def Watch(
        self,
        request: health_pb2.HealthCheckRequest,
        context: grpc.ServicerContext,
        send_response_callback: _Send,
    ) -> None:
        service, send = request.service, send_response_callback
        with self._send_lock:  # a round of set() cannot slip between reading the status and sending it
            with self._lock:
                self._watchers.setdefault(service, set()).add(send)
                status = self._status.get(service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            if not context.add_callback(lambda: self._closed(service, send)):
                self._closed(service, send)  # the stream has already ended
                return
            send(health_pb2.HealthCheckResponse(status=status))

    # Watch streams get gRPC's callback instead of holding a request thread each.
    Watch.experimental_non_blocking = True  # type: ignore[attr-defined]

    def _closed(self, service: str, send: _Send) -> None:
        with self._lock:
            self._watchers[service].discard(send)
        send(None)

    def set(self, service: str, status: int) -> None:
        """Sets ``service``'s status (``""``: the whole server): ``Check`` answers it at once;
        its watchers are told by a thread of their own (this never blocks)."""
        with self._lock:
            self._status[service] = status
            self._changed.add(service)
            if self._sending:
                return  # the running thread's next round carries it
            self._sending = True
        threading.Thread(target=self._send_rounds, name="health-watchers", daemon=True).start()

    def _send_rounds(self) -> None:
        """Tells the watchers of every changed service its newest status, round after round,
        until no status changed since the last round."""
        while True:
            with self._lock:
                changed, self._changed = self._changed, set()
                if not changed:
                    self._sending = False
                    return
            with self._send_lock:
                for service in changed:
                    with self._lock:
                        status = self._status[service]
                        watchers = list(self._watchers.get(service, ()))
                    for send in watchers:
                        send(health_pb2.HealthCheckResponse(status=status))
