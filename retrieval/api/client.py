"""A small Python client for ``retrieval.v1.RetrievalService``."""

from __future__ import annotations

import ipaddress
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from retrieval.api.convert import (
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_RESPONSE_BYTES,
    SERVICE_NAME,
    model_info_from_message,
    request_from_query,
    result_from_response,
)
from retrieval.api.errors import REQUEST_ID, RetrievalError, error_from_call, trailer
from retrieval.api.types import ModelInfo, Query, Retrieved, as_query
from retrieval.api.v1 import retrieval_pb2, retrieval_pb2_grpc

M = TypeVar("M", bound=Message)

TOKEN_ENV = "MITT_TOKEN"
"""The environment variable a client reads its bearer token from when given none."""

RECONNECT_BACKOFF = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000)]
"""How soon a channel tries again to reach a replica it could not connect to: 0.1 s, growing to 1 s
at most. With gRPC's defaults (1 s, growing to 120 s), a server that starts while the client waits,
or a replica back from a restart, is reached seconds late (tests/api/test_client_reconnect.py)."""


def service_config(retries: int) -> str:
    """The channel's gRPC service config: round-robin over the resolved addresses that report
    SERVING on the health service (client-side health checking: a draining replica gets no new
    calls), and up to ``retries`` retries (with exponential backoff) of calls refused with
    UNAVAILABLE (a replica stopping or restarting), CANCELLED (a call a stopping replica had
    received but not started) or RESOURCE_EXHAUSTED (a replica's overload bound; a retry
    waits the server's ``grpc-retry-pushback-ms`` hint when it sends one). Retrieval calls
    are idempotent, and gRPC retries only calls that were not answered, within the call's
    deadline; calls the client cancels itself are never retried.
    """
    method: dict[str, Any] = {"name": [{"service": SERVICE_NAME}]}
    if retries:
        method["retryPolicy"] = {
            "maxAttempts": min(retries + 1, 5),  # gRPC caps attempts at 5
            "initialBackoff": "0.01s",
            "maxBackoff": "0.5s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED", "RESOURCE_EXHAUSTED"],
        }
    return json.dumps(
        {
            "loadBalancingConfig": [{"round_robin": {}}],
            "healthCheckConfig": {"serviceName": SERVICE_NAME},
            "methodConfig": [method],
        }
    )


def channel_target(address: str | Sequence[str]) -> str:
    """The gRPC target for one address (any gRPC target: ``host:port``, ``dns:///name:port``) or
    several replicas' ``ip:port`` addresses (gRPC resolves a list only of IP addresses).

    Raises:
        ValueError: an empty list, or a list entry that is not ``ip:port``.
    """
    if isinstance(address, str):
        return address
    addresses = list(address)
    if not addresses:
        raise ValueError("give at least one address")
    if len(addresses) == 1:
        return addresses[0]
    families = set()
    for a in addresses:
        host, _, port = a.rpartition(":")
        try:
            families.add(ipaddress.ip_address(host.strip("[]")).version)
        except ValueError:
            raise ValueError(
                f"replica address {a!r} must be ip:port (a list cannot hold host names)"
            ) from None
        if not port.isdigit():
            raise ValueError(f"replica address {a!r} has no port")
    if len(families) > 1:
        raise ValueError("replica addresses must all be IPv4 or all IPv6")
    return f"ipv{families.pop()}:{','.join(addresses)}"


