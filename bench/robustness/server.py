"""The fuzzed server: a synthetic model (no TensorFlow) or real artifact folders, served in a child
process, and its :class:`~bench.robustness.oracle.Served` description."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.robustness.calls import FUZZ_MAX_MESSAGE_BYTES
from bench.robustness.oracle import Served
from retrieval.serving import Engine

SYNTHETIC_ITEMS = tuple(f"item{i:02d}" for i in range(64))
SYNTHETIC_VERSION = "fuzz-model-v1"


def synthetic_model() -> Any:
    """A model without TensorFlow (like ``tests/test_server.make_model``), with side features.

    64 items, d = 16, K = 3, ``max_len`` 8; interests are K fixed projections of the mean
    embedding of the last ``max_len`` items. The tower takes ``action`` and ``gap_prev`` inputs
    (and ignores them) so requests' events go through the side-feature encoding.
    """
    from retrieval.artifacts import ModelArtifact
    from retrieval.data import ItemVocab, SideVocab

    dim, k, max_len = 16, 3, 8
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(len(SYNTHETIC_ITEMS) + 1, dim)).astype(np.float32)
    embeddings[0] = 0
    projections = (rng.normal(size=(k, dim, dim)) / np.sqrt(dim)).astype(np.float32)

    def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:  # int32 [B, L] -> float32 [B, K, d]
        items = inputs["items"]
        assert set(inputs) == {"items", "action", "gap_prev"}, sorted(inputs)
        real = (items > 0)[..., None]
        mean = (embeddings[items] * real).sum(axis=1) / np.maximum(real.sum(axis=1), 1)
        return np.einsum("bd,kde->bke", mean, projections).astype(np.float32)

    manifest = {
        "kind": "model",
        "version": SYNTHETIC_VERSION,
        "max_len": max_len,
        "num_interests": k,
        "dim": dim,
    }
    side = SideVocab(("action", "gap_prev"), actions=("1", "2", "3", "click"))
    return ModelArtifact(None, manifest, ItemVocab.from_ids(SYNTHETIC_ITEMS), embeddings, user_vectors, side)


def synthetic_retriever() -> Any:
    """:func:`synthetic_model` over a Flat index, items in 5 categories (some without one)."""
    from retrieval.artifacts import build_index_from_model
    from retrieval.serving import Retriever

    model = synthetic_model()
    return Retriever(model, build_index_from_model(model, "Flat"), item_attributes=SYNTHETIC_ATTRIBUTES)


SYNTHETIC_ATTRIBUTES = {
    item: [f"cat{i % 5}", f"brand{i % 3}"] if i % 2 else [f"cat{i % 5}"]
    for i, item in enumerate(SYNTHETIC_ITEMS)
    if i % 7
}
"""Items' attributes: a category (5 of them; every 7th item has none) and, for odd items, a brand."""


def served_by(
    retriever: Any,
    attributes: dict[str, list[str]],
    max_message_bytes: int = FUZZ_MAX_MESSAGE_BYTES,
    oracle: bool = True,
) -> Served:
    """The :class:`Served` description of a retriever built with item ``attributes`` (with the
    score oracle when ``oracle``)."""
    model = retriever.model
    return Served(
        model.version,
        model.num_interests,
        model.dim,
        model.max_len,
        tuple(model.vocab.ids),
        max_message_bytes,
        model.item_embeddings if oracle else None,
        model.user_vectors if oracle else None,
        tuple(model.side.event_features),
        {item: tuple(values) for item, values in attributes.items()},
    )


def create_engine_server(retriever: Any, config: Any) -> tuple[Any, int]:
    """Starts ``retriever`` on ``config.engine``'s server, as ``mitt serve`` chooses it:
    :func:`~retrieval.serving.create_server` or the native engine's
    :func:`~retrieval.serving.native_server.create_native_server`. Returns ``(server, port)``."""
    if config.engine == "native":
        from retrieval.serving import create_native_server

        return create_native_server(retriever, config)
    from retrieval.serving import create_server

    return create_server(retriever, config)


def serve(
    model_dir: str | None,
    index_dir: str | None,
    max_message_bytes: int,
    ports: Any,
    engine: Engine = "python",
) -> None:
    """Child process: loads or builds the retriever, serves it with ``engine`` on a free port,
    sends the port back."""
    from retrieval.serving import Retriever

    if model_dir and index_dir:
        retriever = Retriever.from_dirs(Path(model_dir), Path(index_dir))
    else:
        retriever = synthetic_retriever()
    server, port = create_engine_server(retriever, fuzzed_config(max_message_bytes, engine))
    ports.put(port)
    server.wait_for_termination()


def fuzzed_config(max_message_bytes: int, engine: Engine) -> Any:
    """The fuzzed server's :class:`~retrieval.serving.ServerConfig`: a free port, requests and
    responses of up to ``max_message_bytes``, ``engine``."""
    from retrieval.serving import LimitsConfig, ServerConfig

    mib = max_message_bytes / 2**20
    limits = LimitsConfig(max_request_mb=mib, max_response_mb=mib)
    # search_threads None: FAISS's own default, as these runs always measured.
    return ServerConfig(port=0, search_threads=None, limits=limits, engine=engine)


def served_from_dirs(model_dir: Path, max_message_bytes: int) -> Served:
    """A real model folder's vocabulary and shape, read without TensorFlow (no score oracle)."""
    from retrieval.data import ItemVocab
    from retrieval.storage import read_manifest

    manifest = read_manifest(model_dir, "model", verify=False)
    vocab = ItemVocab.load(model_dir / "vocab.json")
    attributes_file = model_dir / "item_attributes.json"
    attributes = json.loads(attributes_file.read_text()) if attributes_file.is_file() else {}
    return Served(
        str(manifest["version"]),
        int(manifest["num_interests"]),
        int(manifest["dim"]),
        int(manifest["max_len"]),
        tuple(vocab.ids),
        max_message_bytes,
        attributes={item: tuple(values) for item, values in attributes.items()},
    )
