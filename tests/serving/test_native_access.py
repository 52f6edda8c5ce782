"""Access control on the native engine (issue 44): tokens, permissions and rate limits answered as
the Python engine answers them. The same calls (good, wrong, missing and malformed tokens;
methods an identity may not call; identities and client addresses past their rate) go to both
engines, started by ``mitt serve``'s own path from the same ``ServerConfig``, and are compared:
status codes, messages (but for the milliseconds of a retry, which each engine's own clock
decides), ``grpc-retry-pushback-ms`` trailers, ``GetModelInfo`` as admins and others see it, and
``/metrics`` (``retrieval_refusals_total`` by code, reason and identity, the access file's
errors and staleness). The access file is re-read by both after a change, a typo and a deletion.
Concurrent callers share one bucket, many rounds. Needs ``make native`` (skips without it)."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from bench.serving import free_port
from retrieval.api.client import RetrievalClient
from retrieval.api.v1 import retrieval_pb2
from retrieval.serving import native
from retrieval.serving.access import AccessControl
from retrieval.serving.auth import AccessFile
from retrieval.serving.config import AccessConfig, LimitsConfig, ServerConfig, TlsConfig
from retrieval.serving.metrics import Metrics
from retrieval.serving.native_server import create_native_server
from retrieval.serving.retriever import Retriever
from retrieval.serving.server import StartedServer, create_server
from tests.helpers import ITEMS, local, scrape, write_certificates
from tests.serving.helpers import ACCESS as TEAMS_ACCESS
from tests.serving.helpers import (
    OPS_TOKEN_ENV,
    Rotation,
    check_health_ports,
    code_of,
    health_status,
    toy_servable,
)

ACCESS = (
    TEAMS_ACCESS
    + """
[identities.slow]
tokens = ["token-slow"]
permissions = ["retrieve"]
rate = 0.0001
burst = 2

[identities.free]
tokens = ["token-free"]
permissions = ["retrieve", "info"]
rate = 0
"""
)

RATE = 0.0001
"""The server's rate limit: no token comes back while a test runs (one every 10,000 s)."""

PUSHBACK = "grpc-retry-pushback-ms"
SERVICE = "/retrieval.v1.RetrievalService/"
RETRY_IN = re.compile(r"retry in \d+ ms")

Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Answer:
    """What a call got: its code, message (a retry's milliseconds masked), pushback (ms) and answer."""

    code: grpc.StatusCode
    details: str
    pushback: int | None
    body: bytes | None


