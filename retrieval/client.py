"""A small Python client for ``retrieval.v1.RetrievalService``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import TracebackType
from typing import Self

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto import retrieval_pb2, retrieval_pb2_grpc
from retrieval.retriever import Retrieved
from retrieval.server import SERVICE_NAME


class RetrievalClient:
    """Calls a retrieval server; failed calls raise ``grpc.RpcError`` (``.code()``, ``.details()``).

    Example:
        >>> with RetrievalClient("127.0.0.1:50051") as client:
        ...     client.wait_until_serving(timeout=10)
        ...     client.retrieve(["B0001", "B0042"], k=10).items
    """

    def __init__(self, address: str, timeout: float = 5.0) -> None:
        """Opens a channel to ``address`` (``host:port``); ``timeout`` is each call's deadline in seconds."""
        self.address = address
        self.timeout = timeout
        self._channel = grpc.insecure_channel(address)
        self._stub = retrieval_pb2_grpc.RetrievalServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def retrieve(
        self,
        history: Sequence[str],
        k: int = 10,
        timestamps: Sequence[int] | None = None,
        actions: Sequence[str] | None = None,
    ) -> Retrieved:
        """Top-``k`` items for a history of external ids (oldest first).

        With ``timestamps`` and/or ``actions`` (one per history event) the history is sent as
        events carrying that side information.
        """
        for name, values in (("timestamps", timestamps), ("actions", actions)):
            if values is not None and len(values) != len(history):
                raise ValueError(f"{len(values)} {name} for a history of {len(history)} events")
        if timestamps is None and actions is None:
            request = retrieval_pb2.RetrieveRequest(history=history, k=k)
        else:
            events = [
                retrieval_pb2.Event(
                    item_id=item,
                    timestamp=0 if timestamps is None else int(timestamps[i]),
                    action="" if actions is None else str(actions[i]),
                )
                for i, item in enumerate(history)
            ]
            request = retrieval_pb2.RetrieveRequest(events=events, k=k)
        response = self._stub.Retrieve(request, timeout=self.timeout)
        return Retrieved(
            items=[(item.item_id, item.score, item.interest) for item in response.items],
            unknown_items=response.unknown_items,
            model_version=response.model_version,
        )

    def health(self) -> str:
        """The service's health status name, e.g. ``"SERVING"`` or ``"NOT_SERVING"``."""
        response = self._health.Check(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=self.timeout
        )
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

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
