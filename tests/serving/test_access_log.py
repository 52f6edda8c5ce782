"""The access log of a real server: one line per request with its fields (``user_id`` only when
asked), request ids taken from the caller or generated and returned in the trailing metadata,
refusals logged with who was refused, sampling, and JSON lines under ``--log-format json``."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from retrieval.api.client import RetrievalClient, request_id
from retrieval.api.types import Query
from retrieval.api.v1 import retrieval_pb2, retrieval_pb2_grpc
from retrieval.serving.access import AccessControl
from retrieval.serving.access_log import AccessLog, logfmt
from retrieval.serving.auth import AccessFile
from retrieval.serving.logs import JsonFormatter
from retrieval.serving.retriever import Retriever
from retrieval.serving.server import create_server
from tests.helpers import local

GENERATED_ID = re.compile(r"[0-9a-f]{32}")


@contextmanager
def logged(retriever: Retriever, caplog: pytest.LogCaptureFixture, **access: Any) -> Iterator[str]:
    """A server with ``AccessControl(**access)``, its access log captured; yields its address."""
    server, port = create_server(retriever, local(), access=AccessControl(**access))
    with caplog.at_level(logging.INFO, logger="retrieval.access"):
        try:
            yield f"127.0.0.1:{port}"
        finally:
            # Drained before the level drops: a loaded machine may write a call's line after
            # its answer reached the client.
            server.stop(grace=10).wait(timeout=30)


def access_records(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.fields for r in caplog.records if r.name == "retrieval.access"]  # type: ignore[attr-defined]


def test_each_request_is_logged_with_its_fields(
    retriever: Retriever, caplog: pytest.LogCaptureFixture
) -> None:
    with logged(retriever, caplog, access_log=AccessLog()) as address:
        with RetrievalClient(address, retries=0, metadata=[("x-request-id", "req-1")]) as client:
            client.retrieve(["item01", "item02", "item03"], 4, user_id="user-7")
            client.batch_retrieve([Query(["item01"], 3, user_id="user-8"), Query(["item02", "item03"], 5)])
            with pytest.raises(grpc.RpcError) as invalid:
                client.retrieve(["item01"], 0)
        assert request_id(invalid.value) == "req-1"
        with RetrievalClient(address, retries=0) as client:
            client.model_info()
    lines = access_records(caplog)
    assert len(lines) == 4
    for line in lines:
        assert line["identity"] == "127.0.0.1" and line["latency_ms"] >= 0 and "user_id" not in line
    assert {
        key: lines[0][key] for key in ("request_id", "method", "history_len", "k", "code", "model_version")
    } == {
        "request_id": "req-1",
        "method": "Retrieve",
        "history_len": 3,
        "k": 4,
        "code": "OK",
        "model_version": "model-v1",
    }
    assert (lines[1]["method"], lines[1]["batch"], lines[1]["history_len"], lines[1]["k"]) == (
        "BatchRetrieve",
        2,
        3,
        8,
    )
    assert (lines[2]["code"], lines[2]["k"], lines[2]["model_version"]) == ("INVALID_ARGUMENT", 0, None)
    assert lines[3]["method"] == "GetModelInfo" and "k" not in lines[3]
    assert GENERATED_ID.fullmatch(lines[3]["request_id"])
    # Text: key=value pairs; JSON (--log-format json): the fields beside time, level, logger.
    record = next(r for r in caplog.records if r.name == "retrieval.access")
    assert record.getMessage().startswith(
        "request_id=req-1 identity=127.0.0.1 method=Retrieve history_len=3 k=4"
    )
    entry = json.loads(JsonFormatter().format(record))
    assert entry["logger"] == "retrieval.access" and entry["model_version"] == "model-v1"
    assert entry["k"] == 4 and entry["code"] == "OK"


def test_user_ids_are_logged_only_when_asked(retriever: Retriever, caplog: pytest.LogCaptureFixture) -> None:
    with (
        logged(retriever, caplog, access_log=AccessLog(user_ids=True)) as address,
        RetrievalClient(address, retries=0) as client,
    ):
        client.retrieve(["item01"], 4, user_id="user 7")
        client.batch_retrieve([Query(["item01"], 3, user_id="user-8"), Query(["item02"], 5)])
    lines = access_records(caplog)
    assert [line["user_id"] for line in lines] == ["user 7", ["user-8", ""]]
    assert 'user_id="user 7"' in caplog.records[0].getMessage()


def test_the_request_id_comes_back_in_the_trailing_metadata(retriever: Retriever) -> None:
    server, port = create_server(retriever, local(), access=AccessControl(access_log=AccessLog(sample=0.01)))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)  # type: ignore[no-untyped-call]
            request = retrieval_pb2.GetModelInfoRequest()
            _, call = stub.GetModelInfo.with_call(request, timeout=10, metadata=[("x-request-id", "abc")])
            assert dict(call.trailing_metadata())["x-request-id"] == "abc"
            _, call = stub.GetModelInfo.with_call(request, timeout=10)  # sampled out or not: an id
            assert GENERATED_ID.fullmatch(dict(call.trailing_metadata())["x-request-id"])
            _, call = stub.GetModelInfo.with_call(request, timeout=10, metadata=[("x-request-id", "x" * 129)])
            assert GENERATED_ID.fullmatch(dict(call.trailing_metadata())["x-request-id"])  # too long
    finally:
        server.stop(None)
    # Without an access log, calls get no id.
    server, port = create_server(retriever, local(), access=AccessControl())
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)  # type: ignore[no-untyped-call]
            _, call = stub.GetModelInfo.with_call(retrieval_pb2.GetModelInfoRequest(), timeout=10)
            assert "x-request-id" not in dict(call.trailing_metadata())
    finally:
        server.stop(None)


def test_refused_calls_are_logged_with_who_was_refused(
    retriever: Retriever, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    access_file = tmp_path / "access.toml"
    access_file.write_text('[identities.reader]\ntokens = ["r"]\npermissions = ["info"]\n')
    access = {"identities": AccessFile(access_file), "access_log": AccessLog()}
    with logged(retriever, caplog, **access) as address:
        for token in ("", "r"):
            with RetrievalClient(address, retries=0, token=token) as client, pytest.raises(grpc.RpcError):
                client.retrieve(["item01"], 4)
    lines = access_records(caplog)
    assert [(line["identity"], line["code"]) for line in lines] == [
        (None, "UNAUTHENTICATED"),
        ("reader", "PERMISSION_DENIED"),
    ]


def test_sampling_logs_about_the_share_asked(retriever: Retriever, caplog: pytest.LogCaptureFixture) -> None:
    log = AccessLog(sample=0.25)
    with caplog.at_level(logging.INFO, logger="retrieval.access"):
        drawn = sum(log.sampled() for _ in range(20_000))
    assert 4_000 <= drawn <= 6_000  # 5000 expected, standard deviation 61
    with (
        logged(retriever, caplog, access_log=AccessLog(sample=0.5)) as address,
        RetrievalClient(address, retries=0) as client,
    ):
        for _ in range(60):
            client.model_info()
    assert 5 <= len(access_records(caplog)) <= 55  # 30 expected, standard deviation 3.9
    with caplog.at_level(logging.WARNING, logger="retrieval.access"):
        assert not AccessLog().sampled()  # the logger would drop the line: nothing is prepared
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        AccessLog(sample=0)


@pytest.mark.parametrize(
    ("value", "written"),
    [("abc", "abc"), ("a b", '"a b"'), ("", '""'), ('say "hi"', '"say \\"hi\\""'), (None, "null"), (3, "3")],
)
def test_logfmt_quotes_what_needs_it(value: Any, written: str) -> None:
    assert logfmt(value) == written
