"""The index artifact: a FAISS index over a model's item embeddings, tied to that model's version.

Folder layout (``tools/build_index.py --out DIR``)::

    DIR/manifest.json   kind "index", model_version, factory, search_params, dim, count, metric, checksums
    DIR/index.faiss     FAISS IDMap2 index; ids are the model's dense item ids 1..n
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from index import FaissIndex, recall_at_k
from retrieval.artifacts import ArtifactError, read_manifest, write_artifact
from retrieval.model_artifact import ModelArtifact

KIND = "index"
INDEX_FILE = "index.faiss"


def build_index_from_model(
    model: ModelArtifact, factory: str = "Flat", search_params: str = ""
) -> FaissIndex:
    """Indexes rows ``1..n`` of ``model.item_embeddings`` under the dense ids ``1..n``.

    The padding row 0 is left out so it can never be retrieved; external ids come back
    through ``model.vocab``.
    """
    embeddings = model.item_embeddings
    if embeddings.shape[0] != model.vocab.num_embeddings:
        raise ValueError(
            f"item_embeddings has {embeddings.shape[0]} rows for {len(model.vocab)} items (+1 padding row)"
        )
    ids = np.arange(1, embeddings.shape[0], dtype=np.int64)
    return FaissIndex.build(ids, embeddings[1:], factory, search_params)


def save_index(
    index: FaissIndex, out_dir: Path, model: ModelArtifact | str, overwrite: bool = False
) -> dict[str, Any]:
    """Writes ``index`` as an artifact folder tied to ``model`` (an artifact or its version).

    Returns:
        The manifest written.
    """
    model_version = model if isinstance(model, str) else model.version
    with write_artifact(
        out_dir, KIND, {"model_version": model_version, **index.describe()}, overwrite
    ) as tmp:
        index.save(tmp / INDEX_FILE)
    return read_manifest(out_dir, KIND, verify=False)


def load_index(path: Path, expected_model_version: str | None = None) -> tuple[FaissIndex, dict[str, Any]]:
    """Loads an index artifact, verifying its checksums and, if given, the model version.

    Raises:
        ArtifactError: missing, incomplete or corrupted folder, or an index built from
            another model than ``expected_model_version``.
    """
    path = Path(path)
    manifest = read_manifest(path, KIND)
    if expected_model_version is not None and manifest["model_version"] != expected_model_version:
        raise ArtifactError(
            f"{path} was built from model {manifest['model_version']!r}, not from model "
            f"{expected_model_version!r}: rebuild it with tools/build_index.py"
        )
    try:
        index = FaissIndex.load(path / INDEX_FILE, manifest["factory"], manifest["search_params"])
    except (ValueError, TypeError) as e:
        raise ArtifactError(f"{path} holds an unusable index: {e}") from e
    if (index.dim, index.ntotal) != (manifest["dim"], manifest["count"]):
        raise ArtifactError(
            f"{path}: index has dim {index.dim} and {index.ntotal} items, "
            f"manifest says dim {manifest['dim']} and {manifest['count']}"
        )
    return index, manifest


def recall_against_exact(
    index: FaissIndex, model: ModelArtifact, k: int = 10, num_queries: int = 1000, seed: int = 0
) -> float:
    """Recall@k of ``index`` against exact search over the model's item embeddings.

    Item vectors sampled without replacement stand in for user queries, which need user data.
    """
    exact = build_index_from_model(model, "Flat")
    rng = np.random.default_rng(seed)
    rows = rng.choice(
        np.arange(1, model.vocab.num_embeddings), min(num_queries, len(model.vocab)), replace=False
    )
    return recall_at_k(index, exact, model.item_embeddings[rows], k)
