"""Prometheus metrics of one server, in their own registry."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from retrieval.serving.retriever import Retriever


class Metrics:
    """Prometheus metrics of one server, in their own registry, served over HTTP by :meth:`serve`.

    ``retrieval_requests_total`` and ``retrieval_request_seconds`` by ``method`` and ``code``
    (the gRPC status name), ``retrieval_batch_size`` (queries per user-tower call: a
    micro-batch of ``Retrieve`` calls, or one ``BatchRetrieve``),
    ``retrieval_index_search_seconds`` and ``retrieval_model_info{model_version}`` = 1 for the
    version in service.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "retrieval_requests", "Requests answered", ["method", "code"], registry=self.registry
        )
        self.latency = Histogram(
            "retrieval_request_seconds",
            "Time to answer a request",
            ["method", "code"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "retrieval_batch_size",
            "Queries per user-tower call",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=self.registry,
        )
        self.search = Histogram(
            "retrieval_index_search_seconds",
            "Time of one batched index search",
            buckets=(0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0),
            registry=self.registry,
        )
        self.model = Gauge(
            "retrieval_model_info", "The served model (value 1)", ["model_version"], registry=self.registry
        )
        self._http: Any = None

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serves ``/metrics`` on ``host:port`` (0 picks a free port) in a daemon thread.

        Returns:
            The bound port.
        """
        self._http, _ = start_http_server(port, host, registry=self.registry)
        return int(self._http.server_port)

    def swapped(self, old: Retriever, new: Retriever) -> None:
        """Moves ``retrieval_model_info`` to the new version (a :class:`RetrieverSlot` hook)."""
        if old.model_version != new.model_version:
            self.model.remove(old.model_version)
        self.model.labels(new.model_version).set(1)

    def close(self) -> None:
        """Stops the HTTP server, if any."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
