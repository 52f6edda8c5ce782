"""Helpers of the serving tests: a toy kernel for the native engine (a brute-force search over
random item vectors, the reference answers come from the same numbers) and its servable; the
access file of the identity tests; a call's status, a refusal's metric sample, a server's
health, a certificate rotated on disk."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.native_echo import ToyKernel as SearchOnly
from retrieval.api import SERVICE_NAME
from retrieval.api.client import RetrievalClient
from retrieval.api.v1 import retrieval_pb2
from retrieval.serving import native
from retrieval.serving.config import TlsConfig
from retrieval.serving.native_kernel import NativeServable
from retrieval.serving.server import StartedServer
from tests.helpers import write_certificates

OPS_TOKEN_ENV = "OPS_TOKEN_FOR_TESTS"
"""The environment variable holding the ``ops`` identity's token (a test sets it)."""

ACCESS = f"""
[identities.team-a]
tokens = ["token-a"]
permissions = ["retrieve", "info"]

[identities.team-b]
token_sha256 = ["{hashlib.sha256(b"token-b").hexdigest()}"]
permissions = ["info"]

[identities.ops]
token_env = "{OPS_TOKEN_ENV}"
permissions = ["admin"]

[identities.service]
certificates = ["client"]
permissions = ["info"]
"""
"""An access file of every kind of identity: a plain token (``token-a``), a token's hash
(``token-b``), a token from the environment (``ops``) and a client certificate (CN ``client``)."""

NUM_ITEMS, DIM, NUM_INTERESTS, MAX_LEN = 60, 16, 3, 8
VOCAB = [f"item{i}" for i in range(NUM_ITEMS)]  # dense id i + 1


def built() -> None:
    """Skips the test when the engine is not built."""
    try:
        native.native_module()
    except native.NativeEngineMissing as e:
        pytest.skip(f"{e}")


# --- a brute-force kernel and the reference answer ---------------------------------------------------

_rng = np.random.default_rng(44)
ITEM_VECTORS = _rng.normal(size=(NUM_ITEMS + 1, DIM)).astype(np.float32)
ITEM_VECTORS[0] = 0.0  # padding
PROJECTIONS = _rng.normal(size=(NUM_INTERESTS, DIM, DIM)).astype(np.float32)


def toy_tower(histories: np.ndarray) -> np.ndarray:
    """K projections of the history's mean item vector: float32 ``[B, K, d]``."""
    counts = np.maximum((histories > 0).sum(axis=1, keepdims=True), 1)
    mean = ITEM_VECTORS[histories].sum(axis=1) / counts  # [B, d]
    return np.einsum("bd,kde->bke", mean, PROJECTIONS).astype(np.float32)


def brute_force(histories: np.ndarray, fetch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The toy tower and an exact search: per row and interest the ``max(fetch)`` best items,
    best first (ties: smaller id)."""
    scores = toy_tower(histories) @ ITEM_VECTORS[1:].T  # [B, K, N]
    order = np.argsort(-scores, axis=-1, kind="stable")[..., : int(fetch.max())]
    return (order + 1).astype(np.int64), np.take_along_axis(scores, order, axis=-1)


Search = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


class ToyKernel(SearchOnly):
    """The engine's kernel over ``search(histories, fetch) -> (ids, scores)`` (by default
    :func:`brute_force`; no filters: the tests here send none): the interests are the toy
    tower's, and no row is ever short (each is said to be searched as deep as its shortest list);
    the calls no toy request needs raise (:class:`bench.native_echo.ToyKernel`)."""

    def __init__(self, search: Search = brute_force) -> None:
        self._search = search

    def search(
        self, histories: np.ndarray, fetch: np.ndarray, *_: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, None]:
        """The engine's arguments after ``fetch`` (filters, events, explanations) go unread."""
        ids, scores = self._search(histories, fetch)
        fetched = (ids >= 0).sum(axis=2).min(axis=1).astype(np.int32)  # every list full: none short
        interests = toy_tower(histories)
        if ids.shape[1] != NUM_INTERESTS:  # a search answering for other interests than the tower's
            interests = np.ones((len(histories), ids.shape[1], DIM), np.float32)
        return ids, scores, fetched, interests, None


def toy_servable(
    kernel: Any = None, vocabulary: Sequence[str] = VOCAB, version: str = "v-native"
) -> NativeServable:
    """A servable of ``kernel`` (by default a :class:`ToyKernel`) over ``vocabulary``, whose ids
    past VOCAB are items added after training (not read as history)."""
    return NativeServable(
        kernel=kernel or ToyKernel(),
        vocabulary=list(vocabulary),
        tower_items=NUM_ITEMS,
        model_version=version,
        max_len=MAX_LEN,
        num_interests=NUM_INTERESTS,
        num_items=len(vocabulary),
        category_members={},
        category_codes=np.arange(len(vocabulary) + 1, dtype=np.int64),
        explanation="unavailable",
        rankers={},
        side_features=False,
        model_info=retrieval_pb2.ModelInfo(model_version=version).SerializeToString(),
    )


