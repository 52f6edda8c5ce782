"""Access control of a server open to other teams, as one gRPC server interceptor: who may call
(:mod:`~retrieval.serving.auth`), how often (:mod:`~retrieval.serving.ratelimit`), and what they
asked (:mod:`~retrieval.serving.access_log`); plus the plaintext health port for probes.

The health service stays callable without credentials on every port; every other call is
checked in this order: identity (UNAUTHENTICATED), permission (PERMISSION_DENIED), rate
(RESOURCE_EXHAUSTED with a ``grpc-retry-pushback-ms`` trailer).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeAlias, cast

import grpc
from grpc_health.v1 import health_pb2_grpc

from retrieval.api.client import REQUEST_ID
from retrieval.serving.access_log import AccessLog, model_version, request_id
from retrieval.serving.auth import OPEN_SERVICES, AccessDenied, AccessFile, Identity
from retrieval.serving.health import HealthServicer
from retrieval.serving.metrics import BasicAuth
from retrieval.serving.ratelimit import RateLimiter

Behavior = Callable[[Any, grpc.ServicerContext], Any]
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"  # generic in the stubs only


@dataclass(frozen=True)
class AccessControl:
    """Everything about who may call a server; the default changes nothing.

    Attributes:
        identities: the access file of tokens, certificates and permissions; ``None``: anyone
            may call anything.
        rate_limit: a token bucket per identity (per peer IP address without ``identities``);
            ``None`` for no limit.
        access_log: the access log; ``None`` for none.
        reflection: serve gRPC server reflection (to callers with the ``info`` permission).
        health_port: also serve the health service alone, in plaintext, on this port of the
            server's host (0 picks one), for orchestrator probes; ``None`` for no such port.
        metrics_auth: the user and password ``/metrics`` asks for (HTTP basic auth); ``None``
            for none.
    """

    identities: AccessFile | None = None
    rate_limit: RateLimiter | None = None
    access_log: AccessLog | None = None
    reflection: bool = True
    health_port: int | None = None
    metrics_auth: BasicAuth | None = None

    def interceptors(self) -> list[grpc.ServerInterceptor[Any, Any]]:
        """The server interceptors it needs: none when it checks and logs nothing."""
        checks = (self.identities, self.rate_limit, self.access_log)
        return [] if all(check is None for check in checks) else [AccessInterceptor(self)]


class AccessInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Checks and logs every call but the health service's (see the module docstring)."""

    def __init__(self, access: AccessControl) -> None:
        self._access = access
        self._wrapped: dict[str, tuple[Handler, Handler]] = {}

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Handler | None],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = continuation(details)
        method: str = details.method
        if handler is None or method.startswith(OPEN_SERVICES):
            return handler
        # Registered handlers are the same objects on every call: wrap each once.
        cached = self._wrapped.get(method)
        if cached is None or cached[0] is not handler:
            cached = self._wrapped[method] = (handler, self._wrap(method, handler))
        return cached[1]

    def _wrap(self, method: str, handler: Handler) -> Handler:
        """``handler`` with its behaviour checked (and, for unary calls, logged)."""
        serializers = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                partial(self._unary, method, handler.unary_unary), **serializers
            )
        kinds = {
            "unary_stream": grpc.unary_stream_rpc_method_handler,
            "stream_unary": grpc.stream_unary_rpc_method_handler,
            "stream_stream": grpc.stream_stream_rpc_method_handler,
        }
        kind = next(kind for kind in kinds if getattr(handler, kind) is not None)
        return kinds[kind](partial(self._streaming, method, getattr(handler, kind)), **serializers)

    def _streaming(self, method: str, behavior: Behavior, request: Any, context: grpc.ServicerContext) -> Any:
        """A streaming call (server reflection): checked, not logged."""
        self._admit(method, self._identify(context), context)
        return behavior(request, context)

    def _unary(self, method: str, behavior: Behavior, request: Any, context: grpc.ServicerContext) -> Any:
        """A unary call: checked; with an access log, given a request id (returned in the
        trailing metadata) and logged if sampled."""
        log = self._access.access_log
        if log is None:
            self._admit(method, self._identify(context), context)
            return behavior(request, context)
        rid = request_id(context.invocation_metadata())
        fields: dict[str, Any] | None = None
        if log.sampled():
            name = method.rpartition("/")[2]
            fields = {
                "request_id": rid,
                "identity": None,
                "method": name,
                **log.request_fields(name, request),
            }
        started = time.perf_counter()
        response, failed = None, True
        try:
            identity = self._identify(context)
            if fields is not None:
                fields["identity"] = identity.name
            self._admit(method, identity, context)
            response = behavior(request, context)
            failed = False
            return response
        finally:
            # Added last: the servicer may have set trailing metadata of its own.
            context.set_trailing_metadata((*(context.trailing_metadata() or ()), (REQUEST_ID, rid)))
            if fields is not None:
                # ServicerContext.code() (grpcio >= 1.38) is missing from the stubs; None until set.
                code = cast(Any, context).code() or (
                    grpc.StatusCode.UNKNOWN if failed else grpc.StatusCode.OK
                )
                fields["code"] = code.name
                fields["latency_ms"] = round((time.perf_counter() - started) * 1000, 3)
                fields["model_version"] = model_version(response)
                log.write(fields)

    def _identify(self, context: grpc.ServicerContext) -> Identity:
        """The caller: from the access file, else its IP address (with every permission)."""
        if self._access.identities is None:
            return Identity(peer_host(context.peer()))
        try:
            # The stubs type auth_context()'s values as bytes; they are lists of bytes.
            certificate = cast(Mapping[str, Sequence[bytes]], context.auth_context())
            return self._access.identities.identify(context.invocation_metadata(), certificate)
        except AccessDenied as e:
            context.abort(e.code, str(e))
            raise  # unreachable: abort raises

    def _admit(self, method: str, identity: Identity, context: grpc.ServicerContext) -> None:
        """Aborts the call if ``identity`` may not call ``method``, or not now."""
        try:
            identity.authorize(method)
        except AccessDenied as e:
            context.abort(e.code, str(e))
        limiter = self._access.rate_limit
        if limiter is None:
            return
        wait = limiter.wait(identity.name, identity.rate, identity.burst)
        if wait > 0:
            rate, burst = limiter.limit(identity.rate, identity.burst)
            pushback = max(1, round(wait * 1000))
            context.set_trailing_metadata(
                (*(context.trailing_metadata() or ()), ("grpc-retry-pushback-ms", str(pushback)))
            )
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"rate limit of {rate:g} requests/s (burst {burst:g}) for identity {identity.name!r} "
                f"exceeded, retry in {pushback} ms",
            )


def peer_host(peer: str) -> str:
    """The address in a gRPC peer string without the port: ``"ipv4:10.0.0.5:41234"`` -> ``"10.0.0.5"``."""
    address = peer.partition(":")[2] or peer
    return address.rpartition(":")[0].strip("[]") or address


def start_health_server(health_servicer: HealthServicer, host: str, port: int) -> tuple[grpc.Server, int]:
    """Serves ``health_servicer`` alone, in plaintext, on ``host:port`` (0 picks a port).

    Returns:
        ``(started server, bound port)``.

    Raises:
        OSError: the port cannot be bound.
    """
    # Few threads: probes call Check, and Watch streams hold none.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="health"))
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as e:  # grpcio's "Failed to bind to address"
        raise OSError(f"cannot serve the health port on {host}:{port}: {e}") from None
    server.start()
    return server, bound
