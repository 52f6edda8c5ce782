"""The checked-in generated code matches proto/retrieval.proto, and messages round-trip."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proto import retrieval_pb2

REPO = Path(__file__).resolve().parents[1]
GENERATED = ["retrieval_pb2.py", "retrieval_pb2.pyi", "retrieval_pb2_grpc.py"]


@pytest.mark.parametrize("name", GENERATED)
def test_generated_code_is_not_stale(tmp_path: Path, name: str) -> None:
    # The same command as proto/__init__.py documents, writing into tmp_path instead. It runs in
    # a subprocess: protoc's C++ runtime crashes a process that has already loaded TensorFlow.
    args = [sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO}", f"--python_out={tmp_path}"]
    args += [
        f"--pyi_out={tmp_path}",
        f"--grpc_python_out={tmp_path}",
        str(REPO / "proto" / "retrieval.proto"),
    ]
    subprocess.run(args, check=True, cwd=REPO)
    fresh, checked_in = tmp_path / "proto" / name, REPO / "proto" / name
    assert fresh.read_bytes() == checked_in.read_bytes(), (
        f"proto/{name} is stale: regenerate it (see proto/__init__.py)"
    )


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