@pytest.fixture(autouse=True)
def built(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        native.native_module()
    except native.NativeEngineMissing as e:
        pytest.skip(f"{e}")
    monkeypatch.setenv(OPS_TOKEN_ENV, "token-ops")


@contextmanager
def both(retriever: Retriever, access: AccessConfig) -> Iterator[dict[str, tuple[grpc.Channel, int]]]:
    """A server of each engine for ``access``, each with its metrics: engine -> (channel, metrics
    port)."""
    found = {}
    with ExitStack() as stack:
        for engine in ("python", "native"):
            config = local(engine=engine, access=access)
            metrics = Metrics()
            port = metrics.serve(0)
            stack.callback(metrics.close)
            server: StartedServer
            if engine == "native":
                server, bound = create_native_server(retriever, config, metrics=metrics)
            else:
                server, bound = create_server(retriever, config, metrics=metrics)
            stack.callback(stopped, server)
            channel = stack.enter_context(grpc.insecure_channel(f"127.0.0.1:{bound}"))
            grpc.channel_ready_future(channel).result(timeout=10)
            found[engine] = (channel, port)
        yield found


def stopped(server: StartedServer) -> None:
    server.stop(None).wait(30)


def config(
    access_file: Path | None = None, rate: float = 0.0, burst: float | None = None, reflection: bool = False
) -> AccessConfig:
    return AccessConfig(
        file=None if access_file is None else str(access_file),
        rate_limit=rate,
        rate_burst=burst,
        reflection=reflection,
    )


def request(method: str) -> bytes:
    """A good request of ``method``."""
    if method == "Retrieve":
        return retrieval_pb2.RetrieveRequest(history=ITEMS[:3], k=5).SerializeToString()
    if method == "BatchRetrieve":
        one = retrieval_pb2.RetrieveRequest(history=ITEMS[4:6], k=3)
        return retrieval_pb2.BatchRetrieveRequest(requests=[one, one]).SerializeToString()
    return retrieval_pb2.GetModelInfoRequest().SerializeToString()


def call(channel: grpc.Channel, method: str, metadata: Metadata = ()) -> Answer:
    """``method`` with a good request and ``metadata``, as raw bytes."""
    send = channel.unary_unary(SERVICE + method, None, None)
    try:
        body, rpc = send.with_call(request(method), metadata=metadata, timeout=30)
    except grpc.RpcError as e:
        error: Any = e  # a grpc.Call too
        pushback = dict(error.trailing_metadata() or ()).get(PUSHBACK)
        details = RETRY_IN.sub("retry in N ms", error.details() or "")
        return Answer(error.code(), details, None if pushback is None else int(pushback), None)
    assert PUSHBACK not in dict(rpc.trailing_metadata() or ())
    return Answer(grpc.StatusCode.OK, "", None, body)


def bearer(token: str) -> Metadata:
    return (("authorization", f"Bearer {token}"),)


CREDENTIALS: dict[str, Metadata] = {
    "none": (),
    "team-a": bearer("token-a"),
    "team-b (sha256)": bearer("token-b"),
    "ops (env)": bearer("token-ops"),
    "free": bearer("token-free"),
    "wrong": bearer("token-c"),
    "lower-case scheme, spaces": (("authorization", "bearer   token-a  "),),
    "basic scheme": (("authorization", "Basic dG9rZW4tYQ=="),),
    "scheme alone": (("authorization", "Bearer"),),
    "blank token": (("authorization", "Bearer    "),),
    "first bearer entry": (("authorization", "Basic x"), ("authorization", "Bearer token-a")),
    "two bearer entries": (("authorization", "Bearer token-b"), ("authorization", "Bearer token-a")),
    "other metadata": (("x-token", "token-a"),),
}
"""Metadata to send, by what it is."""

METHODS = ("Retrieve", "BatchRetrieve", "GetModelInfo")


def refusals(port: int) -> dict[tuple[tuple[str, str], ...], float]:
    """``retrieval_refusals_total``'s samples by labels, and the access file's two samples."""
    wanted = ("retrieval_refusals_total", "retrieval_access_file_errors_total", "retrieval_access_file_stale")
    return {
        (("name", name), *labels): value for (name, labels), value in scrape(port).items() if name in wanted
    }


def assert_same_answers(
    found: dict[str, tuple[grpc.Channel, int]], sent: Sequence[tuple[str, Metadata]]
) -> list[Answer]:
    """Sends each ``(method, metadata)`` of ``sent`` to both engines in turn: the same answers
    (``GetModelInfo`` as the same message; the retrievals' ids and answers compared by the
    parity tests); returns the Python engine's."""
    answers = []
    for method, metadata in sent:
        python, ours = (call(found[engine][0], method, metadata) for engine in ("python", "native"))
        what = f"{method} with {metadata}"
        assert (ours.code, ours.details) == (python.code, python.details), what
        assert (ours.pushback is None) == (python.pushback is None), what
        if method == "GetModelInfo" and python.body is not None:
            assert ours.body is not None
            assert retrieval_pb2.ModelInfo.FromString(ours.body) == retrieval_pb2.ModelInfo.FromString(
                python.body
            )
        answers.append(python)
    return answers


def assert_same_metrics(
    found: dict[str, tuple[grpc.Channel, int]],
) -> dict[tuple[tuple[str, str], ...], float]:
    """Both engines' refusal counts (and access file samples) are equal; returns them."""
    python, ours = (refusals(found[engine][1]) for engine in ("python", "native"))
    assert ours == python
    return python


def test_tokens_and_permissions_are_answered_as_the_python_engine_answers_them(
    retriever: Retriever, tmp_path: Path
) -> None:
    access_file = tmp_path / "access.toml"
    access_file.write_text(ACCESS)
    with both(retriever, config(access_file)) as found:
        sent = [(method, metadata) for metadata in CREDENTIALS.values() for method in METHODS]
        answers = dict(zip(sent, assert_same_answers(found, sent), strict=True))
        counted = assert_same_metrics(found)
    codes = {
        (method, name): answers[(method, CREDENTIALS[name])].code
        for method in METHODS
        for name in CREDENTIALS
    }
    # Worked out from the file: team-a retrieves and reads info, team-b only reads info.
    assert codes[("Retrieve", "team-a")] == codes[("GetModelInfo", "team-b (sha256)")] == grpc.StatusCode.OK
    assert codes[("BatchRetrieve", "team-b (sha256)")] == grpc.StatusCode.PERMISSION_DENIED
    assert (
        codes[("Retrieve", "ops (env)")]
        == codes[("Retrieve", "lower-case scheme, spaces")]
        == grpc.StatusCode.OK
    )
    assert codes[("Retrieve", "first bearer entry")] == grpc.StatusCode.OK
    assert codes[("Retrieve", "two bearer entries")] == grpc.StatusCode.PERMISSION_DENIED  # the first: team-b
    for name in ("none", "basic scheme", "scheme alone", "blank token", "other metadata"):
        assert answers[("Retrieve", CREDENTIALS[name])].details.startswith("missing credentials"), name
    assert answers[("GetModelInfo", CREDENTIALS["wrong"])].details == "invalid bearer token"
    denied = answers[("BatchRetrieve", CREDENTIALS["team-b (sha256)"])].details
    assert denied == "identity 'team-b' may not call BatchRetrieve (needs permission 'retrieve')"
    key = (("name", "retrieval_refusals_total"), ("code", "UNAUTHENTICATED"), ("identity", ""))
    assert counted[(*key, ("method", "Retrieve"), ("reason", "missing_credentials"))] == 5
    assert counted[(*key, ("method", "Retrieve"), ("reason", "invalid_token"))] == 1
    denied_key = (("code", "PERMISSION_DENIED"), ("identity", "team-b"), ("method", "BatchRetrieve"))
    # team-b's own token, and two tokens of which team-b's comes first
    assert counted[(("name", "retrieval_refusals_total"), *denied_key, ("reason", "permission"))] == 2


def test_rate_limits_refuse_the_same_calls_with_the_same_pushback(
    retriever: Retriever, tmp_path: Path
) -> None:
    """Identities past their burst (the server's 3, or their own), unidentified callers past their
    address's, a call refused its permission taking no token, an unlimited identity."""
    access_file = tmp_path / "access.toml"
    access_file.write_text(ACCESS)
    wrong, slow, team_b = CREDENTIALS["wrong"], bearer("token-slow"), CREDENTIALS["team-b (sha256)"]
    sent = [
        *[("GetModelInfo", slow)] * 3,  # slow may not: refused its permission, no token taken
        *[("Retrieve", slow)] * 4,  # its own burst of 2, then its own rate
        *[("GetModelInfo", team_b)] * 5,  # the server's burst of 3
        *[("Retrieve", wrong)] * 5,  # 3 refused UNAUTHENTICATED, then 127.0.0.1's bucket is empty
        ("Retrieve", CREDENTIALS["none"]),
        *[("Retrieve", CREDENTIALS["free"])] * 10,  # rate 0: unlimited
    ]
    with both(retriever, config(access_file, rate=RATE, burst=3)) as found:
        answers = assert_same_answers(found, sent)
        pushbacks = {engine: [call(found[engine][0], "Retrieve", slow).pushback] for engine in found}
        counted = assert_same_metrics(found)
    codes = [a.code.name for a in answers]
    assert codes == [
        *["PERMISSION_DENIED"] * 3,
        *["OK"] * 2,
        *["RESOURCE_EXHAUSTED"] * 2,
        *["OK"] * 3,
        *["RESOURCE_EXHAUSTED"] * 2,
        *["UNAUTHENTICATED"] * 3,
        *["RESOURCE_EXHAUSTED"] * 3,
        *["OK"] * 10,
    ]
    limit = "rate limit of 0.0001 requests/s"
    assert answers[5].details == f"{limit} (burst 2) for identity 'slow' exceeded, retry in N ms"
    assert answers[10].details == f"{limit} (burst 3) for identity 'team-b' exceeded, retry in N ms"
    assert (
        answers[15].details
        == f"{limit} (burst 3) for unauthenticated calls from 127.0.0.1 exceeded, retry in N ms"
    )
    # A token every 10,000 s: the next is (1 - what was earned) / rate away, a bit under 10^7 ms.
    for engine, (pushback,) in pushbacks.items():
        assert pushback is not None and 9_990_000 <= pushback <= 10_000_000, engine
    labels = (("name", "retrieval_refusals_total"), ("code", "RESOURCE_EXHAUSTED"))
    assert counted[(*labels, ("identity", "slow"), ("method", "Retrieve"), ("reason", "rate_limit"))] == 3
    assert counted[(*labels, ("identity", ""), ("method", "Retrieve"), ("reason", "rate_limit"))] == 3


def test_without_an_access_file_each_client_address_has_a_bucket(retriever: Retriever) -> None:
    sent = [(method, ()) for method in METHODS for _ in range(2)]
    with both(retriever, config(rate=RATE, burst=4.0)) as found:
        answers = assert_same_answers(found, sent)
        counted = assert_same_metrics(found)
    assert [a.code.name for a in answers] == ["OK"] * 4 + ["RESOURCE_EXHAUSTED"] * 2
    assert answers[-1].details == (
        "rate limit of 0.0001 requests/s (burst 4) for identity '127.0.0.1' exceeded, retry in N ms"
    )
    labels = (
        ("code", "RESOURCE_EXHAUSTED"),
        ("identity", ""),
        ("method", "GetModelInfo"),
        ("reason", "rate_limit"),
    )
    assert {key: n for key, n in counted.items() if n} == {(("name", "retrieval_refusals_total"), *labels): 2}


def reflect(channel: grpc.Channel, metadata: Metadata) -> Answer:
    """Lists the services by server reflection; the answer's body: their names, sorted."""
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    try:
        answers = list(stub.ServerReflectionInfo(iter([request]), metadata=metadata, timeout=30))
    except grpc.RpcError as e:
        error: Any = e  # a grpc.Call too
        pushback = dict(error.trailing_metadata() or ()).get(PUSHBACK)
        details = RETRY_IN.sub("retry in N ms", error.details() or "")
        return Answer(error.code(), details, None if pushback is None else int(pushback), None)
    names = sorted(s.name for a in answers for s in a.list_services_response.service)
    return Answer(grpc.StatusCode.OK, "", None, " ".join(names).encode())


def test_server_reflection_is_checked_as_the_python_engine_checks_it(
    retriever: Retriever, tmp_path: Path
) -> None:
    """Reflection needs the ``info`` permission and takes a token, from its metadata alone."""
    access_file = tmp_path / "access.toml"
    access_file.write_text(ACCESS)
    sent = [
        CREDENTIALS["none"],
        CREDENTIALS["wrong"],
        bearer("token-slow"),  # retrieve only
        *[CREDENTIALS["team-b (sha256)"]] * 4,  # info: the server's burst of 3, then its rate
    ]
    with both(retriever, config(access_file, rate=RATE, burst=3, reflection=True)) as found:
        answers = {
            engine: [reflect(channel, metadata) for metadata in sent]
            for engine, (channel, _) in found.items()
        }
        counted = assert_same_metrics(found)
    python, ours = answers["python"], answers["native"]
    assert [(a.code, a.details, a.pushback is None) for a in ours] == [
        (a.code, a.details, a.pushback is None) for a in python
    ]
    assert [a.code.name for a in python] == [
        "UNAUTHENTICATED",
        "UNAUTHENTICATED",
        "PERMISSION_DENIED",
        *["OK"] * 3,
        "RESOURCE_EXHAUSTED",
    ]
    assert python[2].details == "identity 'slow' may not call ServerReflectionInfo (needs permission 'info')"
    for got in (python[3], ours[3]):
        assert got.body is not None and b"retrieval.v1.RetrievalService" in got.body
    labels = (("name", "retrieval_refusals_total"), ("code", "RESOURCE_EXHAUSTED"), ("identity", "team-b"))
    assert counted[(*labels, ("method", "ServerReflectionInfo"), ("reason", "rate_limit"))] == 1


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0, every: float = 0.05) -> None:
    """Waits until ``check()``, looking every ``every`` seconds (both engines re-read the file
    within about a second)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not seen within {timeout} s: {what}"
        time.sleep(every)


def test_the_access_file_is_reread_and_a_bad_one_leaves_the_last_good_in_force(
    retriever: Retriever, tmp_path: Path
) -> None:
    """A token revoked and one added apply on both; a typo, then a deletion, keep the last good
    identities, set ``access_file_error`` (whole for ``admin``, cut for the others) and count an
    error each; a good file again clears it."""
    access_file = tmp_path / "access.toml"
    access_file.write_text(ACCESS)
    team_a, ops, team_b = CREDENTIALS["team-a"], CREDENTIALS["ops (env)"], CREDENTIALS["team-b (sha256)"]
    infos = [("GetModelInfo", ops), ("GetModelInfo", team_a), ("Retrieve", team_a)]
    with both(retriever, config(access_file)) as found:

        def everywhere(metadata: Metadata, code: grpc.StatusCode) -> Callable[[], bool]:
            return lambda: all(call(found[e][0], "Retrieve", metadata).code == code for e in found)

        changed = ACCESS.replace('tokens = ["token-a"]', 'tokens = ["token-a2"]')
        access_file.write_text(changed)
        wait_for(everywhere(bearer("token-a2"), grpc.StatusCode.OK), "the new token")
        wait_for(everywhere(team_a, grpc.StatusCode.UNAUTHENTICATED), "the old token revoked")
        assert_same_answers(found, [("Retrieve", team_a), ("Retrieve", bearer("token-a2"))])

        access_file.write_text(changed + "\n[identities.broken\n")
        wait_for(lambda: sampled(found, STALE) == {1}, "the typo")
        answers = assert_same_answers(found, [("GetModelInfo", ops), ("GetModelInfo", team_b)])
        whole, cut = (retrieval_pb2.ModelInfo.FromString(a.body or b"").access_file_error for a in answers)
        assert str(access_file) in whole and str(access_file) not in cut and cut.startswith("access.toml")
        still = call(found["native"][0], "Retrieve", bearer("token-a2"))  # the last good file in force
        assert still.code == grpc.StatusCode.OK
        assert sampled(found, ERRORS) == {1}

        access_file.unlink()
        wait_for(lambda: sampled(found, ERRORS) == {2}, "the deletion")
        assert_same_answers(found, [*infos, ("Retrieve", bearer("token-a2"))])

        access_file.write_text(ACCESS)
        wait_for(lambda: sampled(found, STALE) == {0}, "the good file")
        assert_same_answers(found, [*infos, ("Retrieve", bearer("token-a2"))])
        # The refusals' counts differ by the calls of the waits; the file's errors do not.
        assert sampled(found, ERRORS) == {2}


STALE = (("name", "retrieval_access_file_stale"),)
ERRORS = (("name", "retrieval_access_file_errors_total"),)


def sampled(found: dict[str, tuple[grpc.Channel, int]], sample: tuple[tuple[str, str], ...]) -> set[float]:
    """``sample``'s values on both engines, each after a call (the Python engine reads the file on
    its calls, the native one in a thread of its own)."""
    for channel, _ in found.values():
        call(channel, "GetModelInfo")
    return {refusals(port).get(sample, -1.0) for _, port in found.values()}


@pytest.mark.slow
@pytest.mark.parametrize("round_", range(20))
def test_concurrent_callers_share_their_buckets_exactly(
    retriever: Retriever, tmp_path: Path, round_: int
) -> None:
    """6 threads, 60 calls of three identities at once (team-b's burst 8, slow's 2, free without
    limit) and 12 with a wrong token: on each engine exactly the bursts are answered, each refusal
    counted once, by identity."""
    access_file = tmp_path / "access.toml"
    access_file.write_text(ACCESS)
    sent = [
        *[("GetModelInfo", CREDENTIALS["team-b (sha256)"])] * 20,
        *[("Retrieve", bearer("token-slow"))] * 20,
        *[("Retrieve", CREDENTIALS["free"])] * 20,
        *[("Retrieve", CREDENTIALS["wrong"])] * 12,
    ]
    with both(retriever, config(access_file, rate=RATE, burst=8)) as found:
        for engine, (channel, _) in found.items():
            with ThreadPoolExecutor(6) as pool:
                answers = list(pool.map(call, [channel] * len(sent), *zip(*sent, strict=True)))
            got = Counter(
                (method, dict(metadata).get("authorization"), a.code.name)
                for (method, metadata), a in zip(sent, answers, strict=True)
            )
            assert got == {
                ("GetModelInfo", "Bearer token-b", "OK"): 8,
                ("GetModelInfo", "Bearer token-b", "RESOURCE_EXHAUSTED"): 12,
                ("Retrieve", "Bearer token-slow", "OK"): 2,
                ("Retrieve", "Bearer token-slow", "RESOURCE_EXHAUSTED"): 18,
                ("Retrieve", "Bearer token-free", "OK"): 20,
                ("Retrieve", "Bearer token-c", "UNAUTHENTICATED"): 8,
                ("Retrieve", "Bearer token-c", "RESOURCE_EXHAUSTED"): 4,
            }, engine
        counted = assert_same_metrics(found)
    labels = (("name", "retrieval_refusals_total"), ("code", "RESOURCE_EXHAUSTED"))
    assert (
        counted[(*labels, ("identity", "team-b"), ("method", "GetModelInfo"), ("reason", "rate_limit"))] == 12
    )


@pytest.mark.parametrize("engine", ["python", "native"])
def test_mutual_tls_identities_and_the_plaintext_health_port(
    engine: str, retriever: Retriever, tmp_path: Path
) -> None:
    """A client certificate's CN names an identity, a token over the same connection another; the
    health port answers health alone, in plaintext, with the main port's status, and stops with
    it. Both engines give the same answers (the expected ones are the Python engine's test's)."""
    files = write_certificates(tmp_path)
    access_file = tmp_path / "access.toml"
    access_file.write_text(ACCESS)
    access = AccessConfig(file=str(access_file), health_port=free_port(), reflection=False)
    tls = TlsConfig(str(files["server.pem"]), str(files["server.key"]), ca=str(files["ca.pem"]))
    server, port = start(engine, retriever, local(engine=engine, tls=tls, access=access))
    address = f"127.0.0.1:{port}"
    mutual: dict[str, Any] = {
        "tls_ca": files["ca.pem"],
        "tls_cert": files["client.pem"],
        "tls_key": files["client.key"],
    }
    try:
        with RetrievalClient(address, retries=0, token="", **mutual) as client:  # identity "service"
            assert client.model_info().model_version == "model-v1"
            with pytest.raises(grpc.RpcError) as denied:
                client.retrieve(["item05"], 4)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert (
            denied.value.details() == "identity 'service' may not call Retrieve (needs permission 'retrieve')"
        )
        with RetrievalClient(address, retries=0, token="token-a", **mutual) as client:
            assert len(client.retrieve(["item05"], 4).items) == 4
        with RetrievalClient(address, retries=0, token="", tls_ca=files["ca.pem"]) as anonymous:
            assert code_of(anonymous.model_info) == grpc.StatusCode.UNAVAILABLE  # no client certificate
        health_address = check_health_ports(server, address, files)
    finally:
        server.stop(None).wait(30)
    with pytest.raises(grpc.RpcError):  # stopped with the server
        health_status(health_address)


def start(engine: str, retriever: Retriever, config: ServerConfig) -> tuple[StartedServer, int]:
    if engine == "native":
        return create_native_server(retriever, config)
    return create_server(retriever, config)


def test_rotated_certificates_serve_new_connections(retriever: Retriever, tmp_path: Path) -> None:
    """The native engine's TLS files are re-read when they change (within a second or two): new
    connections get the new certificate, a half-written rotation keeps the pair in use, a
    connection made before keeps its session."""
    certificates = Rotation.write(tmp_path)
    first, second = certificates.first, certificates.second
    server, port = start("native", retriever, local(engine="native", tls=certificates.tls))
    address = f"127.0.0.1:{port}"

    def code_trusting(ca: Path) -> grpc.StatusCode:
        with RetrievalClient(address, timeout=5, retries=0, tls_ca=ca) as client:  # a new connection
            return code_of(client.model_info)

    try:
        assert code_trusting(first["ca.pem"]) == grpc.StatusCode.OK
        assert code_trusting(second["ca.pem"]) == grpc.StatusCode.UNAVAILABLE
        with RetrievalClient(address, retries=0, tls_ca=first["ca.pem"]) as kept:
            kept.model_info()  # a connection made before the rotation
            certificates.rotate("server.pem")
            time.sleep(2.5)  # gRPC's file watcher has looked (every second)
            # Half written: the new certificate with the old key, which gRPC refuses to load.
            assert code_trusting(first["ca.pem"]) == grpc.StatusCode.OK
            certificates.rotate("server.key")
            wait_for(lambda: code_trusting(second["ca.pem"]) == grpc.StatusCode.OK, "the new certificate")
            assert code_trusting(first["ca.pem"]) == grpc.StatusCode.UNAVAILABLE
            assert code_of(kept.model_info) == grpc.StatusCode.OK  # keeps its session
    finally:
        server.stop(None).wait(30)


@pytest.mark.parametrize("with_file", [True, False])
def test_the_access_log_writes_the_python_engines_lines(
    retriever: Retriever, tmp_path: Path, caplog: pytest.LogCaptureFixture, with_file: bool
) -> None:
    """Every call sampled (``--access-log-sample 1``, with user ids): the same fields in the same
    order on both engines (the latency aside), the caller's request id or a generated one, sent
    back in the ``x-request-id`` trailer of every call, one over ``--max-request-mb`` too; without
    an access file the identity is the client's address."""
    access_file = tmp_path / "access.toml"
    access_file.write_text(ACCESS)
    access = AccessConfig(
        file=str(access_file) if with_file else None, log_sample=1.0, log_user_ids=True, reflection=False
    )
    one = retrieval_pb2.RetrieveRequest(history=ITEMS[:3], k=5, user_id="u1")
    batch = retrieval_pb2.BatchRetrieveRequest(
        requests=[one, retrieval_pb2.RetrieveRequest(history=ITEMS[4:6], k=3, user_id="u3")]
    )
    oversized = retrieval_pb2.RetrieveRequest(
        history=ITEMS[:3], k=5, exclude_ids=[f"x{i:07d}" for i in range(8000)]
    )
    team_a, team_b = CREDENTIALS["team-a"], CREDENTIALS["team-b (sha256)"]
    sent: list[tuple[str, Message, Metadata]] = [
        ("Retrieve", one, (*team_a, ("x-request-id", "abc"))),
        ("BatchRetrieve", batch, team_a),
        ("Retrieve", retrieval_pb2.RetrieveRequest(history=ITEMS[:2], k=0, user_id="u2"), team_a),
        ("GetModelInfo", retrieval_pb2.GetModelInfoRequest(), team_b),
        ("Retrieve", one, team_b),  # denied: its identity, nothing of its request
        ("Retrieve", oversized, team_a),  # ~80 KB over 64 KiB: refused unread
        ("Retrieve", one, CREDENTIALS["wrong"]),  # not identified
        ("Retrieve", one, (*team_a, ("x-request-id", "x" * 129))),  # too long: one is generated
    ]
    lines, trailers = {}, {}
    for engine in ("python", "native"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="retrieval.access"):
            limits = LimitsConfig(max_request_mb=1 / 16)
            server, port = start(engine, retriever, local(engine=engine, access=access, limits=limits))
            try:
                with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                    trailers[engine] = [request_id(channel, *one) for one in sent]
            finally:
                server.stop(None).wait(30)  # every line is written (the native engine's every 50 ms)
        records = [r for r in caplog.records if r.name == "retrieval.access"]
        lines[engine] = [dict(getattr(r, "fields")) for r in records]  # noqa: B009 (set by AccessLog.write)
    # grpcio refuses the oversized call before the Python engine's handler sets its trailers.
    assert [i for i, trailer in enumerate(trailers["python"]) if trailer is None] == [5]
    assert None not in trailers["native"]
    for engine in lines:
        for line, trailer in zip(lines[engine], trailers[engine], strict=True):
            assert line.pop("request_id") == trailer or trailer is None
            assert line.pop("latency_ms") >= 0
        assert trailers[engine][0] == "abc" and re.fullmatch("[0-9a-f]{32}", trailers[engine][-1])
    assert lines["native"] == lines["python"]
    if not with_file:
        assert {line["identity"] for line in lines["python"]} == {"127.0.0.1"}
        return
    assert lines["python"][1] == {
        "identity": "team-a",
        "method": "BatchRetrieve",
        "history_len": 5,
        "k": 8,
        "batch": 2,
        "user_id": ["u1", "u3"],
        "code": "OK",
        "model_version": "model-v1",
    }
    assert lines["python"][4] == {
        "identity": "team-b",
        "method": "Retrieve",
        "code": "PERMISSION_DENIED",
        "model_version": None,
    }
    assert lines["python"][5] == {
        "identity": "team-a",
        "method": "Retrieve",
        "code": "RESOURCE_EXHAUSTED",
        "model_version": None,
    }


