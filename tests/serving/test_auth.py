"""Who may call a server: bearer tokens and client certificates mapped to permissions, the access
file reloaded while serving, health checks without credentials (on the main port and a plaintext
health port), reflection off, certificates rotated on disk, and the metrics endpoint's basic auth
and loopback default. Real servers on port 0."""

from __future__ import annotations

import base64
import logging
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from bench.serving import free_port
from retrieval.api.client import RetrievalClient
from retrieval.api.errors import PermissionDenied, Unauthenticated
from retrieval.api.types import Query
from retrieval.cli import serve as serve_cli
from retrieval.serving.access import AccessControl
from retrieval.serving.auth import AccessFile, parse_identities
from retrieval.serving.config import AccessConfig, ServerConfig, TlsConfig
from retrieval.serving.metrics import BasicAuth, Metrics
from retrieval.serving.retriever import Retriever
from retrieval.serving.server import RetrievalServer, create_server
from tests.helpers import assert_same, brute_force, local, write_certificates
from tests.serving.helpers import (
    ACCESS,
    OPS_TOKEN_ENV,
    Rotation,
    check_health_ports,
    code_of,
    health_status,
)


@pytest.fixture
def access_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(OPS_TOKEN_ENV, "token-ops")
    path = tmp_path / "access.toml"
    path.write_text(ACCESS)
    return path


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate of CN ``client``."""
    return write_certificates(tmp_path_factory.mktemp("tls"))


@contextmanager
def started(
    retriever: Retriever, config: ServerConfig | None = None, **options: Any
) -> Iterator[RetrievalServer]:
    server, _ = create_server(retriever, config or local(), **options)
    try:
        yield server
    finally:
        server.stop(None)


def reflection_code(address: str, metadata: tuple[tuple[str, str], ...] = ()) -> grpc.StatusCode:
    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        return code_of(
            lambda: list(stub.ServerReflectionInfo(iter([request]), timeout=10, metadata=metadata))
        )


def test_tokens_are_checked_and_each_method_needs_its_permission(
    retriever: Retriever, access_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MITT_TOKEN", raising=False)
    access = AccessControl(identities=AccessFile(access_file))
    expected = brute_force(retriever.model, ["item05"], 4)
    with started(retriever, access=access) as server:
        address = f"127.0.0.1:{server.port}"
        assert health_status(address) == "SERVING"  # probes need no token
        calls = {
            "Retrieve": lambda c: c.retrieve(["item05"], 4),
            "BatchRetrieve": lambda c: c.batch_retrieve([Query(["item05"], 4)]),
            "GetModelInfo": lambda c: c.model_info(),
        }
        expected_codes = {
            None: dict.fromkeys(calls, grpc.StatusCode.UNAUTHENTICATED),
            "wrong": dict.fromkeys(calls, grpc.StatusCode.UNAUTHENTICATED),
            "token-a": dict.fromkeys(calls, grpc.StatusCode.OK),
            "token-b": {
                "Retrieve": grpc.StatusCode.PERMISSION_DENIED,
                "BatchRetrieve": grpc.StatusCode.PERMISSION_DENIED,
                "GetModelInfo": grpc.StatusCode.OK,
            },
            "token-ops": dict.fromkeys(calls, grpc.StatusCode.OK),  # admin may call anything
        }
        for token, codes in expected_codes.items():
            with RetrievalClient(address, retries=0, token=token or "") as client:
                assert client.health() == "SERVING"
                assert {name: code_of(call, client) for name, call in calls.items()} == codes, token
        with (
            RetrievalClient(address, retries=0, token="token-b") as client,
            pytest.raises(grpc.RpcError) as denied,
        ):
            client.retrieve(["item05"], 4)
        assert (
            denied.value.details() == "identity 'team-b' may not call Retrieve (needs permission 'retrieve')"
        )
        assert isinstance(denied.value, PermissionDenied)
        with (
            RetrievalClient(address, retries=0, token="wrong") as client,
            pytest.raises(grpc.RpcError) as refused,
        ):
            client.model_info()
        assert refused.value.details() == "invalid bearer token"
        assert isinstance(refused.value, Unauthenticated)
        monkeypatch.setenv("MITT_TOKEN", "token-a")  # the client's default token
        with RetrievalClient(address, retries=0) as client:
            assert_same(client.retrieve(["item05"], 4).items, expected)
        # Reflection reveals the API: it needs the info permission.
        assert reflection_code(address) == grpc.StatusCode.UNAUTHENTICATED
        assert reflection_code(address, (("authorization", "Bearer token-b"),)) == grpc.StatusCode.OK


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[identities.a]\ntokens = ['t']\npermission = ['info']", "keys must be among"),
        ("[identities.a]\ntokens = ['t']\npermissions = ['write']", "unknown permissions ['write']"),
        ("[identities.a]\npermissions = ['info']", "has no token and no certificate"),
        ("[identities.a]\ntokens = ['t']\n[identities.b]\ntokens = ['t']", "shares a token with 'a'"),
        ("[identities.a]\ntoken_env = 'SURELY_NOT_SET_ANYWHERE'", "'SURELY_NOT_SET_ANYWHERE' is not set"),
        ("[identities.a]\ntoken_sha256 = ['abcd']", "not 64 hexadecimal digits"),
        ("[identities.a]\ntokens = ['t']\nrate = -1", "rate must be a number >= 0"),
        ("[identities.a]\ntokens = ['t']\nburst = 0.5", "burst must be a number >= 1"),
        ("[rate]\nx = 1", "expected only [identities.NAME] tables"),
        ("[identities.a\n", "access file"),
        # A caller's token is read without the spaces around it: such an entry could never match.
        (
            "[identities.a]\ntokens = ['ok', ' padded ']",
            "identity 'a': tokens[1] starts or ends with whitespace",
        ),
        ('[identities.a]\ntokens = ["in\\tside"]', "identity 'a': tokens[0] starts or ends with whitespace"),
        ("[identities.a]\ntoken_env = 'PADDED_TOKEN_FOR_TESTS'", "the token of environment variable"),
    ],
)
def test_invalid_access_files_are_refused_with_the_reason(
    text: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PADDED_TOKEN_FOR_TESTS", "secret\t")
    with pytest.raises(ValueError, match="access file") as error:
        parse_identities(text)
    assert message in str(error.value)
    assert "padded" not in str(error.value) and "secret" not in str(error.value)  # never the token


def test_access_file_changes_apply_without_restart(
    retriever: Retriever, access_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    access = AccessControl(identities=AccessFile(access_file, check_interval=0.0))
    with started(retriever, access=access) as server:
        address = f"127.0.0.1:{server.port}"
        with (
            RetrievalClient(address, retries=0, token="token-a") as old,
            RetrievalClient(address, retries=0, token="token-a2") as new,
        ):
            assert code_of(old.model_info) == grpc.StatusCode.OK
            assert code_of(new.model_info) == grpc.StatusCode.UNAUTHENTICATED
            access_file.write_text(ACCESS.replace('"token-a"', '"token-a2"'))  # a new token for team-a
            assert code_of(old.model_info) == grpc.StatusCode.UNAUTHENTICATED
            assert code_of(new.model_info) == grpc.StatusCode.OK
            # A broken file is logged, and the identities read before stay in force.
            with caplog.at_level(logging.ERROR, logger="retrieval.serving.auth"):
                access_file.write_text("[identities.team-a\n")
                assert code_of(new.model_info) == grpc.StatusCode.OK
            assert "access file not reloaded" in caplog.text


def test_mutual_tls_identities_and_the_plaintext_health_port(
    retriever: Retriever, access_file: Path, certificates: dict[str, Path]
) -> None:
    files = certificates
    tls = TlsConfig(str(files["server.pem"]), str(files["server.key"]), ca=str(files["ca.pem"]))
    config = local(
        tls=tls, access=AccessConfig(file=str(access_file), health_port=free_port(), reflection=False)
    )
    client_files: dict[str, Any] = {
        "tls_ca": files["ca.pem"],
        "tls_cert": files["client.pem"],
        "tls_key": files["client.key"],
    }
    with started(retriever, config) as server:
        address = f"127.0.0.1:{server.port}"
        # The client certificate's CN ("client") is the identity "service", allowed info only.
        with RetrievalClient(address, retries=0, token="", **client_files) as client:
            assert client.model_info().model_version == "model-v1"
            with pytest.raises(grpc.RpcError) as denied:
                client.retrieve(["item05"], 4)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "identity 'service'" in (denied.value.details() or "")
        # A token over the same connection names another identity.
        with RetrievalClient(address, retries=0, token="token-a", **client_files) as client:
            assert len(client.retrieve(["item05"], 4).items) == 4
        health_address = check_health_ports(server, address, files)
    with pytest.raises(grpc.RpcError):  # stopped with the server
        health_status(health_address)


def test_reflection_can_be_switched_off(retriever: Retriever) -> None:
    with started(retriever, local("access.reflection=false")) as server:
        assert reflection_code(f"127.0.0.1:{server.port}") == grpc.StatusCode.UNIMPLEMENTED
    with started(retriever) as server:
        assert reflection_code(f"127.0.0.1:{server.port}") == grpc.StatusCode.OK


def test_rotated_certificates_serve_new_connections(retriever: Retriever, tmp_path: Path) -> None:
    certificates = Rotation.write(tmp_path)
    first, second = certificates.first, certificates.second
    with started(retriever, local(tls=certificates.tls)) as server:
        address = f"127.0.0.1:{server.port}"

        def code_trusting(ca: Path) -> grpc.StatusCode:
            with RetrievalClient(address, timeout=5, retries=0, tls_ca=ca) as client:  # a new connection
                return code_of(client.model_info)

        assert code_trusting(first["ca.pem"]) == grpc.StatusCode.OK
        assert code_trusting(second["ca.pem"]) == grpc.StatusCode.UNAVAILABLE
        with RetrievalClient(address, retries=0, tls_ca=first["ca.pem"]) as kept:
            kept.model_info()  # a connection made before the rotation
            certificates.rotate("server.pem")
            # Half written: the new certificate with the old key, which gRPC refuses to load.
            assert code_trusting(first["ca.pem"]) == grpc.StatusCode.OK
            certificates.rotate("server.key")
            assert code_trusting(second["ca.pem"]) == grpc.StatusCode.OK
            assert code_trusting(first["ca.pem"]) == grpc.StatusCode.UNAVAILABLE
            assert code_of(kept.model_info) == grpc.StatusCode.OK  # keeps its session


def scrape_status(port: int, credentials: str | None = None, host: str = "127.0.0.1") -> int:
    """The HTTP status of ``GET /metrics`` (with ``user:password`` basic auth if given)."""
    request = urllib.request.Request(f"http://{host}:{port}/metrics")
    if credentials is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(credentials.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            assert b"retrieval_requests" in response.read()
            return int(response.status)
    except urllib.error.HTTPError as e:
        assert e.headers["WWW-Authenticate"] == 'Basic realm="metrics"'
        return e.code


def test_metrics_basic_auth_and_loopback_default() -> None:
    metrics = Metrics()
    port = metrics.serve(0, auth=BasicAuth.parse("prometheus:s3cret:with-colon\n"))
    try:
        assert scrape_status(port) == 401
        assert scrape_status(port, "prometheus:wrong") == 401
        assert scrape_status(port, "someone:s3cret:with-colon") == 401
        assert scrape_status(port, "prometheus:s3cret:with-colon") == 200
        # Bound to 127.0.0.1 only: another loopback address of this machine is not served.
        with pytest.raises(urllib.error.URLError):
            scrape_status(port, "prometheus:s3cret:with-colon", host="127.0.0.2")
    finally:
        metrics.close()
    assert serve_cli.parse_args(["--model", "m", "--index", "i"])[0].metrics.host == "127.0.0.1"
    for text in ("no-colon", ":password", "user:"):
        with pytest.raises(ValueError, match="expected user:password"):
            BasicAuth.parse(text)


def test_serve_command_builds_its_access_control(
    access_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _ = serve_cli.parse_args(["--model", "m", "--index", "i"])
    assert AccessControl.from_config(config) == AccessControl()
    monkeypatch.setenv("METRICS_CREDENTIALS", "prom:pw")
    config, _ = serve_cli.parse_args(
        ["--model", "m", "--index", "i", "--access-file", str(access_file), "--rate-limit", "5",
         "--access-log-sample", "0.5", "--access-log-user-ids", "--health-port", "8081", "--no-reflection",
         "--metrics-port", "9090", "--metrics-auth-env", "METRICS_CREDENTIALS"]
    )  # fmt: skip
    access = AccessControl.from_config(config)
    assert access.identities is not None and access.identities.path == access_file
    assert access.rate_limit is not None and (access.rate_limit.rate, access.rate_limit.burst) == (5, 5)
    assert access.access_log is not None and (access.access_log.sample, access.access_log.user_ids) == (
        0.5,
        True,
    )
    assert (config.access.health_port, config.access.reflection, access.metrics_auth) == (
        8081,
        False,
        BasicAuth("prom", "pw"),
    )
    secret = tmp_path / "metrics-credentials"
    secret.write_text("prom:from-file\n")
    config, _ = serve_cli.parse_args(
        ["--model", "m", "--index", "i", "--metrics-port", "9090", "--metrics-auth-file", str(secret)]
    )
    assert AccessControl.from_config(config).metrics_auth == BasicAuth("prom", "from-file")


@pytest.mark.parametrize(
    "extra",
    [
        ["--rate-limit", "-1"],
        ["--rate-burst", "5"],  # without --rate-limit
        ["--rate-limit", "5", "--rate-burst", "0.5"],
        ["--access-log-sample", "1.5"],
        ["--access-log-user-ids"],  # without a sample
        ["--health-port", "-1"],
        ["--metrics-auth-env", "VAR"],  # without --metrics-port
        ["--metrics-port", "9", "--metrics-auth-env", "VAR", "--metrics-auth-file", "f"],
        ["--token", "secret"],  # tokens never come from the command line
    ],
)
def test_serve_command_refuses_inconsistent_access_flags(extra: list[str]) -> None:
    """A value out of its range (ValueError, an error line) or flags that do not go together
    (argparse's usage error)."""
    with pytest.raises((SystemExit, ValueError)):
        serve_cli.parse_args(["--model", "m", "--index", "i", *extra])
