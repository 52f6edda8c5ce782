"""The client's channel reconnects soon: a server that starts after the client (or a replica back
from a restart) is seen within about a second, not after gRPC's default backoff (1 s growing to
120 s, which saw a server started 12 s after the client 2-5 s late)."""

from __future__ import annotations

import socket
import threading
import time
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from retrieval.api import RetrievalClient
from retrieval.api.client import SERVICE_NAME

START_AFTER = 12.0
"""Long enough for gRPC's default backoff to have grown past 4 s (attempts near 0, 1, 2.6, 5.2,
9.3 and 15.8 s, each +-20%), so that the old channel would see the server late."""


@pytest.mark.slow  # waits START_AFTER seconds for the server (no CPU)
def test_wait_until_serving_sees_a_server_started_later_within_about_a_second() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seen: list[float] = []
    with RetrievalClient(f"127.0.0.1:{port}") as client:

        def wait() -> None:
            client.wait_until_serving(timeout=START_AFTER + 30)
            seen.append(time.monotonic())

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(START_AFTER)
        server = grpc.server(futures.ThreadPoolExecutor(2))
        servicer = health.HealthServicer()
        servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        up = time.monotonic()
        try:
            waiter.join(timeout=60)
        finally:
            server.stop(0)
    assert seen, "wait_until_serving never returned"
    late = seen[0] - up
    assert late < 2.5, f"the server was seen {late:.2f} s after it started"  # at most ~1.2 s, +margin
