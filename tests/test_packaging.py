"""What installing a wheel built from this checkout gives, in fresh venvs (from PyPI, so marked
``network``; installing TensorFlow makes them ``slow``). uv makes and fills the venvs: the same
resolution from the wheel's metadata as ``pip install``, in a few seconds from its cache where pip
takes 80 s to unpack TensorFlow again:

* ``[client]``, beside proto-plus (whose top-level ``proto`` package every google-cloud library
  brings): no TensorFlow, Keras, FAISS, pandas or pyarrow installed, and its client, as a library
  and as ``mitt query``, gets from a server (run here, by the test's own environment) the answer
  this environment's client gets. The other commands say in one line which extra they need.
* ``[train,serve]``, beside proto-plus too: the ``mitt`` command trains on a small log, builds the
  index, serves it, answers a query, and stops on SIGTERM.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import uv

from retrieval.api.client import RetrievalClient
from retrieval.cli.dispatch import DISTRIBUTION
from tests.helpers import HISTORY, REPO_ROOT, connected

pytestmark = [pytest.mark.network, pytest.mark.slow]

SOURCES = ["pyproject.toml", "setup.py", "MANIFEST.in", "LICENSE", "README.md", "proto"]
SOURCES += ["towers", "rankers", "index", "retrieval"]
"""What a build reads, copied out of the checkout so that the build writes nothing into it
(build/, *.egg-info)."""
HEAVY_DISTRIBUTIONS = {"tensorflow", "tensorflow-cpu", "keras", "faiss-cpu", "pandas", "pyarrow"}
VERSION = importlib.metadata.version(DISTRIBUTION)  # this checkout's, installed in .venv
UV = uv.find_uv_bin()
INSTALL_SECONDS = 900  # TensorFlow (~270 MB) the first time; seconds from uv's cache
STEP_SECONDS = 300


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of this checkout, built by pip (``pip wheel --no-deps``) from a copy of it."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        path = REPO_ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, source / name)
    out = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", str(source), "-w", str(out)]
    subprocess.run(pip, check=True, timeout=INSTALL_SECONDS, env=clean_env())
    (built,) = out.glob("*.whl")
    return built


def clean_env() -> dict[str, str]:
    """This process's environment without what would leak this checkout or venv into a child."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "TF_CPP_MIN_LOG_LEVEL"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def make_venv(path: Path, *requirements: str) -> Path:
    """A fresh venv at ``path`` (this interpreter's Python) with ``requirements``; its ``bin``."""
    subprocess.run(
        [UV, "venv", "--quiet", "--python", sys.executable, str(path)], check=True, timeout=STEP_SECONDS
    )
    bin_dir = path / "bin"
    install = [UV, "pip", "install", "--quiet", "--python", str(bin_dir / "python"), *requirements]
    subprocess.run(install, check=True, timeout=INSTALL_SECONDS, env=clean_env())
    return bin_dir


def run(
    bin_dir: Path, command: str, *args: str, cwd: Path, timeout: float = STEP_SECONDS
) -> subprocess.CompletedProcess[str]:
    """``command`` (``mitt``, ``python``) of the venv at ``bin_dir``, in ``cwd`` (never the checkout,
    whose packages would shadow the installed ones)."""
    return subprocess.run(
        [bin_dir / command, *args], capture_output=True, text=True, cwd=cwd, env=clean_env(), timeout=timeout
    )


def installed(bin_dir: Path, cwd: Path) -> set[str]:
    listed = [UV, "pip", "list", "--format=json", "--python", str(bin_dir / "python")]
    done = subprocess.run(
        listed, capture_output=True, text=True, cwd=cwd, env=clean_env(), timeout=STEP_SECONDS
    )
    assert done.returncode == 0, done.stderr
    return {entry["name"].lower().replace("_", "-") for entry in json.loads(done.stdout)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the client extra ---------------------------------------------------------------------------

CLIENT_SCRIPT = """
import json, sys
import proto  # proto-plus's top-level package, installed beside ours
import retrieval
from retrieval.api import RetrievalClient
with RetrievalClient(sys.argv[1]) as client:
    client.wait_until_serving(timeout=30)
    items = client.retrieve(sys.argv[2:], k=5).items
heavy = sorted(m for m in ("tensorflow", "keras", "faiss", "pandas", "pyarrow") if m in sys.modules)
where = {"retrieval": retrieval.__file__, "proto_plus": hasattr(proto, "Message")}
print(json.dumps({"items": items, "heavy": heavy, **where}))
"""


@pytest.fixture(scope="module")
def client_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("client") / "venv", f"{wheel}[client]", "proto-plus")


