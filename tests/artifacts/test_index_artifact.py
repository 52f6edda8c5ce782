"""Index artifacts: manifest, refusal of bad files, versioned publishing, tuning on user queries, the tool."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from index import FaissIndex, recall_at_k, tune
from retrieval.artifacts.index import (
    build_index_from_model,
    load_index,
    measure_index,
    publish_index,
    recall_against_exact,
    save_index,
    tune_index_for_model,
    user_interest_queries,
)
from retrieval.artifacts.model import ModelArtifact
from retrieval.data.vocab import ItemVocab
from retrieval.storage.manifest import ArtifactError, sha256_file
from tests.helpers import run_tool

DIM, NUM_ITEMS, K = 16, 600, 2


def clustered(n: int, seed: int, clusters: int = 12) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, DIM))
    x = centres[rng.integers(clusters, size=n)] + 0.3 * rng.normal(size=(n, DIM))
    return (x * rng.uniform(0.5, 2.0, size=(n, 1))).astype(np.float32)  # norms vary, as learned ones do


def fake_model(version: str = "model-v1") -> ModelArtifact:
    """A model without TensorFlow: item i's embedding is row i, a user's K interests are the
    mean of the history's embeddings and that mean with its sign flipped on half the axes."""
    table = np.vstack([np.zeros((1, DIM), np.float32), clustered(NUM_ITEMS, seed=1)])
    flip = np.where(np.arange(DIM) % 2 == 0, 1.0, -1.0).astype(np.float32)

    def user_vectors(inputs: Any) -> np.ndarray:
        items = inputs["items"] if isinstance(inputs, dict) else inputs
        mean = table[items].sum(axis=1) / np.maximum((items > 0).sum(axis=1, keepdims=True), 1)
        return np.stack([mean, mean * flip], axis=1).astype(np.float32)

    manifest = {"version": version, "max_len": 20, "num_interests": K}
    vocab = ItemVocab.from_ids([f"i{n}" for n in range(NUM_ITEMS)])
    return ModelArtifact(None, manifest, vocab, table, user_vectors)


@pytest.fixture(scope="module")
def model() -> ModelArtifact:
    return fake_model()