class Held(ToyKernel):
    """A :class:`ToyKernel` whose searches set ``entered``, then wait for ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def search(self, *args: Any) -> Any:
        self.entered.set()
        assert self.release.wait(10)
        return super().search(*args)


def refusal(
    code: str, reason: str, identity: str = "", method: str = "Retrieve"
) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The ``retrieval_refusals_total`` sample of one kind of refusal, keyed as
    :func:`tests.helpers.scrape` keys it (labels sorted by name)."""
    labels = (("code", code), ("identity", identity), ("method", method), ("reason", reason))
    return "retrieval_refusals_total", labels


def code_of(call: Any, *args: Any) -> grpc.StatusCode:
    """The status a call ends with (OK when it returns)."""
    try:
        call(*args)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def health_status(address: str, credentials: grpc.ChannelCredentials | None = None) -> str:
    """The whole server's health status, asked without any token."""
    with (
        grpc.secure_channel(address, credentials)
        if credentials
        else grpc.insecure_channel(address) as channel
    ):
        response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def wait_until_started(
    process: subprocess.Popen[bytes], address: str, log: Path, timeout: float = 240.0
) -> None:
    """Waits until the server ``process`` reports SERVING on ``address``, asking every 0.05 s on a
    new channel with its own subchannel (no reconnect backoff to wait out: a client's channel
    waits up to 1 s between its attempts), and fails at once if the process exits.

    Raises:
        AssertionError: the process exited, or not SERVING after ``timeout`` s (``log`` in the message).
    """
    deadline = time.monotonic() + timeout
    request = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
    serving = health_pb2.HealthCheckResponse.SERVING
    while True:
        with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            try:
                if health_pb2_grpc.HealthStub(channel).Check(request, timeout=10).status == serving:
                    return
            except grpc.RpcError:
                pass  # not listening yet
        assert process.poll() is None, f"the server exited: {log.read_text()}"
        assert time.monotonic() < deadline, f"the server did not start: {log.read_text()}"
        time.sleep(0.05)


def check_health_ports(server: StartedServer, address: str, files: Mapping[str, Path]) -> str:
    """Checks health on both ports of a TLS ``server`` at ``address`` (its certificates in
    ``files``): SERVING on the main port (a client certificate, no token) and on the plaintext
    health port, which serves nothing else; :meth:`~StartedServer.set_serving` switches both.

    Returns:
        The health port's address.
    """
    ssl = grpc.ssl_channel_credentials(
        files["ca.pem"].read_bytes(), files["client.key"].read_bytes(), files["client.pem"].read_bytes()
    )
    assert health_status(address, ssl) == "SERVING"
    assert server.health_port is not None
    health_address = f"127.0.0.1:{server.health_port}"
    assert health_status(health_address) == "SERVING"
    with RetrievalClient(health_address, retries=0, token="token-a") as plain:
        assert code_of(plain.model_info) == grpc.StatusCode.UNIMPLEMENTED
    server.set_serving(False)  # one health status for both ports
    assert health_status(health_address) == "NOT_SERVING"
    server.set_serving(True)
    assert health_status(health_address) == "SERVING"
    return health_address


@dataclass(frozen=True)
class Rotation:
    """Two sets of certificates (:func:`~tests.helpers.write_certificates`), ``first`` and
    ``second``, and ``live``, the folder of a server's TLS files: the first's ``server.pem`` and
    ``server.key`` until :meth:`rotate` puts the second's in their place."""

    first: dict[str, Path]
    second: dict[str, Path]
    live: Path

    @classmethod
    def write(cls, folder: Path) -> Rotation:
        """Writes both sets and the live folder under ``folder``."""
        for name in ("first", "second", "live"):
            (folder / name).mkdir()
        first, second = write_certificates(folder / "first"), write_certificates(folder / "second")
        live = folder / "live"
        for name in ("server.pem", "server.key"):
            shutil.copy(first[name], live / name)
        return cls(first, second, live)

    @property
    def tls(self) -> TlsConfig:
        """A server's TLS configuration reading the live files."""
        return TlsConfig(str(self.live / "server.pem"), str(self.live / "server.key"))

    def rotate(self, name: str) -> None:
        """Puts the second set's ``name`` in place of the live one as secret managers do:
        written aside, renamed over."""
        live = self.live / name
        shutil.copy(self.second[name], live.with_suffix(".new"))
        os.replace(live.with_suffix(".new"), live)