def test_the_client_extra_installs_no_heavy_library(client_venv: Path, tmp_path: Path) -> None:
    names = installed(client_venv, tmp_path)
    assert {DISTRIBUTION, "grpcio", "protobuf", "numpy", "proto-plus"} <= names
    assert not names & HEAVY_DISTRIBUTIONS, (
        f"the client extra installed {sorted(names & HEAVY_DISTRIBUTIONS)}"
    )


def mitt_query(venv: Path, address: str, history: Sequence[str], cwd: Path) -> list[dict[str, Any]]:
    """The items ``mitt query --json`` of ``venv`` prints for ``history`` (k = 5) from ``address``."""
    done = run(
        venv, "mitt", "query", "--address", address, "--history", *history, "--k", "5", "--json", cwd=cwd
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)["items"]


def test_the_client_install_retrieves_from_a_server(client_venv: Path, address: str, tmp_path: Path) -> None:
    """The server runs in this process (the test environment's code); the installed client, as a
    library and as ``mitt query``, gets the answer this environment's own client gets."""
    with connected(address) as client:
        expected = [[item, score, interest] for item, score, interest in client.retrieve(HISTORY, k=5).items]
    done = run(client_venv, "python", "-c", CLIENT_SCRIPT, address, *HISTORY, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout)
    assert printed["items"] == expected
    assert printed["heavy"] == [] and printed["proto_plus"]
    assert Path(printed["retrieval"]).is_relative_to(client_venv.parent)  # the installed package
    items = mitt_query(client_venv, address, HISTORY, tmp_path)
    assert [[i["item_id"], i["score"], i["interest"]] for i in items] == expected


def test_the_client_install_names_the_extra_a_command_needs(client_venv: Path, tmp_path: Path) -> None:
    done = run(client_venv, "mitt", "--version", cwd=tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, f"{DISTRIBUTION} {VERSION}"), done.stderr
    (tmp_path / "log.csv").write_text("user,item,timestamp\n")  # inputs exist: checked first
    (tmp_path / "model").mkdir()
    (tmp_path / "index").mkdir()
    for command, extra, args in [
        ("train", "train", ["--data", "log.csv", "--out", "model"]),
        ("build-index", "train", ["--model", "model", "--out", "index"]),
        ("serve", "serve", ["--model", "model", "--index", "index"]),
    ]:
        done = run(client_venv, "mitt", command, *args, cwd=tmp_path)
        assert done.returncode == 2
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("error: this command needs the ") and line.endswith(
            f"pip install '{DISTRIBUTION}[{extra}]'"
        ), line
    done = run(client_venv, "mitt", "query", "--history", "a", "--titles", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: --titles (reading a model folder) needs the serve extra"), line
    assert line.endswith(f"pip install '{DISTRIBUTION}[serve]'"), line


# --- the train and serve extras ------------------------------------------------------------------


@pytest.fixture(scope="module")
def train_serve_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("train-serve") / "venv", f"{wheel}[train,serve]", "proto-plus")


@pytest.fixture
def server(
    train_serve_venv: Path, synthetic_csv: Path, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``mitt train`` (one epoch of YouTube DNN on the synthetic log), ``mitt build-index``, then
    ``mitt serve`` in the background on a free port: the server process and its address."""
    venv = train_serve_venv
    model, index = tmp_path / "model", tmp_path / "index"
    train = ["--data", str(synthetic_csv), "--model", "youtubednn", "--out", str(model), "--epochs", "1"]
    train += ["--dim", "8", "--max-len", "8", "--negatives", "10", "--quiet"]
    done = run(venv, "mitt", "train", *train, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["out"] == str(model)
    done = run(venv, "mitt", "build-index", "--model", str(model), "--out", str(index), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    port = free_port()
    serve = [venv / "mitt", "serve", "--model", str(model), "--index", str(index), "--port", str(port)]
    process = subprocess.Popen(serve, cwd=tmp_path, env=clean_env(), stderr=subprocess.PIPE, text=True)
    try:
        yield process, f"127.0.0.1:{port}"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def test_mitt_trains_indexes_serves_and_queries(
    train_serve_venv: Path, server: tuple[subprocess.Popen[str], str], tmp_path: Path
) -> None:
    process, address = server
    with RetrievalClient(address) as client:
        client.wait_until_serving(timeout=120)
    history = ["i0", "i1", "i2"]
    items = [item["item_id"] for item in mitt_query(train_serve_venv, address, history, tmp_path)]
    catalogue = {f"i{n}" for n in range(40)}
    assert len(items) == 5 == len(set(items)) and set(items) <= catalogue - set(history), items
    done = run(train_serve_venv, "mitt", "--version", cwd=tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, f"{DISTRIBUTION} {VERSION}"), done.stderr
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr[-3000:]