@pytest.fixture(scope="module")
def log_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(2)
    rows = ["user,item,timestamp"]
    for user in range(80):
        for step, item in enumerate(rng.choice(NUM_ITEMS, size=int(rng.integers(4, 12)), replace=False)):
            rows.append(f"u{user},i{item},{1000 * user + step}")
    path = tmp_path_factory.mktemp("log") / "log.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_manifest_records_the_index_and_its_measurements(model: ModelArtifact, tmp_path: Path) -> None:
    index = build_index_from_model(model, "L2MIPS,IVF16,Flat", "nprobe=4")
    queries = np.stack(model.encode([np.arange(1, 6), np.arange(10, 14)]))
    measured = measure_index(index, model, queries, k=10)
    assert 0.5 < measured["recall"] <= 1.0 and measured["p99_ms"] > 0 and measured["batch_size"] == K
    manifest = save_index(index, tmp_path / "index", model, measured=measured)
    expected = {
        "kind": "index",
        "backend": "faiss",
        "model_version": "model-v1",
        "factory": "L2MIPS,IVF16,Flat",
        "search_params": "nprobe=4",
        "count": NUM_ITEMS,
    }
    assert {k: manifest[k] for k in expected} == expected
    assert manifest["measured"] == measured and manifest["mips_norm"] > 0
    assert manifest["index_bytes"] == (tmp_path / "index" / "index.faiss").stat().st_size
    assert manifest["files"]["index.faiss"] == sha256_file(tmp_path / "index" / "index.faiss")
    loaded, _ = load_index(tmp_path / "index", expected_model_version="model-v1")
    for a, b in zip(
        loaded.search(queries.reshape(-1, DIM), 10), index.search(queries.reshape(-1, DIM), 10), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def rewrite_manifest(folder: Path, **changes: Any) -> None:
    """Makes the manifest agree with the files again (checksum, size), plus ``changes``: the
    kind of mismatch a checksum cannot catch."""
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["index.faiss"] = sha256_file(folder / "index.faiss")
    manifest["index_bytes"] = (folder / "index.faiss").stat().st_size
    manifest.update(changes)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_bad_files_are_refused_with_a_clear_error(model: ModelArtifact, tmp_path: Path) -> None:
    good = tmp_path / "good"
    save_index(build_index_from_model(model, "HNSW16"), good, model)
    data = (good / "index.faiss").read_bytes()

    def variant(name: str, payload: bytes, **changes: Any) -> Path:
        folder = tmp_path / name
        save_index(build_index_from_model(model, "HNSW16"), folder, model)
        (folder / "index.faiss").write_bytes(payload)
        if changes or name.startswith("consistent"):
            rewrite_manifest(folder, **changes)
        return folder

    cases = {
        "truncated": (variant("truncated", data[: len(data) // 2]), "truncated or replaced"),
        "flipped": (variant("flipped", data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]), "corrupted"),
        # Checksums and sizes made consistent: FAISS's own reader and the shape checks must refuse.
        "consistent-truncated": (variant("consistent-truncated", data[:-64]), "not a readable FAISS index"),
        "consistent-foreign": (variant("consistent-foreign", b"GGUF" + data[4:]), "expected an IDMap2 index"),
        "consistent-count": (variant("consistent-count", data, count=NUM_ITEMS + 1), "manifest says"),
        "consistent-type": (variant("consistent-type", data, is_exact=True), "another index type"),
    }
    for name, (folder, message) in cases.items():
        with pytest.raises(ArtifactError, match=message):
            load_index(folder)
        assert name  # every case refused, none crashed inside FAISS
    load_index(good)


def test_publish_swaps_versions_atomically(model: ModelArtifact, tmp_path: Path) -> None:
    root = tmp_path / "live"
    first = publish_index(build_index_from_model(model, "Flat"), root, model)
    index, manifest = load_index(root, expected_model_version="model-v1")
    assert manifest["factory"] == "Flat" and (root / "current").resolve() == first.resolve()

    # Readers loading in a loop while new versions are published never see a half state.
    errors: list[str] = []
    seen: set[str] = set()
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            try:
                seen.add(load_index(root)[1]["factory"])
            except Exception as e:  # any failure is a half state
                errors.append(repr(e))

    thread = threading.Thread(target=reader)
    thread.start()
    for factory in ("HNSW16", "IVF8,Flat", "Flat", "HNSW16"):
        publish_index(build_index_from_model(model, factory), root, model, keep=2)
    done.set()
    thread.join()
    assert not errors
    assert load_index(root)[1]["factory"] == "HNSW16"
    assert len(list((root / "versions").iterdir())) == 5  # none retired long enough to go
    publish_index(build_index_from_model(model, "HNSW16"), root, model, keep=2, grace=0)
    assert len(list((root / "versions").iterdir())) == 2  # older versions pruned
    assert seen <= {"Flat", "HNSW16", "IVF8,Flat"}
    with pytest.raises(ArtifactError, match="plain artifact folder"):
        publish_index(index, root / "current", model)


def test_user_interest_queries_come_from_real_histories(model: ModelArtifact, log_csv: Path) -> None:
    queries = user_interest_queries(model, log_csv, num_users=30)
    assert queries.shape == (30, K, DIM) and queries.dtype == np.float32
    # Oracle: each user's test history is the log but its last event; "i<n>" is dense id n + 1.
    events: dict[str, list[int]] = {}
    for line in log_csv.read_text().splitlines()[1:]:
        user, item, _ = line.split(",")
        events.setdefault(user, []).append(int(item[1:]) + 1)
    expected = {u: model.user_vectors({"items": np.array([ids[:-1]])})[0] for u, ids in events.items()}
    matched = [[u for u, e in expected.items() if np.allclose(q, e, rtol=1e-5, atol=1e-6)] for q in queries]
    assert all(len(users) == 1 for users in matched), matched  # each query is one user's history
    assert len({users[0] for users in matched}) == 30  # 30 different users


def test_tuning_reaches_its_target_on_user_queries(model: ModelArtifact, log_csv: Path) -> None:
    queries = user_interest_queries(model, log_csv, num_users=60)
    result = tune_index_for_model(model, queries, k=10, target_recall=0.95, factory="L2MIPS,IVF32,Flat")
    assert result.reached and result.chosen.recall >= 0.95 and result.batch_size == K
    # The chosen nprobe is the cheapest that reaches the target: the one before it did not.
    tried = [p for p in result.tried if p.factory == "L2MIPS,IVF32,Flat"]
    assert tried[-1] == result.chosen and all(p.recall < 0.95 for p in tried[:-1])
    # Independent check against a Flat oracle.
    exact = build_index_from_model(model, "Flat")
    flat = queries.reshape(-1, DIM)
    assert recall_at_k(result.index, exact, flat, 10) >= 0.95
    assert recall_against_exact(result.index, model, 10, queries=queries) >= 0.95
    summary = result.summary()
    assert summary["chosen"]["search_params"] == result.index.search_params and summary["reached"]


def test_auto_tuning_compares_index_types() -> None:
    vectors = clustered(1500, seed=4)
    queries = clustered(80, seed=5)
    result = tune(np.arange(1500), vectors, queries, k=20, target_recall=0.97)
    factories = {p.factory for p in result.tried}
    assert {"Flat", "HNSW32"} <= factories and any("IVF" in f for f in factories)
    assert result.reached and result.chosen.recall >= 0.97
    assert result.chosen.p99_ms <= min(p.p99_ms for p in result.tried if p.recall >= 0.97) + 1e-9
    assert recall_at_k(result.index, FaissIndex.build(np.arange(1500), vectors), queries, 20) >= 0.97


def test_tuning_reports_an_unreachable_target() -> None:
    vectors, queries = clustered(1000, seed=6), clustered(40, seed=7)
    result = tune(np.arange(1000), vectors, queries, k=50, target_recall=0.999, factories=["IVF16,PQ4x4"])
    assert not result.reached and result.chosen.recall < 0.999
    assert result.chosen.recall == max(p.recall for p in result.tried)  # the best it could do
    with pytest.raises(ValueError, match="no non-zero query vectors"):
        tune(np.arange(1000), vectors, np.zeros((4, DIM), np.float32))


def test_build_index_tool(model: ModelArtifact, log_csv: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    import retrieval.artifacts

    monkeypatch.setattr(retrieval.artifacts, "load_model", lambda path, verify=True: model)
    out = tmp_path / "index"
    given = ["--model", str(tmp_path)]  # load_model is the fake's; the folder exists, as checked first
    args = [*given, "--out", str(out), "--factory", "auto", "--k", "10", "--data", str(log_csv)]
    (tmp_path / "index.yaml").write_text("target_recall: 0.95\nnum_users: 40\n")  # settings from a file too
    assert run_tool("build_index", *args, "--config", str(tmp_path / "index.yaml")) == 0
    captured = capsys.readouterr()
    assert "memory estimate for Flat over 600 x 16" in captured.err
    summary = json.loads(captured.out.strip().splitlines()[-1])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tuning"]["reached"] and manifest["measured"]["recall"] >= 0.95
    assert (manifest["tuning"]["target_recall"], manifest["tuning"]["k"]) == (0.95, 10)
    assert manifest["tuning"]["num_queries"] == 40 * model.num_interests  # the file's users
    assert manifest["measured"]["query_source"] == "users" and summary["recall@10_vs_exact"] >= 0.95
    assert manifest["factory"] == manifest["tuning"]["chosen"]["factory"]
    # Without --data: a clear warning, and item vectors as queries.
    root = tmp_path / "root"
    assert run_tool("build_index", *given, "--out", str(root), "--publish", "--factory", "Flat") == 0
    assert "no --data" in capsys.readouterr().err
    assert load_index(root)[1]["measured"]["query_source"] == "items"
    assert run_tool("build_index", *given, "--out", str(out), "--factory", "Flat") == 2  # exists
