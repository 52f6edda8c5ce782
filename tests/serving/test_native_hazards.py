"""The native engine's linking hazards (issue 44): TensorFlow's libraries export gRPC C++ and
protobuf symbols and grpcio brings its own gRPC core, so the engine's gRPC must stay private.
Checked from the built module's symbol table and by serving calls from both gRPCs in one
process with TensorFlow loaded, imported in either order. Needs ``make native``; skips without it."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from retrieval.serving import native
from tests.helpers import REPO_ROOT


@pytest.fixture(scope="module")
def module_file() -> Path:
    """The built ``_native`` shared object; skips when it is not built or binutils are missing."""
    try:
        path = Path(native.native_module().__file__ or "")
    except native.NativeEngineMissing as e:
        pytest.skip(f"{e}")
    if shutil.which("nm") is None or shutil.which("readelf") is None:
        pytest.skip("nm and readelf (binutils) are needed to read the symbol tables")
    return path


def exported(library: Path) -> list[str]:
    """The (mangled) names of the symbols ``library`` defines in its dynamic table."""
    argv = ["nm", "-D", "--defined-only", str(library)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return [line.split(" ", 2)[2] for line in out.stdout.splitlines() if line.count(" ") >= 2]


def tensorflow_folder() -> Path:
    """The installed TensorFlow package's folder (not imported); skips when it is not installed."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or spec.origin is None:
        pytest.skip("the serve extra (TensorFlow) is not installed")
    return Path(spec.origin).parent


def test_the_module_exports_only_its_init_function(module_file: Path) -> None:
    assert exported(module_file) == ["PyInit__native"]


def test_the_module_carries_its_own_grpc_and_needs_no_shared_one(module_file: Path) -> None:
    dynamic = subprocess.run(["readelf", "-d", str(module_file)], capture_output=True, text=True, check=True)
    needed = [line.split("[")[1].rstrip("]") for line in dynamic.stdout.splitlines() if "(NEEDED)" in line]
    grpc_libraries = ("libgrpc", "libgpr", "libupb", "libaddress_sorting", "libcares")
    assert needed and not [name for name in needed if name.startswith(grpc_libraries)]


def test_tensorflow_exports_grpc_and_protobuf_symbols(module_file: Path) -> None:
    """The hazard itself, as measured when the engine was designed: if this fails, TensorFlow no
    longer exports them and the precautions of native/CMakeLists.txt may be revisited."""
    folder = tensorflow_folder()
    symbols = [name for library in sorted(folder.glob("libtensorflow*.so.2")) for name in exported(library)]
    assert sum(name.startswith("_ZN4grpc") for name in symbols) > 1000  # grpc::
    assert sum(name.startswith("_ZN6google8protobuf") for name in symbols) > 100  # google::protobuf::


CHILD = """
import sys

if sys.argv[1] == "tensorflow first":
    import tensorflow as tf
    import grpc
    from retrieval.serving.native import native_module
    native_module()
else:
    from retrieval.serving.native import native_module
    native_module()
    import tensorflow as tf
    import grpc

from concurrent import futures
import numpy as np
from retrieval.api import RetrievalClient
from retrieval.api.v1 import retrieval_pb2, retrieval_pb2_grpc
from retrieval.serving.native import NativeServer
from retrieval.serving.native_kernel import NativeServable

ITEMS = [f"i{n}" for n in range(8)]
VECTORS = tf.constant(np.eye(8, dtype=np.float32))


class Echo(retrieval_pb2_grpc.RetrievalServiceServicer):
    def Retrieve(self, request, context):
        return retrieval_pb2.RetrieveResponse(items=[retrieval_pb2.ScoredItem(item_id=request.history[0])])


class Kernel:
    def search(self, histories, fetch, *rest):
        # TensorFlow runs on the native batcher's thread: the interest is the last item's row.
        interests = tf.gather(VECTORS, histories[:, -1] - 1)
        scores = tf.matmul(interests, VECTORS, transpose_b=True).numpy()
        order = np.argsort(-scores, axis=1, kind="stable")[:, : int(fetch.max())]
        ids = (order + 1)[:, None, :].astype(np.int64)
        fetched = np.full(len(histories), order.shape[1], np.int32)
        found = np.take_along_axis(scores, order, axis=1)[:, None, :]
        return ids, found, fetched, interests.numpy()[:, None, :], None


python_server = grpc.server(futures.ThreadPoolExecutor(4))
retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(Echo(), python_server)
python_port = python_server.add_insecure_port("127.0.0.1:0")
python_server.start()
servable = NativeServable(
    Kernel(), ITEMS, 8, "v", 4, 1, 8, {}, np.arange(9), "unavailable", {}, False, b""
)
native_server = NativeServer(servable)
native_port = native_server.start()
with RetrievalClient(f"127.0.0.1:{python_port}", retries=0) as python_client:
    with RetrievalClient(f"127.0.0.1:{native_port}", retries=0) as native_client:
        native_client.wait_until_serving(timeout=30)
        for n in range(40):
            item = ITEMS[n % 8]
            assert python_client.retrieve([item], 1).items[0][0] == item
            # The item itself scores 1 but is the history; the others tie at 0: smaller ids first.
            expected = [(other, 0.0, 0) for other in ITEMS if other != item][:3]
            assert native_client.retrieve([item], 3).items == expected
native_server.stop(5.0)
python_server.stop(None).wait()
assert float(tf.reduce_sum(VECTORS)) == 8.0
maps = open("/proc/self/maps").read()
print(" ".join(name for name in ("libtensorflow_cc", "cygrpc", "_native") if name in maps))
"""


@pytest.mark.slow
@pytest.mark.parametrize("order", ["tensorflow first", "native first"])
def test_both_grpcs_serve_beside_tensorflow_in_one_process(module_file: Path, order: str) -> None:
    tensorflow_folder()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, order],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["libtensorflow_cc", "cygrpc", "_native"]
