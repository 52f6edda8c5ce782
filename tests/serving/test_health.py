"""The health service: Check and Watch answers, and status changes racing watchers that leave."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from retrieval.serving.health import HealthServicer

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


@pytest.fixture
def served() -> Iterator[tuple[HealthServicer, str]]:
    servicer = HealthServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None).wait(30)


def request(service: str = "") -> health_pb2.HealthCheckRequest:
    return health_pb2.HealthCheckRequest(service=service)


def test_check_answers_the_set_status_and_not_found_for_an_unknown_service(
    served: tuple[HealthServicer, str],
) -> None:
    servicer, address = served
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        assert stub.Check(request(), timeout=10).status == SERVING  # the whole server, from the start
        servicer.set("", NOT_SERVING)
        assert stub.Check(request(), timeout=10).status == NOT_SERVING
        with pytest.raises(grpc.RpcError) as raised:
            stub.Check(request("nobody"), timeout=10)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_watch_sends_the_status_then_every_change(served: tuple[HealthServicer, str]) -> None:
    servicer, address = served
    with grpc.insecure_channel(address) as channel:
        stream = health_pb2_grpc.HealthStub(channel).Watch(request("svc"), timeout=30)
        assert next(stream).status == SERVICE_UNKNOWN
        servicer.set("svc", SERVING)
        assert next(stream).status == SERVING
        servicer.set("other", NOT_SERVING)  # not this stream's service
        servicer.set("svc", NOT_SERVING)
        assert next(stream).status == NOT_SERVING
        stream.cancel()


def test_status_changes_racing_watchers_that_leave_neither_hang_nor_end_stale(
    served: tuple[HealthServicer, str],
) -> None:
    """grpcio-health-checking's servicer sends under the lock a leaving watcher's callback takes
    on gRPC's event thread: this mix of changes and watchers closing could hang ``set``."""
    servicer, address = served
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:  # watchers that come and go
        try:
            while not stop.is_set():
                with grpc.insecure_channel(address) as channel:
                    stream = health_pb2_grpc.HealthStub(channel).Watch(request(), timeout=30)
                    next(stream)
                    stream.cancel()
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    def toggle(changes: int) -> None:
        for n in range(changes):
            servicer.set("", SERVING if n % 2 else NOT_SERVING)

    with grpc.insecure_channel(address) as channel:
        watched = health_pb2_grpc.HealthStub(channel).Watch(request(), timeout=120)
        assert next(watched).status == SERVING
        churners = [threading.Thread(target=churn, daemon=True) for _ in range(4)]
        for thread in churners:
            thread.start()
        toggler = threading.Thread(target=toggle, args=(400,), daemon=True)
        toggler.start()
        toggler.join(90)
        stop.set()
        for thread in churners:
            thread.join(60)
        assert not toggler.is_alive(), "set() hung while watchers left"
        assert not errors, errors
        servicer.set("", NOT_SERVING)
        last = SERVING
        while last != NOT_SERVING:  # the long-lived watcher ends on the current status
            last = next(watched).status
        watched.cancel()


def test_a_watcher_that_never_takes_its_message_holds_no_status_change(
    served: tuple[HealthServicer, str],
) -> None:
    """A server's stop starts by setting NOT_SERVING: a send that never completes (a watcher
    that stopped reading) must not hold ``set``, nor hide the new status from ``Check``. 30
    rounds: the sends run on a thread of their own."""
    servicer, address = served
    never = threading.Event()
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        watched = stub.Watch(request("svc"), timeout=120)
        assert next(watched).status == SERVICE_UNKNOWN
        servicer.set("svc", SERVING)
        assert next(watched).status == SERVING
        servicer._watchers["svc"].add(lambda response: never.wait())
        for n in range(30):
            status = NOT_SERVING if n % 2 == 0 else SERVING
            setter = threading.Thread(target=servicer.set, args=("svc", status), daemon=True)
            setter.start()
            setter.join(10)
            assert not setter.is_alive(), f"set() blocked on a stuck watcher (round {n})"
            assert stub.Check(request("svc"), timeout=10).status == status
        watched.cancel()
    never.set()
