"""The checked-in generated code matches proto/retrieval.proto, messages round-trip, and the code
lives inside our package, beside proto-plus's top-level ``proto`` package."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from retrieval.api.v1 import retrieval_pb2
from tests.helpers import HISTORY, REPO_ROOT, brute_force, make_model

PACKAGE = "retrieval/api/v1"
GENERATED = ["retrieval_pb2.py", "retrieval_pb2.pyi", "retrieval_pb2_grpc.py"]


@pytest.mark.parametrize("name", GENERATED)
def test_generated_code_is_not_stale(tmp_path: Path, name: str) -> None:
    # The command of `make proto` (and retrieval/api/v1/__init__.py), writing into tmp_path. It
    # runs in a subprocess: protoc's C++ runtime crashes a process that has already loaded TensorFlow.
    args = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PACKAGE}=proto", f"--python_out={tmp_path}"]
    args += [f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", "proto/retrieval.proto"]
    subprocess.run(args, check=True, cwd=REPO_ROOT)
    fresh, checked_in = tmp_path / PACKAGE / name, REPO_ROOT / PACKAGE / name
    assert fresh.read_bytes() == checked_in.read_bytes(), f"{PACKAGE}/{name} is stale: run `make proto`"


def test_the_service_keeps_its_full_name() -> None:
    """Clients in other languages (and grpcurl, reflection, health checks) call it by this name."""
    service = retrieval_pb2.DESCRIPTOR.services_by_name["RetrievalService"]
    assert service.full_name == "retrieval.v1.RetrievalService"
    assert retrieval_pb2.DESCRIPTOR.name == f"{PACKAGE}/retrieval.proto"  # unique in the descriptor pool


def test_messages_round_trip() -> None:
    request = retrieval_pb2.RetrieveRequest(history=["B0001", "B0042", "ü-ñ"], k=50)
    assert retrieval_pb2.RetrieveRequest.FromString(request.SerializeToString()) == request
    response = retrieval_pb2.RetrieveResponse(
        items=[retrieval_pb2.ScoredItem(item_id="B0107", score=3.5, interest=2)],
        model_version="abc123",
        unknown_items=1,
    )
    decoded = retrieval_pb2.RetrieveResponse.FromString(response.SerializeToString())
    assert decoded == response
    assert (decoded.items[0].item_id, decoded.items[0].score, decoded.items[0].interest) == ("B0107", 3.5, 2)


BESIDE_PROTO_PLUS = """
import json, proto  # proto-plus's package, imported first, as a google-cloud library would
from tests.helpers import HISTORY, connected, make_model, serving
from retrieval.artifacts.index import build_index_from_model
from retrieval.serving.retriever import Retriever
model = make_model()
retriever = Retriever(model, build_index_from_model(model, "Flat"))
with serving(retriever) as address, connected(address) as client:
    items = client.retrieve(HISTORY, k=5).items
print(json.dumps({"proto": [proto.__name__, hasattr(proto, "Message")], "items": items}))
"""


def test_client_and_server_run_beside_proto_plus() -> None:
    """proto-plus (which every google-cloud client library installs) owns the top-level ``proto``
    package: with it imported first, the server still starts and the client still retrieves."""
    try:
        importlib.metadata.version("proto-plus")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("proto-plus is not installed (pip install -e '.[dev]' installs it)")
    done = subprocess.run(
        [sys.executable, "-c", BESIDE_PROTO_PLUS], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert printed["proto"] == ["proto", True]  # proto-plus's module, with its Message class
    expected = brute_force(make_model(), HISTORY, 5)
    assert [(i, n) for i, _, n in printed["items"]] == [(i, n) for i, _, n in expected]
