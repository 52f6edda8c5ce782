"""The retriever, index artifact and gRPC server against brute force, on a real server bound to port 0."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from bench.serving import free_port
from index import FaissIndex
from retrieval.api.client import RetrievalClient
from retrieval.api.convert import SERVICE_NAME
from retrieval.api.errors import (
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    RetrievalError,
    Unavailable,
)
from retrieval.api.types import MAX_HISTORY, MAX_K, Query, Retrieved
from retrieval.api.v1 import retrieval_pb2
from retrieval.artifacts.index import build_index_from_model, load_index, save_index
from retrieval.artifacts.model import ModelArtifact
from retrieval.serving.addresses import host_addresses, join_host_port
from retrieval.serving.group import hold_ports
from retrieval.serving.retriever import Retriever
from retrieval.serving.run import serve_forever
from retrieval.serving.server import create_server, status_for
from retrieval.storage.folders import write_artifact
from retrieval.storage.manifest import ArtifactError
from tests.helpers import DIM, ITEMS, NUM_ITEMS, REPO_ROOT, assert_same, brute_force, local


@pytest.fixture(scope="module")
def index_dir(model: ModelArtifact, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("artifacts") / "index"
    save_index(build_index_from_model(model, "Flat"), out, model)
    return out


@pytest.mark.parametrize(
    ("history", "k"),
    [
        (["item03"], 5),
        (["item01", "item07", "item01", "item22"], 10),  # a repeated item
        (ITEMS[:12], 4),  # longer than MAX_LEN: the tower reads the last 8, all 12 are excluded
        (["item05", "item09"], MAX_K),  # fewer than k items exist once the history is excluded
    ],
)
def test_retrieve_equals_brute_force(
    client: RetrievalClient, model: ModelArtifact, history: list[str], k: int
) -> None:
    result = client.retrieve(history, k)
    expected = brute_force(model, history, k)
    assert_same(result.items, expected)
    assert not {item for item, _, _ in result.items} & set(history)
    assert result.model_version == "model-v1" and result.unknown_items == 0


def test_retriever_without_grpc_gives_the_same_answer(client: RetrievalClient, retriever: Retriever) -> None:
    over_grpc, direct = client.retrieve(["item02", "item30"], 6), retriever.retrieve(["item02", "item30"], 6)
    assert_same(over_grpc.items, direct.items)
    assert isinstance(direct, Retrieved) and direct.model_version == over_grpc.model_version


def test_unknown_ids_are_skipped_and_counted(client: RetrievalClient) -> None:
    result = client.retrieve(["nope", "item03", "gone"], 5)
    assert result.unknown_items == 2
    assert_same(result.items, client.retrieve(["item03"], 5).items)


def test_health_is_serving(client: RetrievalClient) -> None:
    assert client.health() == "SERVING"


def test_reflection_lists_the_services(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (response,) = list(stub.ServerReflectionInfo(iter([request]), timeout=5))
    names = {service.name for service in response.list_services_response.service}
    assert {SERVICE_NAME, "retrieval.v1.RetrievalService", "grpc.health.v1.Health"} <= names


@pytest.mark.parametrize(
    ("history", "k", "message"),
    [
        ([], 5, "history is empty"),
        (["item01"], 0, f"k must be between 1 and {MAX_K}, got 0"),
        (["item01"], MAX_K + 1, f"k must be between 1 and {MAX_K}, got {MAX_K + 1}"),
        (["nope", "gone"], 5, "none of the 2 history ids is in the model's vocabulary"),
        (["item01"] * (MAX_HISTORY + 1), 5, f"at most {MAX_HISTORY} are accepted"),
    ],
)
def test_bad_request_is_invalid_argument_and_server_keeps_serving(
    client: RetrievalClient, history: list[str], k: int, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as error:
        client.retrieve(history, k)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (error.value.details() or "")
    assert len(client.retrieve(["item01"], 3).items) == 3


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidArgument("bad k"), grpc.StatusCode.INVALID_ARGUMENT),
        (NotFound("no such thing"), grpc.StatusCode.NOT_FOUND),
        (ResourceExhausted("too busy"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (Unavailable("loading"), grpc.StatusCode.UNAVAILABLE),
        (DeadlineExceeded("too late"), grpc.StatusCode.DEADLINE_EXCEEDED),
    ],
)
def test_status_for_domain_errors(error: RetrievalError, code: grpc.StatusCode) -> None:
    assert status_for(error) == (code, str(error))


def test_status_for_anything_else_is_internal_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    try:
        raise KeyError("secret internals")
    except KeyError as e:
        with caplog.at_level(logging.ERROR, logger="retrieval.serving.server"):
            code, details = status_for(e)
    assert code == grpc.StatusCode.INTERNAL and "secret" not in details
    assert caplog.records[-1].exc_info is not None  # the traceback is in the log


class BrokenRetriever(Retriever):
    def retrieve_many(self, queries: Sequence[Query], deadline: float | None = None) -> list[Retrieved]:
        raise RuntimeError("bug")


def test_unexpected_error_is_internal_and_server_survives(retriever: Retriever) -> None:
    server, port = create_server(BrokenRetriever(retriever.model, retriever.index), local())
    try:
        with RetrievalClient(f"127.0.0.1:{port}") as client:
            for _ in range(2):
                with pytest.raises(grpc.RpcError) as error:
                    client.retrieve(["item01"], 3)
                assert error.value.code() == grpc.StatusCode.INTERNAL
            assert client.health() == "SERVING"
    finally:
        server.stop(None)


def test_index_artifact_round_trip(index_dir: Path, retriever: Retriever) -> None:
    index, manifest = load_index(index_dir, expected_model_version="model-v1")
    assert {
        k: manifest[k] for k in ("kind", "model_version", "factory", "search_params", "dim", "count")
    } == {
        "kind": "index",
        "model_version": "model-v1",
        "factory": "Flat",
        "search_params": "",
        "dim": DIM,
        "count": NUM_ITEMS,
    }
    assert manifest["metric"] == "inner_product"
    queries = retriever.model.item_embeddings[1:6]
    for a, b in zip(index.search(queries, 7), retriever.index.search(queries, 7), strict=True):
        np.testing.assert_array_equal(a, b)
    # Dense ids 1..n, never the padding row 0.
    _, ids = index.search(retriever.model.item_embeddings[1:], NUM_ITEMS)
    assert set(ids.ravel().tolist()) == set(range(1, NUM_ITEMS + 1))


def test_load_index_refuses_another_model_version(index_dir: Path) -> None:
    with pytest.raises(ArtifactError, match="built from model 'model-v1', not from model 'model-v2'"):
        load_index(index_dir, expected_model_version="model-v2")


def test_load_index_detects_corruption(index_dir: Path, tmp_path: Path, model: ModelArtifact) -> None:
    copy = tmp_path / "index"
    save_index(build_index_from_model(model), copy, "model-v1")
    data = bytearray((copy / "index.faiss").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "index.faiss").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="corrupted"):
        load_index(copy)


def test_from_dirs_refuses_a_mismatch_before_loading_the_model(index_dir: Path, tmp_path: Path) -> None:
    # Only a manifest: the mismatch must be caught before the (absent) SavedModel is read.
    with write_artifact(tmp_path / "model", "model", {"version": "model-v2"}):
        pass
    with pytest.raises(ArtifactError, match="not from model 'model-v2'"):
        Retriever.from_dirs(tmp_path / "model", index_dir)


def test_retriever_refuses_an_index_of_another_model(retriever: Retriever) -> None:
    with pytest.raises(ArtifactError, match="cannot serve model 'model-v1'"):
        Retriever(retriever.model, retriever.index, index_model_version="model-v0")
    narrow = FaissIndex.build(np.arange(1, 4), np.zeros((3, DIM // 2), np.float32))
    with pytest.raises(ArtifactError, match=f"index has dimension {DIM // 2}, model {DIM}"):
        Retriever(retriever.model, narrow)


def test_query_tool_prints_json_with_titles(
    address: str, client: RetrievalClient, model: ModelArtifact, tmp_path: Path
) -> None:
    with write_artifact(tmp_path / "model", "model", {"version": "model-v1"}) as tmp:
        model.vocab.save(tmp / "vocab.json")
    command = [sys.executable, str(REPO_ROOT / "tools" / "query.py"), "--address", address]
    command += ["--history", "item04", "nope", "--k", "3", "--json", "--titles", str(tmp_path / "model")]
    out = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    expected = client.retrieve(["item04", "nope"], 3)
    assert out["model_version"] == "model-v1" and out["unknown_items"] == 1
    assert [(i["item_id"], i["interest"], i["title"]) for i in out["items"]] == [
        (item, interest, f"Title of {item}") for item, _, interest in expected.items
    ]


def test_a_draining_server_reports_not_serving_and_still_answers_until_it_stops(
    retriever: Retriever,
) -> None:
    server, port = create_server(retriever, local())
    request = retrieval_pb2.RetrieveRequest(history=["item01"], k=2).SerializeToString()
    # A plain channel (no client-side health checking), as a load balancer's own probe would use.
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        retrieve = channel.unary_unary(f"/{SERVICE_NAME}/Retrieve")
        stopped = server.stop(grace=1, drain=1.0)
        status = check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        answer = retrieval_pb2.RetrieveResponse.FromString(retrieve(request, timeout=5))
        assert len(answer.items) == 2 and not stopped.is_set()  # still answering while draining
        assert stopped.wait(timeout=10)
        with pytest.raises(grpc.RpcError) as refused:
            retrieve(request, timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("max_batch", [1, 32])
def test_search_threads_apply_in_the_threads_that_search(model: ModelArtifact, max_batch: int) -> None:
    """FAISS's thread count is per thread (an OpenMP setting): it must be set where the
    searches run, the request threads, not only in the thread that started the server."""
    import faiss

    seen: list[int] = []

    def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:  # runs in the searching thread
        seen.append(faiss.omp_get_max_threads())
        return model.user_vectors(inputs)

    probing = ModelArtifact(None, model.manifest, model.vocab, model.item_embeddings, user_vectors)
    before = faiss.omp_get_max_threads()
    config = local(f"batching.max_batch={max_batch}", search_threads=7)
    server, port = create_server(Retriever(probing, build_index_from_model(model, "Flat")), config)
    try:
        with RetrievalClient(f"127.0.0.1:{port}") as client:
            client.retrieve(["item01"], 2)
    finally:
        server.stop(None)
    assert seen == [7]
    assert faiss.omp_get_max_threads() == before  # the caller's own setting is untouched
    with pytest.raises(ValueError, match="search_threads"):
        local(search_threads=0)


def test_serve_forever_stops_gracefully_on_sigterm(retriever: Retriever) -> None:
    with socket.socket() as probe:  # a free port: serve_forever binds a fixed one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    default = signal.getsignal(signal.SIGTERM)
    answers: list[Retrieved] = []

    def call_then_terminate() -> None:
        try:
            with RetrievalClient(f"127.0.0.1:{port}") as client:
                client.wait_until_serving(timeout=10)
                answers.append(client.retrieve(["item01"], 2))
        finally:
            # Signal only once serve_forever's handler is in place: the default one ends pytest.
            deadline = time.monotonic() + 10
            while signal.getsignal(signal.SIGTERM) is default and time.monotonic() < deadline:
                time.sleep(0.01)
            if signal.getsignal(signal.SIGTERM) is not default:
                os.kill(os.getpid(), signal.SIGTERM)

    caller = threading.Thread(target=call_then_terminate)
    caller.start()
    serve_forever(retriever, local(port=port, grace=0.5))  # returns once stopped
    caller.join(timeout=10)
    assert len(answers) == 1 and len(answers[0].items) == 2
    assert signal.getsignal(signal.SIGTERM) is default  # handlers restored


def test_a_second_server_on_a_served_port_is_refused(retriever: Retriever) -> None:
    """grpcio would share the port (SO_REUSEPORT) and split the traffic between two servers,
    maybe of two model versions: the second one fails instead, and the first keeps answering."""
    first, port = create_server(retriever, local())
    try:
        with pytest.raises(
            OSError, match=rf"cannot serve gRPC on 127\.0\.0\.1:{port}: the address is in use"
        ):
            create_server(retriever, local(port=port))
        code = subprocess.run(
            [sys.executable, "-c", "import grpc, concurrent.futures as f; "
             f"grpc.server(f.ThreadPoolExecutor(1)).add_insecure_port('127.0.0.1:{port}')"],
            capture_output=True, text=True, timeout=120,
        ).returncode  # fmt: skip
        assert code != 0  # nor can a server with grpcio's defaults share it
        with RetrievalClient(f"127.0.0.1:{port}", retries=0) as client:
            assert client.retrieve([ITEMS[0]], 3).items
    finally:
        first.stop(None)


def test_a_server_binds_every_address_of_its_host_or_fails(retriever: Retriever) -> None:
    """gRPC binds ``localhost:P`` on every address the name resolves to and succeeds if any one
    bound: with ``127.0.0.1:P`` taken it served ``[::1]:P`` alone, and clients of ``localhost:P``
    reached the other server. Now the start fails naming the address, for a single server and
    for a group's claim; on a free port every address answers."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=rf"cannot serve gRPC on localhost:{port}: .*127\.0\.0\.1:{port}"):
            create_server(retriever, local(host="localhost", port=port))
        with pytest.raises(OSError, match=rf"cannot serve gRPC on localhost:{port}: the address is in use"):
            hold_ports("localhost", port)
    server, port = create_server(retriever, local(host="localhost"))
    try:
        addresses = host_addresses("localhost")
        assert ("127.0.0.1" in [a for _, a in addresses]) and len(addresses) >= 1
        for _, address in addresses:  # each one answers, on the same port
            with RetrievalClient(join_host_port(address, port), retries=0) as client:
                assert client.retrieve(["item01"], 2).model_version == "model-v1"
    finally:
        server.stop(None)


def test_the_health_port_binds_every_address_of_its_host_or_fails(retriever: Retriever) -> None:
    """The plaintext health port too: with ``127.0.0.1:P`` taken, gRPC started ``localhost:P``'s
    health port on ``[::1]`` alone (or failed without naming the address). Now the start fails
    naming it, and leaves nothing serving; on a free port every address answers probes."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(
            OSError, match=rf"cannot serve the health port on localhost:{port}: .*127\.0\.0\.1:{port}"
        ):
            create_server(retriever, local(f"access.health_port={port}", host="localhost"))
    server, _ = create_server(retriever, local(f"access.health_port={free_port()}", host="localhost"))
    try:
        assert server.health_port is not None
        for _, address in host_addresses("localhost"):  # each one answers, on the same port
            with RetrievalClient(join_host_port(address, server.health_port), retries=0) as probe:
                assert probe.health() == "SERVING"
    finally:
        server.stop(None)
