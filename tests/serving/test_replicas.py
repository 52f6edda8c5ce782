"""Two stateless replicas behind client-side round-robin: a replica going down mid-load costs
no failed request (the client stops sending to a replica reporting NOT_SERVING, and retries
calls a stopping replica refused on the other one)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import grpc
import pytest

from retrieval.api.client import RetrievalClient, channel_target, service_config
from retrieval.artifacts.index import build_index_from_model
from retrieval.serving.retriever import Retriever
from retrieval.serving.server import create_server
from tests.helpers import ITEMS, local, make_model


def test_channel_targets_and_service_config() -> None:
    assert channel_target("localhost:50051") == "localhost:50051"
    assert channel_target(["10.0.0.1:1", "10.0.0.2:2"]) == "ipv4:10.0.0.1:1,10.0.0.2:2"
    assert channel_target(["[::1]:1", "[::2]:2"]) == "ipv6:[::1]:1,[::2]:2"
    for bad in ([], ["host-a:1", "10.0.0.1:2"], ["10.0.0.1:1", "[::1]:2"], ["10.0.0.1", "10.0.0.2:1"]):
        with pytest.raises(ValueError):
            channel_target(bad)
    config = json.loads(service_config(3))
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]
    assert config["healthCheckConfig"] == {"serviceName": "retrieval.v1.RetrievalService"}
    assert config["methodConfig"][0]["retryPolicy"]["maxAttempts"] == 4
    assert "retryPolicy" not in json.loads(service_config(0))["methodConfig"][0]
    with pytest.raises(ValueError, match="retries"):
        RetrievalClient("127.0.0.1:1", retries=9)


def test_a_replica_going_down_under_load_fails_no_request() -> None:
    models = [make_model(f"replica-{i}") for i in range(2)]  # the version tells who answered
    replicas = [create_server(Retriever(m, build_index_from_model(m, "Flat")), local()) for m in models]
    addresses = [f"127.0.0.1:{port}" for _, port in replicas]
    answered: list[str] = []
    answered_at: list[float] = []
    errors: list[Exception] = []
    stop = threading.Event()

    def load(client: RetrievalClient) -> None:
        while not stop.is_set():
            try:
                result = client.retrieve([ITEMS[len(answered) % 20]], k=5)
                assert len(result.items) == 5
                answered_at.append(time.monotonic())
                answered.append(result.model_version)
            except Exception as e:  # any failure fails the test
                errors.append(e)

    try:
        with RetrievalClient(addresses, timeout=10) as client:
            client.wait_until_serving(timeout=10)
            threads = [threading.Thread(target=load, args=(client,)) for _ in range(4)]
            for t in threads:
                t.start()
            time.sleep(0.5)
            assert set(answered) == {"replica-0", "replica-1"}  # round-robin over both
            draining = time.monotonic()
            replicas[0][0].stop(grace=2, drain=0.5).wait()  # NOT_SERVING, then refuses calls
            before = len(answered)
            time.sleep(0.5)
            stop.set()
            for t in threads:
                t.join()
        assert not errors
        # The client watched health: once the replica reported NOT_SERVING (and before it
        # refused anything) it got no new calls.
        late = [v for v, t in zip(answered, answered_at, strict=False) if t > draining + 0.25]
        assert "replica-0" not in late
        assert len(answered) > before + 10 and set(answered[before + 4 :]) == {"replica-1"}
    finally:
        stop.set()
        for server, _ in replicas:
            server.stop(None)


def test_a_call_while_the_server_restarts_is_sent_again_on_a_new_connection() -> None:
    """The server is down when the call is made and back 1 s later on the same port: the
    channel's own retries (backoff of milliseconds) have all failed UNAVAILABLE by then, and the
    client sends the call once more, waiting for a new connection, within its deadline. Without
    retries the call fails at once."""
    model = make_model("restarted")
    retriever = Retriever(model, build_index_from_model(model, "Flat"))
    first, port = create_server(retriever, local())
    address = f"127.0.0.1:{port}"
    with RetrievalClient(address, timeout=20) as client, RetrievalClient(address, retries=0) as once:
        assert client.retrieve([ITEMS[0]], 3).model_version == "restarted"
        first.stop(None).wait(10)
        with pytest.raises(grpc.RpcError) as refused:
            once.retrieve([ITEMS[0]], 3)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        restarted: list[Any] = []
        restart = threading.Timer(
            1.0, lambda: restarted.append(create_server(retriever, local(port=port))[0])
        )
        restart.start()
        try:
            started = time.monotonic()
            assert client.retrieve([ITEMS[0]], 3).model_version == "restarted"
            assert 0.9 <= time.monotonic() - started < 20  # it waited for the restart
        finally:
            restart.join()
            for server in restarted:
                server.stop(None)
