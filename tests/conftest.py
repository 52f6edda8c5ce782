"""Shared pytest fixtures. Shared plain helpers live in ``tests/helpers.py``: import them from
there (``from tests.helpers import run_tool``), never from this file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from retrieval.api.client import RetrievalClient
from retrieval.artifacts.index import build_index_from_model
from retrieval.artifacts.model import ModelArtifact
from retrieval.serving.retriever import Retriever
from tests.helpers import REPO_ROOT, connected, make_model, run_tool, serving


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only benchmark datasets in ``<repo>/../shared/data``; skips the test when absent."""
    path = REPO_ROOT.parent / "shared" / "data"
    if not path.is_dir():
        pytest.skip(f"shared data folder ../shared/data not found: {path}")
    return path


@pytest.fixture(scope="session")
def synthetic_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded ``user,item,timestamp`` log with structure a model can learn.

    60 users over 40 items in 4 clusters of 10: each user mostly moves within one or two
    clusters, in order, so the next item is predictable from the history.
    """
    import numpy as np

    rng = np.random.default_rng(7)
    rows = ["user,item,timestamp"]
    for user in range(60):
        clusters = rng.choice(4, size=2, replace=False)
        t = 1_000_000 + user
        for step in range(int(rng.integers(8, 16))):
            cluster = clusters[0] if rng.random() < 0.7 else clusters[1]
            item = cluster * 10 + (step % 10)
            rows.append(f"u{user},i{item},{t}")
            t += int(rng.integers(60, 600))
    path = tmp_path_factory.mktemp("synthetic") / "log.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="session")
def model_versions(
    synthetic_csv: Path, tmp_path_factory: pytest.TempPathFactory
) -> list[tuple[Path, Path, str]]:
    """Two tiny trained models (seeds 1 and 2) with a Flat index each, for the hot-reload tests:
    ``(model dir, index dir, model version)``."""
    from retrieval.storage.manifest import read_manifest

    out = tmp_path_factory.mktemp("versions")
    built = []
    for seed in ("1", "2"):
        model_dir, index_dir = out / f"model-{seed}", out / f"index-{seed}"
        code = run_tool(
            "train",
            "--data", str(synthetic_csv), "--model", "youtubednn", "--out", str(model_dir), "--epochs", "1",
            "--dim", "8", "--max-len", "8", "--negatives", "10", "--seed", seed, "--quiet",
        )  # fmt: skip
        assert code == 0
        assert run_tool("build_index", "--model", str(model_dir), "--out", str(index_dir)) == 0
        built.append((model_dir, index_dir, str(read_manifest(model_dir, "model")["version"])))
    assert built[0][2] != built[1][2]
    return built


# --- a real server on port 0, per test module -------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> ModelArtifact:
    """The in-memory 40-item model of :func:`tests.helpers.make_model` (version "model-v1")."""
    return make_model()


@pytest.fixture(scope="module")
def retriever(model: ModelArtifact) -> Retriever:
    """``model`` over an exact (Flat) index; a module overrides it to serve something else."""
    return Retriever(model, build_index_from_model(model, "Flat"))


@pytest.fixture(scope="module")
def address(retriever: Retriever) -> Iterator[str]:
    """The address of a server of the module's ``retriever``, bound to port 0."""
    with serving(retriever) as address:
        yield address


@pytest.fixture(scope="module")
def client(address: str) -> Iterator[RetrievalClient]:
    """A client of ``address`` that has seen it SERVING."""
    with connected(address) as client:
        yield client


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a pytest-xdist worker (``make test``: ``-n 2 --dist loadfile --no-loadscope-reorder``,
    a module whole on one worker, so that its fixtures are built once), the modules in the order
    they are handed out: those with a network test first, then those with a slow one, each by
    size, so that no long module starts last and the short ones even out the end."""
    if not hasattr(config, "workerinput"):
        return
    rank: dict[Path, int] = {}
    size: dict[Path, int] = {}
    for item in items:
        own = 0 if item.get_closest_marker("network") else 1 if item.get_closest_marker("slow") else 2
        rank[item.path] = min(own, rank.get(item.path, 2))
        size[item.path] = size.get(item.path, 0) + 1
    items.sort(key=lambda item: (rank[item.path], -size[item.path]))  # stable: a module's order is kept
