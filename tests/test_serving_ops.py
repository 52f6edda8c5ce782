"""Operations on real servers bound to port 0: deadlines, overload, message size, metrics, TLS."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from retrieval.api.client import RetrievalClient
from retrieval.api.types import Query
from retrieval.api.v1 import retrieval_pb2
from retrieval.artifacts.index import build_index_from_model
from retrieval.serving.metrics import Metrics
from retrieval.serving.server import RetrievalServicer, TlsFiles, create_server
from tests.helpers import GatedRetriever, assert_same, brute_force, make_model, scrape
from tools import serve as serve_tool


@pytest.fixture
def retriever() -> GatedRetriever:
    model = make_model()
    return GatedRetriever(model, build_index_from_model(model, "Flat"))


@pytest.fixture
def serving(retriever: GatedRetriever) -> Iterator[tuple[RetrievalClient, Metrics, int]]:
    metrics = Metrics()
    metrics_port = metrics.serve(0)
    server, port = create_server(retriever, port=0, max_concurrent=1, metrics=metrics, max_message_bytes=4096)
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


def test_overload_is_resource_exhausted_and_passes(
    serving: tuple[RetrievalClient, Metrics, int], retriever: GatedRetriever
) -> None:
    client, _, _ = serving
    retriever.gate.clear()
    retriever.entered.clear()
    request = retrieval_pb2.RetrieveRequest(history=["item01"], k=3)
    held = client._stub.Retrieve.future(request, timeout=10)
    assert retriever.entered.wait(5)
    with pytest.raises(grpc.RpcError) as error:  # the one slot is taken
        client.retrieve(["item02"], 3)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "1 requests in flight" in (error.value.details() or "")
    retriever.gate.set()
    assert len(held.result().items) == 3
    assert len(client.retrieve(["item02"], 3).items) == 3  # the slot is free again


def test_message_size_is_bounded(serving: tuple[RetrievalClient, Metrics, int]) -> None:
    client, _, _ = serving
    with pytest.raises(grpc.RpcError) as error:
        client.retrieve([f"item{i % 40:02d}" for i in range(1000)], 3)  # ~9 KB > 4096 bytes
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
    assert values[("retrieval_batch_size_count", ())] == 4  # three Retrieve, one batch of 3
    assert values[("retrieval_batch_size_sum", ())] == 6
    assert values[("retrieval_index_search_seconds_count", ())] == 3  # two requests, one batch
    assert values[("retrieval_model_info", (("model_version", "model-v1"),))] == 1


def write_certificates(folder: Path) -> dict[str, Path]:
    """A self-signed CA, a server certificate for 127.0.0.1 and a client certificate, all PEM."""
    now = datetime.datetime.now(datetime.UTC)

    def certificate(
        name: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, signer: Any, ca: bool, san: list
    ) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(signer, hashes.SHA256())

    files: dict[str, Path] = {}
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = certificate("test CA", ca_key, ca_name, ca_key, True, [])
    entities = {"ca": (ca_key, ca)}
    for name, san in (
        ("server", [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
        ("client", [x509.DNSName("client")]),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        entities[name] = (key, certificate(name, key, ca_name, ca_key, False, san))
    for name, (key, cert) in entities.items():
        files[f"{name}.pem"] = folder / f"{name}.pem"
        files[f"{name}.pem"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files[f"{name}.key"] = folder / f"{name}.key"
        files[f"{name}.key"].write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return files


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_certificates(tmp_path_factory.mktemp("tls"))


def test_tls_and_mutual_tls(retriever: GatedRetriever, certificates: dict[str, Path], tmp_path: Path) -> None:
    files = certificates
    other_ca = write_certificates(tmp_path)["ca.pem"]
    expected = brute_force(retriever.model, ["item05"], 4)
    tls = TlsFiles(files["server.pem"], files["server.key"])
    mutual = TlsFiles(files["server.pem"], files["server.key"], ca=files["ca.pem"])
    tls_server, tls_port = create_server(retriever, port=0, tls=tls)
    mtls_server, mtls_port = create_server(retriever, port=0, tls=mutual)
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
            with RetrievalClient(address, timeout=2, **options) as client:  # type: ignore[arg-type]
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
    [["--tls-cert", "a.pem"], ["--tls-ca", "ca.pem"], ["--max-concurrent", "-1"], ["--metrics-port", "-2"]],
)
def test_serve_tool_refuses_inconsistent_options(extra: list[str]) -> None:
    with pytest.raises(SystemExit):
        serve_tool.parse_args(["--model", "m", "--index", "i", *extra])
    args = serve_tool.parse_args(["--model", "m", "--index", "i", "--max-concurrent", "3"])
    assert (args.max_concurrent, args.metrics_port, args.tls_cert) == (3, 0, None)


def test_a_request_that_waited_past_its_deadline_is_not_computed(retriever: GatedRetriever) -> None:
    server, port = create_server(retriever, port=0, max_workers=1)  # one thread: the second call waits
    try:
        with RetrievalClient(f"127.0.0.1:{port}") as client:
            client.wait_until_serving(timeout=10)
            retriever.gate.clear()
            retriever.entered.clear()
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
