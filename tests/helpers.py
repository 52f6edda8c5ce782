"""Helpers shared by several test files: the tools runner, the in-memory served model and its
brute-force oracle, a server on port 0, the hot-reload-under-load harness, a DIN saved for
reranking, the rankers' contract fixture, a model artifact without TensorFlow and a training
run's crash after a checkpoint.

A plain module (fixtures live in ``tests/conftest.py``, which imports from here): test files and
the child processes some tests start import it as ``tests.helpers``. Heavy libraries (Keras,
the rankers) are imported inside the functions that need them, so a child that only runs a tool
does not pay for them.
"""

from __future__ import annotations

import datetime
import importlib.util
import ipaddress
import threading
import time
import urllib.request
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client.parser import text_string_to_metric_families

from retrieval.api.client import RetrievalClient
from retrieval.api.types import Query, Retrieved
from retrieval.artifacts.model import ModelArtifact
from retrieval.config import apply_overrides
from retrieval.data.vocab import ItemVocab
from retrieval.serving.config import ServerConfig
from retrieval.serving.reload import DeploymentWatcher, RetrieverSlot, load_deployment
from retrieval.serving.retriever import Retriever
from retrieval.serving.server import create_server

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_tool(name: str, *args: str) -> int:
    """Runs ``tools/<name>.py``'s ``main(argv)`` in this process (tools are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"tools_{name}", REPO_ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return int(module.main(list(args)))


class Interrupted(Exception):
    """Stands for a crash (or Ctrl-C) in the middle of a training run."""


@contextmanager
def crash_after_round(epoch: int) -> Iterator[None]:
    """A training run inside the block crashes right after round ``epoch``'s checkpoint
    (0-based), leaving the run folder a resume continues from; the block expects the crash."""
    from retrieval.training.callbacks import EpochCheckpoint

    original = EpochCheckpoint.on_epoch_end

    def crash(self: Any, done: int, logs: Any = None) -> None:
        original(self, done, logs)
        if done == epoch:
            raise Interrupted

    with pytest.MonkeyPatch.context() as patch, pytest.raises(Interrupted):
        patch.setattr(EpochCheckpoint, "on_epoch_end", crash)
        yield


def tiered(values: Iterable[Any], slow: Collection[Any]) -> list[Any]:
    """Parameters of a sweep (one model trained per tower, per ranker...) with those in ``slow``
    marked ``slow``: ``make test-fast`` keeps the others, one or two representatives of the
    sweep, and ``make test`` runs them all. A value not named (a new tower) stays fast.

    Example:
        >>> @pytest.mark.parametrize("name", tiered(tower_names(), slow={"sasrec", "bert4rec"}))
    """
    params = []
    for value in values:
        if value in slow:
            args = value if isinstance(value, tuple) else (value,)
            params.append(pytest.param(*args, marks=pytest.mark.slow))
        else:
            params.append(value)
    return params


def compile_for_fit(model: Any, learning_rate: float) -> None:
    """Compiles ``model`` with Adam (XLA off) and builds the optimizer now: Keras would build it
    inside the first traced train step, and ``tf.function`` traces a step that creates variables
    twice (measured: half the CPU of a tower's or a ranker's short fit, the same losses)."""
    import keras

    model.compile(optimizer=keras.optimizers.Adam(learning_rate), jit_compile=False)
    model.optimizer.build(model.trainable_variables)


# --- the in-memory served model and its oracle ----------------------------------------------------

DIM, NUM_ITEMS, K, MAX_LEN = 16, 40, 3, 8
ITEMS = [f"item{i:02d}" for i in range(NUM_ITEMS)]  # dense id of ITEMS[i] is i + 1
HISTORY = ["item03", "item11", "item07"]
"""The history the rerank tests ask with."""


def saved_endpoint(folder: Path, name: str = "user_vectors") -> Any:
    """The endpoint ``name`` of the user-tower SavedModel ``folder`` (``export_user_tower``),
    loaded on its own with the item vectors it reads: numpy inputs -> numpy answer."""
    import tensorflow as tf

    exported = tf.saved_model.load(str(folder))
    table = tf.constant(np.load(Path(folder) / "item_vectors.npy"))

    def call(inputs: dict[str, np.ndarray]) -> np.ndarray:
        features = {k: tf.constant(v, tf.int32) for k, v in inputs.items()}
        return getattr(exported, name)(features, table).numpy()  # the closure keeps `exported`

    return call


def make_model(version: str = "model-v1") -> ModelArtifact:
    """In-memory model: K fixed random projections of the mean embedding of the last MAX_LEN items."""
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(NUM_ITEMS + 1, DIM)).astype(np.float32)
    embeddings[0] = 0
    projections = (rng.normal(size=(K, DIM, DIM)) / np.sqrt(DIM)).astype(np.float32)

    def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:  # int32 [B, L] -> float32 [B, K, d]
        items = inputs["items"]
        real = (items > 0)[..., None]
        mean = (embeddings[items] * real).sum(axis=1) / np.maximum(real.sum(axis=1), 1)
        return np.einsum("bd,kde->bke", mean, projections).astype(np.float32)

    vocab = ItemVocab.from_ids(ITEMS, titles={item: f"Title of {item}" for item in ITEMS})
    manifest = {"kind": "model", "version": version, "max_len": MAX_LEN, "num_interests": K, "dim": DIM}
    return ModelArtifact(None, manifest, vocab, embeddings, user_vectors)


def brute_force(model: ModelArtifact, history: list[str], k: int) -> list[tuple[str, float, int]]:
    """Oracle: interests from the last MAX_LEN known items, max over interests, history excluded."""
    known = [ITEMS.index(h) + 1 for h in history if h in ITEMS]
    interests = model.user_vectors({"items": np.array([known[-MAX_LEN:]], np.int32)})[0]  # [K, d]
    scores = interests @ model.item_embeddings.T  # [K, n + 1]
    ranked = sorted(
        (
            (ITEMS[j - 1], float(scores[:, j].max()), int(scores[:, j].argmax()))
            for j in range(1, NUM_ITEMS + 1)
            if j not in known
        ),
        key=lambda t: -t[1],
    )
    return ranked[:k]


def assert_same(got: list[tuple[str, float, int]], expected: list[tuple[str, float, int]]) -> None:
    assert [(i, n) for i, _, n in got] == [(i, n) for i, _, n in expected]
    np.testing.assert_allclose([s for _, s, _ in got], [s for _, s, _ in expected], rtol=1e-5)


class GatedRetriever(Retriever):
    """Records each call's batch size; each call waits for ``gate`` once ``entered`` is set, so
    tests can hold a call (and let queries pile up behind it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sizes: list[int] = []
        self.entered, self.gate = threading.Event(), threading.Event()
        self.gate.set()

    @property
    def calls(self) -> int:
        return len(self.sizes)

    def hold(self) -> None:
        """Closes ``gate`` and clears ``entered``: the next call sets ``entered`` and waits."""
        self.gate.clear()
        self.entered.clear()

    def retrieve_many(self, queries: Sequence[Query], deadline: float | None = None) -> list[Retrieved]:
        self.sizes.append(len(queries))
        self.entered.set()
        assert self.gate.wait(10)
        return super().retrieve_many(queries, deadline)


# --- a real server on port 0 ----------------------------------------------------------------------


def local(*overrides: str, **fields: Any) -> ServerConfig:
    """A server's config on port 0 of 127.0.0.1 (unless ``fields`` say otherwise): ``fields`` as
    :class:`ServerConfig` takes them, then ``overrides`` as ``--set`` takes them
    (``local("threads=1", "batching.max_batch=16")``)."""
    return apply_overrides(ServerConfig(**{"port": 0, **fields}), overrides)


@contextmanager
def serving(
    retriever: Retriever | RetrieverSlot, config: ServerConfig | None = None, **options: Any
) -> Iterator[str]:
    """``create_server(retriever, config, **options)`` (by default :func:`local`'s config); yields
    its address, stops it on exit."""
    server, port = create_server(retriever, config or local(), **options)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


@contextmanager
def connected(address: str | list[str], **options: Any) -> Iterator[RetrievalClient]:
    """A client of ``address`` that has seen it SERVING (waits up to 10 s)."""
    with RetrievalClient(address, **options) as client:
        client.wait_until_serving(timeout=10)
        yield client


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``(sample name, sorted labels) -> value`` from the /metrics endpoint at ``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


# --- hot reload under load ------------------------------------------------------------------------

SETTLE_SECONDS = 60.0
"""How long a swap (or a refusal) may take to show: wide, for a loaded 2-core machine. Only a
failing test waits that long; the checks are on what was answered, never on how fast."""


class ReloadUnderLoad:
    """A server over a :class:`RetrieverSlot` loaded from the deployment root ``root``, a
    :class:`DeploymentWatcher` polling ``root`` every 50 ms, and ``callers`` threads calling
    ``Retrieve`` in a loop, each answer's model version appended to :attr:`seen` and each
    failure to :attr:`errors`.

    Example:
        >>> with ReloadUnderLoad(root, callers=4) as live:
        ...     publish_deployment(model_2, index_2, root)
        ...     live.settles_on(version_2)
        >>> assert not live.errors
    """

    def __init__(self, root: Path, callers: int, retries: int | None = None, **server_options: Any) -> None:
        """``retries``: the callers' client retries (``None``: the client's default; 0 makes every
        failure show); ``server_options`` go to ``create_server`` with :func:`local`'s config."""
        self.root, self.callers, self.server_options = root, callers, server_options
        self.client_options: dict[str, Any] = {} if retries is None else {"retries": retries}
        self.seen: list[str] = []
        self.errors: list[Exception] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> ReloadUnderLoad:
        self.slot = RetrieverSlot(load_deployment(self.root))
        self.server, port = create_server(self.slot, local(), **self.server_options)
        self.address = f"127.0.0.1:{port}"
        self.watcher = DeploymentWatcher(self.root, self.slot, interval=0.05)
        self.watcher.start()
        self.history = list(self.slot.current.model.vocab.ids[:5])
        self._threads = [threading.Thread(target=self._call) for _ in range(self.callers)]
        for thread in self._threads:
            thread.start()
        return self

    def _call(self) -> None:
        with RetrievalClient(self.address, **self.client_options) as client:
            while not self._stop.is_set():
                try:
                    self.seen.append(client.retrieve(self.history, k=5).model_version)
                except Exception as e:  # any failure fails the test
                    self.errors.append(e)

    def wait_for_calls(self, count: int, timeout: float = SETTLE_SECONDS) -> None:
        """Waits until ``count`` more calls are answered (at most ``timeout`` s)."""
        target, deadline = len(self.seen) + count, time.monotonic() + timeout
        while len(self.seen) < target and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(self.seen) >= target, f"{len(self.seen)} calls answered, expected {target}"

    def settles_on(self, version: str, calls: int = 20) -> None:
        """Waits until the slot serves ``version``, then for ``calls`` more answers; the last of
        them must come from ``version``."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while self.slot.current.model_version != version and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.slot.current.model_version == version
        self.wait_for_calls(calls)
        assert self.seen[-1] == version

    def wait_refused(self, refused: int) -> None:
        """Waits until the watcher has refused ``refused`` versions in all (exactly that many)."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while self.watcher.refused < refused and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.watcher.refused == refused

    def stop_calls(self) -> None:
        """Stops the callers (the server and the watcher keep running)."""
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def __exit__(self, *exc: object) -> None:
        self.stop_calls()
        self.watcher.stop()
        self.server.stop(None)


# --- rankers ----------------------------------------------------------------------------------------


def save_din(
    out: Path, vocab: ItemVocab, model_version: str, seed: int, retrieval_weight: float = 0.01, **options: Any
) -> Path:
    """An untrained DIN (seeded weights): enough to check where and how its scores are used. Its
    logit is ``g · DIN + w · retrieval score`` with ``g = 1`` (not the untrained 0, which would
    return the retrieval order) and a small ``w``, so both parts decide the order, unless
    ``options`` say otherwise."""
    import keras

    from rankers import build_ranker
    from retrieval.artifacts.ranker import save_ranker

    kwargs = {
        "num_items": len(vocab),
        "dim": 8,
        "max_len": MAX_LEN,
        "attention_units": [8],
        "hidden_units": [8],
        "ranker_scale_init": 1.0,
        **options,
    }
    keras.utils.set_random_seed(seed)
    ranker = build_ranker("din", **kwargs)
    ranker.build()
    if ranker.retrieval_score:
        ranker.retrieval_weight.assign(retrieval_weight)
    save_ranker(out, ranker, "din", kwargs, vocab, model_version)
    return out


NUM_UNCLICKED = 4
"""Unclicked items a DSTN of :func:`save_dstn` reads."""


def save_dstn(
    out: Path, vocab: ItemVocab, model_version: str, config: dict[str, Any] | None, seed: int = 0
) -> Path:
    """An untrained DSTN (seeded weights) with ``g = 1`` so its own part, which reads the
    unclicked items, moves the logits; ``config`` is saved as the artifact's ``config.json``."""
    import keras

    from rankers import build_ranker
    from retrieval.artifacts.ranker import save_ranker

    kwargs = {
        "num_items": len(vocab),
        "dim": 8,
        "max_len": MAX_LEN,
        "attention_units": 8,
        "hidden_units": [8],
        "context_size": 5,
        "ranker_scale_init": 1.0,
    }
    keras.utils.set_random_seed(seed)
    ranker = build_ranker("dstn", **kwargs)
    ranker.build()
    ranker.retrieval_weight.assign(0.01)
    save_ranker(out, ranker, "dstn", kwargs, vocab, model_version, config=config)
    return out


def config_of(**changes: Any) -> dict[str, Any]:
    """A DSTN ranker's ``config.json`` (``num_unclicked`` :data:`NUM_UNCLICKED`) with ``changes``."""
    from retrieval.ranking.config import RankerConfig

    return {**RankerConfig(ranker="dstn", num_unclicked=NUM_UNCLICKED).to_dict(), **changes}


RANKER_ITEMS, RANKER_DIM, RANKER_MAX_LEN, RANKER_ATTRIBUTES = 24, 8, 8, 6
"""The sizes of :func:`make_ranker`'s rankers (their own catalogue, not :data:`ITEMS`)."""
RANKER_CONTEXT = 3  # DSTN's context size (the requests carry RANKER_CONTEXT + 1 context items)
# Tiny widths so that the ranker tests stay fast; no dropout, so training-mode calls are deterministic.
RANKER_KWARGS: dict[str, dict[str, Any]] = {
    "din": {"attention_units": (8,), "hidden_units": (8,), "activation": "dice"},
    "dien": {"hidden_units": (8,), "activation": "prelu", "aux_weight": 0.5},
    "afm": {"attention_units": 4},
    "dstn": {"attention_units": 8, "hidden_units": (8,), "context_size": RANKER_CONTEXT},
}
# The contract tests need the ranker's own part in the logits: g = 0.5, not the initial 0
# (which makes every ranker's logit the retrieval score, tested on its own).
RANKER_SHARED = {"retrieval_score": True, "ranker_scale_init": 0.5}


def make_ranker(name: str, num_attributes: int = RANKER_ATTRIBUTES, **overrides: Any) -> Any:
    """The ranker ``name`` over :data:`RANKER_ITEMS` items, seeded (0) and built."""
    import keras

    from rankers import build_ranker

    keras.utils.set_random_seed(0)
    kwargs = {**RANKER_SHARED, **RANKER_KWARGS.get(name, {}), **overrides}
    ranker = build_ranker(
        name,
        num_items=RANKER_ITEMS,
        dim=RANKER_DIM,
        max_len=RANKER_MAX_LEN,
        num_attributes=num_attributes,
        **kwargs,
    )
    ranker.build()
    return ranker


# --- a model artifact without TensorFlow -------------------------------------------------------------


class FakeModel:
    """A model artifact without TensorFlow: n random items of dimension 32, K = 1."""

    @staticmethod
    def make(n: int, version: str) -> ModelArtifact:
        table = np.random.default_rng(0).normal(size=(n + 1, 32)).astype(np.float32)
        table[0] = 0

        def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:
            return np.asarray(table[inputs["items"]].mean(axis=1, keepdims=True))

        vocab = ItemVocab.from_ids([f"i{j}" for j in range(n)])
        return ModelArtifact(
            None, {"version": version, "max_len": 8, "num_interests": 1}, vocab, table, user_vectors
        )


# --- TLS ---------------------------------------------------------------------------------------------


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
