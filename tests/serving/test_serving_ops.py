"""Operations on real servers bound to port 0: deadlines, overload, message size, metrics, TLS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from retrieval.api.client import RetrievalClient
from retrieval.api.types import Query
from retrieval.api.v1 import retrieval_pb2
from retrieval.artifacts.index import build_index_from_model
from retrieval.serving.config import LimitsConfig, TlsConfig
from retrieval.serving.metrics import Metrics
from retrieval.serving.server import RetrievalServicer, create_server
from tests.helpers import (
    GatedRetriever,
    assert_same,
    brute_force,
    local,
    make_model,
    scrape,
    write_certificates,
)
from tools import serve as serve_tool


@pytest.fixture
def retriever() -> GatedRetriever:
    model = make_model()
    return GatedRetriever(model, build_index_from_model(model, "Flat"))


@pytest.fixture
def serving(retriever: GatedRetriever) -> Iterator[tuple[RetrievalClient, Metrics, int]]:
    metrics = Metrics()
    metrics_port = metrics.serve(0)
    server, port = create_server(
        retriever, local(limits=LimitsConfig(max_request_mb=4096 / 2**20)), metrics=metrics
    )
    with RetrievalClient(f"127.0.0.1:{port}") as client:
        client.wait_until_serving(timeout=10)
        yield client, metrics, metrics_port
    server.stop(None)
    metrics.close()


class AbortCalled(Exception):
    pass


class PastDeadlineContext:
    """A servicer context whose deadline passed half a second ago."""

    def time_remaining(self) -> float:
        return -0.5

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        raise AbortCalled


def test_a_request_past_its_deadline_is_not_computed(retriever: GatedRetriever) -> None:
    servicer = RetrievalServicer(retriever)
    context = PastDeadlineContext()
    request = retrieval_pb2.RetrieveRequest(history=["item01"], k=3)
    with pytest.raises(AbortCalled):
        servicer.Retrieve(request, context)  # type: ignore[arg-type]
    assert context.code == grpc.StatusCode.DEADLINE_EXCEEDED and "deadline passed" in context.details
    assert retriever.calls == 0


def test_message_size_is_bounded(serving: tuple[RetrievalClient, Metrics, int]) -> None:
    client, _, _ = serving
    request = retrieval_pb2.RetrieveRequest(history=[f"item{i % 40:02d}" for i in range(1000)], k=3)
    with pytest.raises(grpc.RpcError) as error:  # ~9 KB > 4096 bytes, past the client's own check
        client._stub.Retrieve(request, timeout=5)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(client.retrieve(["item01"], 3).items) == 3


def test_metrics_count_requests_batches_and_searches(serving: tuple[RetrievalClient, Metrics, int]) -> None:
    client, _, port = serving
    client.retrieve(["item01"], 3)
    client.retrieve(["item02"], 3)
    with pytest.raises(grpc.RpcError):
        client.retrieve(["item01"], 0)
    client.batch_retrieve([Query(["item03"], 2)] * 3)
    client.model_info()
    values = scrape(port)

    def requests(method: str, code: str) -> float:
        return values[("retrieval_requests_total", (("code", code), ("method", method)))]

    assert requests("Retrieve", "OK") == 2 and requests("Retrieve", "INVALID_ARGUMENT") == 1
    assert requests("BatchRetrieve", "OK") == 1 and requests("GetModelInfo", "OK") == 1
    latency = values[("retrieval_request_seconds_count", (("code", "OK"), ("method", "Retrieve")))]
    assert latency == 2
    # Two Retrieve (the invalid one was refused before joining a micro-batch), one batch of 3.
    assert values[("retrieval_batch_size_count", ())] == 3
    assert values[("retrieval_batch_size_sum", ())] == 5
    assert values[("retrieval_index_search_seconds_count", ())] == 3  # two requests, one batch
    assert values[("retrieval_model_info", (("model_version", "model-v1"),))] == 1


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_certificates(tmp_path_factory.mktemp("tls"))


def test_tls_and_mutual_tls(retriever: GatedRetriever, certificates: dict[str, Path], tmp_path: Path) -> None:
    files = certificates
    other_ca = write_certificates(tmp_path)["ca.pem"]
    expected = brute_force(retriever.model, ["item05"], 4)
    tls = TlsConfig(str(files["server.pem"]), str(files["server.key"]))
    mutual = TlsConfig(str(files["server.pem"]), str(files["server.key"]), ca=str(files["ca.pem"]))
    tls_server, tls_port = create_server(retriever, local(tls=tls))
    mtls_server, mtls_port = create_server(retriever, local(tls=mutual))
    client_files: dict[str, Any] = {"tls_cert": files["client.pem"], "tls_key": files["client.key"]}
    try:
        with RetrievalClient(f"127.0.0.1:{tls_port}", tls_ca=files["ca.pem"]) as client:
            assert_same(client.retrieve(["item05"], 4).items, expected)
        with RetrievalClient(f"127.0.0.1:{mtls_port}", tls_ca=files["ca.pem"], **client_files) as client:
            assert_same(client.retrieve(["item05"], 4).items, expected)
        # Refused: no client certificate for mutual TLS; plaintext to a TLS port; a wrong CA.
        for address, options in (
            (f"127.0.0.1:{mtls_port}", {"tls_ca": files["ca.pem"]}),
            (f"127.0.0.1:{tls_port}", {}),
            (f"127.0.0.1:{tls_port}", {"tls_ca": other_ca}),
        ):
            # retries=0: a client that retries would wait for a connection until its deadline.
            with RetrievalClient(address, timeout=2, retries=0, **options) as client:  # type: ignore[arg-type]
                with pytest.raises(grpc.RpcError) as error:
                    client.retrieve(["item05"], 4)
                assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        tls_server.stop(None)
        mtls_server.stop(None)
    with pytest.raises(ValueError, match="tls_cert, tls_key and tls_ca together"):
        RetrievalClient("127.0.0.1:1", tls_cert=files["client.pem"])


@pytest.mark.parametrize(
    "extra",
    [
        ["--tls-cert", "a.pem"],
        ["--tls-ca", "ca.pem"],
        ["--max-queued", "-1"],
        ["--max-cost", "0"],
        ["--max-request-mb", "0"],
        ["--metrics-port", "-2"],
    ],
)
def test_serve_tool_refuses_inconsistent_options(extra: list[str]) -> None:
    with pytest.raises((SystemExit, ValueError)):  # a usage error, or a value out of its range
        serve_tool.parse_args(["--model", "m", "--index", "i", *extra])
    config, _ = serve_tool.parse_args(["--model", "m", "--index", "i", "--max-queued", "3"])
    assert (config.limits.max_queued, config.metrics.port, config.tls.cert) == (3, 0, None)


def test_a_request_that_waited_past_its_deadline_is_not_computed(retriever: GatedRetriever) -> None:
    server, port = create_server(retriever, local(threads=1))  # one thread: the second call waits
    try:
        with RetrievalClient(f"127.0.0.1:{port}") as client:
            client.wait_until_serving(timeout=10)
            retriever.hold()
            request = retrieval_pb2.RetrieveRequest(history=["item01"], k=3)
            held = client._stub.Retrieve.future(request, timeout=10)
            assert retriever.entered.wait(5)
            late = client._stub.Retrieve.future(request, timeout=0.3)
            with pytest.raises(grpc.RpcError) as error:
                late.result()
            assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            retriever.gate.set()
            assert len(held.result().items) == 3
            assert len(client.retrieve(["item02"], 2).items) == 2
        assert retriever.calls == 2  # the held call and the last one, never the late one
    finally:
        server.stop(None)
