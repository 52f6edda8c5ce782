"""Access control of a server open to other teams: who may call (:mod:`~retrieval.serving.auth`),
how often (:mod:`~retrieval.serving.ratelimit`), and what they asked
(:mod:`~retrieval.serving.access_log`); the gate every call passes when it arrives
(:class:`CallGate`); and the plaintext health port for probes.

The health service stays callable without credentials on every port. Every other call is
checked from its metadata alone, before its request is read, in this order:

1. the calls the server holds (``--max-queued``, :class:`~retrieval.serving.admission.CallLimit`):
   RESOURCE_EXHAUSTED, checked by :class:`CallGate` as the call arrives;
2. identity (:meth:`AccessControl.identify`): UNAUTHENTICATED; a caller that is not identified
   first takes a token from its address's rate bucket, so a flood of bad credentials is
   rate-limited too;
3. permission (:meth:`AccessControl.allow`): PERMISSION_DENIED;
4. rate: RESOURCE_EXHAUSTED.

Refusals that may clear (1 and 4) carry a ``grpc-retry-pushback-ms`` trailer. The retrieval
service's servicer runs 2-4 itself (:meth:`~retrieval.serving.server.RetrievalServicer`), then
reads and parses the request; :class:`CallGate` runs them for the other services (server
reflection).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NoReturn, TypeAlias, cast

import grpc
from grpc_health.v1 import health_pb2_grpc

from retrieval.api.convert import SERVICE_NAME
from retrieval.api.errors import PUSHBACK
from retrieval.serving.access_log import AccessLog
from retrieval.serving.addresses import bind_every_address
from retrieval.serving.admission import CallLimit, Overloaded
from retrieval.serving.auth import OPEN_SERVICES, AccessDenied, AccessFile, Identity, Unauthenticated
from retrieval.serving.config import ServerConfig
from retrieval.serving.health import HealthServicer
from retrieval.serving.metrics import BasicAuth, Metrics
from retrieval.serving.ratelimit import RateLimiter

Behavior = Callable[[Any, grpc.ServicerContext], Any]
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"  # generic in the stubs only


@dataclass(frozen=True)
class AccessControl:
    """Everything about who may call a server; the default changes nothing.

    Attributes:
        identities: the access file of tokens, certificates and permissions; ``None``: anyone
            may call anything.
        rate_limit: a token bucket per identity (per client IP address for callers that are
            not identified, and for everyone without ``identities``); ``None`` for no limit.
        access_log: the access log; ``None`` for none.
        metrics_auth: the user and password ``/metrics`` asks for (HTTP basic auth); ``None``
            for none.
    """

    identities: AccessFile | None = None
    rate_limit: RateLimiter | None = None
    access_log: AccessLog | None = None
    metrics_auth: BasicAuth | None = None

    @classmethod
    def from_config(cls, config: ServerConfig) -> AccessControl:
        """The access control ``config.access`` and ``config.metrics`` ask for.

        Raises:
            OSError: the access file or the metrics credentials file cannot be read.
            ValueError: one of them is invalid, or the credentials variable is not set.
        """
        access, metrics = config.access, config.metrics
        metrics_auth = None
        if metrics.auth_file:
            metrics_auth = BasicAuth.parse(Path(metrics.auth_file).read_text(), metrics.auth_file)
        elif metrics.auth_env:
            metrics_auth = BasicAuth.parse(os.environ.get(metrics.auth_env, ""), f"${metrics.auth_env}")
        rate = access.rate_limit
        return cls(
            identities=AccessFile(Path(access.file)) if access.file else None,
            rate_limit=RateLimiter(rate, access.rate_burst) if rate else None,
            access_log=AccessLog(access.log_sample, access.log_user_ids) if access.log_sample else None,
            metrics_auth=metrics_auth,
        )

    def identify(self, context: grpc.ServicerContext) -> Identity:
        """The caller, from the call's metadata and TLS peer (never its request): an identity
        of the access file, or without one its IP address (anonymous, every permission).

        Raises:
            Unauthenticated: no known credentials, once the caller's address had a token left.
            Overloaded: an unidentified caller over its address's rate limit.
        """
        if self.identities is None:
            return _anonymous(context)
        try:
            # The stubs type auth_context()'s values as bytes; they are lists of bytes.
            certificate = cast(Mapping[str, Sequence[bytes]], context.auth_context())
            return self.identities.identify(context.invocation_metadata(), certificate)
        except Unauthenticated:
            self._limit(_anonymous(context))
            raise

    def allow(self, method: str, identity: Identity) -> None:
        """Checks that ``identity`` may call ``method`` (a full name), and may now.

        Raises:
            AccessDenied: it lacks the permission (PERMISSION_DENIED).
            Overloaded: it is over its rate limit, with ``retry_after``; a call refused for its
                permission takes no token.
        """
        identity.authorize(method)
        self._limit(identity)

    def _limit(self, identity: Identity) -> None:
        limiter = self.rate_limit
        if limiter is None:
            return
        wait = limiter.wait((identity.anonymous, identity.name), identity.rate, identity.burst)
        if wait > 0:
            rate, burst = limiter.limit(identity.rate, identity.burst)
            pushback = max(1, round(wait * 1000))
            caller = f"identity {identity.name!r}"
            if identity.anonymous and self.identities is not None:
                caller = f"unauthenticated calls from {identity.name}"
            raise Overloaded(
                "rate_limit",
                f"rate limit of {rate:g} requests/s (burst {burst:g}) for {caller} exceeded, "
                f"retry in {pushback} ms",
                pushback / 1000,
            )


def _anonymous(context: grpc.ServicerContext) -> Identity:
    return Identity(peer_host(context.peer()), anonymous=True)


def identity_label(identity: Identity | None) -> str:
    """The ``identity`` label of a call's metrics: an access file's identity, else ``""`` (client
    addresses would give the metric one series per client)."""
    return "" if identity is None or identity.anonymous else identity.name


def refusal_status(error: AccessDenied | Overloaded) -> grpc.StatusCode:
    """The status of an access or capacity refusal."""
    return error.code if isinstance(error, AccessDenied) else grpc.StatusCode.RESOURCE_EXHAUSTED


def abort(
    context: grpc.ServicerContext, code: grpc.StatusCode, details: str, retry_after: float | None
) -> NoReturn:
    """Ends the call with ``code`` and ``details``; with ``retry_after`` (seconds), also the
    ``grpc-retry-pushback-ms`` trailer, which gRPC retry policies wait before a retry."""
    if retry_after is not None:
        pushback = (PUSHBACK, str(max(1, round(retry_after * 1000))))
        context.set_trailing_metadata((*(context.trailing_metadata() or ()), pushback))
    context.abort(code, details)
    raise AssertionError("unreachable: abort raises")


class _OnPool:
    """A behaviour gRPC runs on ``pool`` rather than on the server's request threads (grpcio
    reads a behaviour's ``experimental_thread_pool``; without it, the request threads)."""

    def __init__(self, behavior: Behavior, pool: futures.ThreadPoolExecutor) -> None:
        self._behavior = behavior
        self.experimental_thread_pool = pool

    def __call__(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._behavior(request, context)


class CallGate(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """The first step of every call but the health service's (the module docstring), taken as
    the call arrives, on gRPC's own thread, before the call has a request thread or is read.

    A call over ``calls`` is refused at once, on a thread of its own (``REFUSAL_THREADS``): the
    request threads may all be busy, which is why it is refused. Calls of the retrieval service
    go on to its servicer, which checks them itself before it reads them; calls of other
    services are checked here. Refusals are counted in ``metrics``.
    """

    REFUSAL_THREADS = 2

    def __init__(self, calls: CallLimit, access: AccessControl, metrics: Metrics | None = None) -> None:
        self._calls = calls
        self._access = access
        self._metrics = metrics
        self._wrapped: dict[str, tuple[Handler, Handler]] = {}
        self._refusals: dict[str, Handler] = {}
        self._refusal_pool = futures.ThreadPoolExecutor(self.REFUSAL_THREADS, thread_name_prefix="refuse")

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Handler | None],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = continuation(details)
        method: str = details.method
        if handler is None or method.startswith(OPEN_SERVICES):
            return handler
        if not self._calls.enter():
            return self._refusal(method)
        # Registered handlers are the same objects on every call: wrap each once.
        cached = self._wrapped.get(method)
        if cached is None or cached[0] is not handler:
            cached = self._wrapped[method] = (handler, self._wrap(method, handler))
        return cached[1]

    def _refusal(self, method: str) -> Handler:
        """A handler refusing a call of ``method`` for want of room, without reading it (a
        request stream is never read)."""
        refusal = self._refusals.get(method)
        if refusal is None:
            behavior = _OnPool(partial(self._refuse, method), self._refusal_pool)
            refusal = self._refusals[method] = grpc.stream_unary_rpc_method_handler(behavior)
        return refusal

    def _refuse(self, method: str, requests: Any, context: grpc.ServicerContext) -> NoReturn:
        error = self._calls.refusal()
        self._count(method, error, None, 0.0)
        abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(error), error.retry_after)

    def _wrap(self, method: str, handler: Handler) -> Handler:
        """``handler`` that releases its place in ``calls`` when done, and checks callers first
        unless the retrieval servicer does."""
        # Our services take request streams (read by the behaviour, once checked) and so are
        # always called; a unary-request behaviour gRPC may skip (a call cancelled while
        # queued) would keep its place.
        serializers = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        kinds = {
            "unary_unary": grpc.unary_unary_rpc_method_handler,
            "unary_stream": grpc.unary_stream_rpc_method_handler,
            "stream_unary": grpc.stream_unary_rpc_method_handler,
            "stream_stream": grpc.stream_stream_rpc_method_handler,
        }
        kind = next(kind for kind in kinds if getattr(handler, kind) is not None)
        gated = self._stream if handler.response_streaming else self._unary
        return kinds[kind](partial(gated, method, getattr(handler, kind)), **serializers)

    def _unary(self, method: str, behavior: Behavior, request: Any, context: grpc.ServicerContext) -> Any:
        started = time.perf_counter()
        try:
            self._check(method, context, started)
            return behavior(request, context)
        finally:
            self._calls.leave(time.perf_counter() - started)

    def _stream(
        self, method: str, behavior: Behavior, request: Any, context: grpc.ServicerContext
    ) -> Iterator[Any]:
        """A response stream (server reflection): it holds its place until it ends."""
        started = time.perf_counter()
        try:
            self._check(method, context, started)
            yield from behavior(request, context)
        finally:
            self._calls.leave(time.perf_counter() - started)

    def _check(self, method: str, context: grpc.ServicerContext, started: float) -> None:
        """Aborts the call if its caller may not call ``method`` now (the retrieval service's
        servicer checks its own calls)."""
        if method.startswith(f"/{SERVICE_NAME}/"):
            return
        identity = None
        try:
            identity = self._access.identify(context)
            self._access.allow(method, identity)
        except (AccessDenied, Overloaded) as error:
            self._count(method, error, identity, time.perf_counter() - started)
            abort(context, refusal_status(error), str(error), getattr(error, "retry_after", None))

    def _count(
        self, method: str, error: AccessDenied | Overloaded, identity: Identity | None, seconds: float
    ) -> None:
        if self._metrics is not None:
            code = refusal_status(error).name
            name = method.rpartition("/")[2]
            self._metrics.answered(name, code, seconds, error.refusal, identity_label(identity))


def peer_host(peer: str) -> str:
    """The address in a gRPC peer string without the port: ``"ipv4:10.0.0.5:41234"`` -> ``"10.0.0.5"``."""
    address = peer.partition(":")[2] or peer
    return address.rpartition(":")[0].strip("[]") or address


def start_health_server(
    health_servicer: HealthServicer, host: str, port: int, reuse_port: bool = False
) -> tuple[grpc.Server, int]:
    """Serves ``health_servicer`` alone, in plaintext, on ``port`` (0 picks one) of every address
    ``host`` resolves to, as the main port is (:func:`~retrieval.serving.addresses.bind_every_address`).
    ``reuse_port``: share the port with the other workers of a serving group; without it, a port
    already served is refused.

    Returns:
        ``(started server, bound port)``.

    Raises:
        OSError: an address cannot be bound; nothing is left serving.
    """
    # Few threads: probes call Check, and Watch streams hold none.
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="health"),
        options=[("grpc.so_reuseport", int(reuse_port))],
    )
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        bound = bind_every_address(server, host, port, what="the health port")
    except OSError:
        server.stop(None)
        raise
    server.start()
    return server, bound