def request_id(channel: grpc.Channel, method: str, body: Message, metadata: Metadata) -> str | None:
    """Sends ``body`` to ``method``: the ``x-request-id`` trailer it gets, whatever its status
    (``None``: none)."""
    send = channel.unary_unary(SERVICE + method, None, None)
    ended: Any  # a grpc.Call: the answered call, or the error of a failed one
    try:
        _, ended = send.with_call(body.SerializeToString(), metadata=metadata, timeout=30)
    except grpc.RpcError as e:
        ended = e
    trailer = dict(ended.trailing_metadata() or ()).get("x-request-id")
    return None if trailer is None else str(trailer)


def answered(channel: grpc.Channel, code: str) -> bool:
    """Whether team-a's call is answered ``code`` now."""
    return call(channel, "GetModelInfo", CREDENTIALS["team-a"]).code.name == code


@pytest.mark.slow
@pytest.mark.parametrize("round_", range(20))
def test_identities_swapped_under_load_answer_every_call_with_one_or_the_other(
    tmp_path: Path, round_: int
) -> None:
    """4 callers with team-a's token while the access file loses and regains it 6 times (re-read
    every 20 ms): every call is answered OK or UNAUTHENTICATED, never anything else, and each state
    is seen once it is in force."""
    access_file = tmp_path / "access.toml"
    without = ACCESS.replace('tokens = ["token-a"]', 'tokens = ["token-a2"]')
    access_file.write_text(ACCESS)
    access = AccessControl(identities=AccessFile(access_file, check_interval=0.02))
    server = native.NativeServer(toy_servable(), access=access)
    address = f"127.0.0.1:{server.start()}"
    codes: Counter[str] = Counter()
    stop = threading.Event()

    def calls() -> None:
        with grpc.insecure_channel(address) as channel:
            while not stop.is_set():
                codes[call(channel, "GetModelInfo", CREDENTIALS["team-a"]).code.name] += 1

    try:
        with ThreadPoolExecutor(4) as pool:
            callers = [pool.submit(calls) for _ in range(4)]
            with grpc.insecure_channel(address) as channel:
                for text, code in [(without, "UNAUTHENTICATED"), (ACCESS, "OK")] * 6:
                    access_file.write_text(text)
                    # Re-read every 20 ms: a look every 5 ms (a call each) sees it soon after.
                    wait_for(partial(answered, channel, code), code, every=0.005)
            stop.set()
            for caller in callers:
                caller.result(timeout=30)
    finally:
        stop.set()
        server.stop(0)
    assert set(codes) == {"OK", "UNAUTHENTICATED"}, codes