class RetrievalClient:
    """Calls a retrieval server; a failed call raises the :mod:`~retrieval.api.errors` class of
    its status (a ``grpc.RpcError``, with ``.code()`` and ``.details()`` as gRPC's own, and the
    server's retry pushback and request id).

    With several replicas' addresses the client spreads calls over them round-robin and
    retries a call refused by one (a replica going down costs no failed request beyond those
    it was computing).

    Example:
        >>> with RetrievalClient("127.0.0.1:50051") as client:
        ...     client.wait_until_serving(timeout=10)
        ...     client.retrieve(["B0001", "B0042"], k=10).items
        >>> replicas = RetrievalClient(["10.0.0.5:50051", "10.0.0.6:50051"])
    """

    def __init__(
        self,
        address: str | Sequence[str],
        timeout: float = 5.0,
        *,
        retries: int = 3,
        tls_ca: Path | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        token: str | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Opens a channel to ``address``: ``host:port``, or a list of replicas' ``ip:port``.

        Args:
            timeout: each call's deadline in seconds (retries included).
            retries: retries of a call refused with UNAVAILABLE, CANCELLED or RESOURCE_EXHAUSTED, 0..4;
                with any, a call still UNAVAILABLE is also sent once more on a new connection.
            tls_ca: PEM of the CA that signed the server's certificate: the channel uses TLS.
            tls_cert: the client's certificate, for servers that require mutual TLS (with
                ``tls_key``, both or neither; they need ``tls_ca``).
            tls_key: the client certificate's key.
            max_request_bytes: largest request sent: a bigger one raises ``ValueError`` without
                being sent (the server's default limit, which it refuses bigger ones with).
            max_response_bytes: largest response accepted.
            token: bearer token sent with every call (``authorization: Bearer <token>``) to a
                server with access control; ``None`` reads :data:`TOKEN_ENV` (``MITT_TOKEN``)
                if set, ``""`` sends none. Send it over TLS only, outside a trusted network.
            metadata: more ``(key, value)`` metadata sent with every call, e.g.
                ``[("x-request-id", "...")]``.

        Raises:
            ValueError: only one of ``tls_cert`` and ``tls_key``, or either without ``tls_ca``;
                ``retries`` out of range; a bad replica list (:func:`channel_target`).
        """
        if (tls_cert is None) != (tls_key is None) or (tls_cert is not None and tls_ca is None):
            raise ValueError("a client certificate needs tls_cert, tls_key and tls_ca together")
        if not 0 <= retries <= 4:
            raise ValueError(f"retries must be between 0 and 4, got {retries}")
        self.address = channel_target(address)
        self.timeout = timeout
        self.retries = retries
        self.max_request_bytes = max_request_bytes
        options = [
            ("grpc.max_receive_message_length", max_response_bytes),
            ("grpc.max_send_message_length", max_request_bytes),
            ("grpc.service_config", service_config(retries)),
            ("grpc.enable_retries", int(retries > 0)),
            *RECONNECT_BACKOFF,
        ]
        if tls_ca is None:
            self._channel = grpc.insecure_channel(self.address, options=options)
        else:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=Path(tls_ca).read_bytes(),
                private_key=None if tls_key is None else Path(tls_key).read_bytes(),
                certificate_chain=None if tls_cert is None else Path(tls_cert).read_bytes(),
            )
            self._channel = grpc.secure_channel(self.address, credentials, options=options)
        token = os.environ.get(TOKEN_ENV, "") if token is None else token
        sent = [*metadata, *([("authorization", f"Bearer {token}")] if token else [])]
        self._metadata = tuple(sent) or None
        self._stub = retrieval_pb2_grpc.RetrievalServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def retrieve(self, history: Query | Sequence[str], k: int | None = None, **fields: Any) -> Retrieved:
        """Top-``k`` items for one user: a :class:`Query`, or a history of external ids (oldest
        first) with ``k`` (default 10) and any other :class:`Query` field by name (:func:`as_query`).

        With ``timestamps`` and/or ``actions`` (one per history event) the history is sent as
        events carrying that side information.

        Example:
            >>> client.retrieve(["B0001", "B0042"], k=10).items[0]
            >>> client.retrieve(["B0001", "B0042"], 10, rerank=Rerank("dstn", unclicked=["B0007"]))
            >>> client.retrieve(Query(["B0001"], k=5, merge="diversity", diversity_lambda=0.3))
        """
        query = as_query(history, k, **fields)
        response = self._call(self._stub.Retrieve, self._sized(request_from_query(query)))
        return result_from_response(response)

    def batch_retrieve(self, queries: Sequence[Query]) -> list[Retrieved]:
        """Answers several users in one call; one answer per query, in order.

        Example:
            >>> client.batch_retrieve([Query(["B0001"], k=10), Query(["B0042"], k=5, merge="round_robin")])
        """
        request = retrieval_pb2.BatchRetrieveRequest(requests=[request_from_query(q) for q in queries])
        response = self._call(self._stub.BatchRetrieve, self._sized(request))
        return [result_from_response(r) for r in response.responses]

    def _sized(self, request: M) -> M:
        """``request``, checked against :attr:`max_request_bytes` before it is sent: a request
        the server would refuse for its size is not sent, nor retried.

        Raises:
            ValueError: the request is too big; the message says by how much.
        """
        size = request.ByteSize()
        if size > self.max_request_bytes:
            raise ValueError(
                f"the request is {size / 2**20:.2f} MiB, over the {self.max_request_bytes / 2**20:.2f} MiB "
                "limit: send fewer ids or fewer requests per batch"
            )
        return request

    def model_info(self) -> ModelInfo:
        """What the server serves: model version and shape, index description, start time,
        refused versions, the access file's state."""
        message = self._call(self._stub.GetModelInfo, retrieval_pb2.GetModelInfoRequest())
        return model_info_from_message(message)

    def _call(self, method: grpc.UnaryUnaryMultiCallable[Any, Any], request: Message) -> Any:
        """``method(request)`` within :attr:`timeout` (:meth:`_attempts`).

        Raises:
            RetrievalError: the call failed; the class of its status (:func:`error_from_call`).
        """
        try:
            return self._attempts(method, request)
        except grpc.RpcError as e:
            raise error_from_call(e) from e

    def _attempts(self, method: grpc.UnaryUnaryMultiCallable[Any, Any], request: Message) -> Any:
        """``method(request)`` within :attr:`timeout`. A call still refused UNAVAILABLE after the
        channel's own retries (a server or worker that died with the call, a connection that
        failed) is sent once more, waiting for the channel to reconnect, within what is left of
        the same deadline: the new connection reaches another worker of a group, another
        replica, or the restarted server."""
        deadline = time.monotonic() + self.timeout
        try:
            return method(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            left = deadline - time.monotonic()
            if not self.retries or e.code() != grpc.StatusCode.UNAVAILABLE or left <= 0:
                raise
        return method(request, timeout=left, metadata=self._metadata, wait_for_ready=True)

    def health(self) -> str:
        """The service's health status name, e.g. ``"SERVING"`` or ``"NOT_SERVING"``.

        Raises:
            RetrievalError: the check failed (UNAVAILABLE: not listening).
        """
        try:
            response = self._health.Check(
                health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=self.timeout
            )
        except grpc.RpcError as e:
            raise error_from_call(e) from e
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))

    def wait_until_serving(self, timeout: float = 10.0) -> None:
        """Blocks until the service reports SERVING.

        Raises:
            TimeoutError: not SERVING after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        status = "UNREACHABLE"
        while time.monotonic() < deadline:
            try:
                status = self.health()
            except grpc.RpcError as e:
                # Not listening yet (UNAVAILABLE) or the health service is not registered yet.
                status = e.code().name
            if status == "SERVING":
                return
            time.sleep(0.05)
        raise TimeoutError(f"{self.address} not SERVING after {timeout:.1f} s (last status: {status})")

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def request_id(error: grpc.RpcError) -> str | None:
    """The id a server with an access log gave a failed call (the line to look for in its log):
    a :class:`RetrievalError`'s ``request_id``, or the trailer of an error gRPC raised.

    Example:
        >>> try:
        ...     client.retrieve(["B0001"], 10)
        ... except grpc.RpcError as e:
        ...     print(e.code(), request_id(e))
    """
    if isinstance(error, RetrievalError):
        return error.request_id
    trailing = getattr(error, "trailing_metadata", None)  # a failed call's error is also its grpc.Call
    return trailer((trailing() if callable(trailing) else None) or (), REQUEST_ID)
