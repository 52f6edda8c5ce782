"""Cosine similarity (``model.similarity=cosine``): unit-length interests and scored item vectors,
the loss against an independent reference, and the artifact the index and the tower read."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

from retrieval.artifacts.model import EMBEDDINGS_FILE, TOWER_TABLE_FILE, load_model
from retrieval.evaluation.evaluate import exact_top_k
from retrieval.serving.retriever import Retriever
from retrieval.training.config import ModelConfig
from retrieval.training.losses.samplers import CandidateSampler
from retrieval.training.losses.task import build_task
from retrieval.training.model import TwoTowerModel, build_model, item_table, scoring_table
from tests.helpers import run_tool

VOCAB = 40


def _model(similarity: str, tower: str = "sa") -> TwoTowerModel:
    keras.utils.set_random_seed(0)
    return build_model(ModelConfig(tower=tower, dim=8, max_len=10, similarity=similarity), VOCAB)


def _histories() -> dict[str, np.ndarray]:
    items = np.random.default_rng(0).integers(1, VOCAB, size=(6, 10)).astype(np.int32)
    items[:, :4] = 0  # left padding
    return {"items": items}


def test_cosine_interests_are_unit_length_and_dot_ones_are_not() -> None:
    cosine = np.asarray(_model("cosine")(_histories()))
    np.testing.assert_allclose(np.linalg.norm(cosine, axis=-1), 1.0, rtol=1e-5)
    dot = np.asarray(_model("dot")(_histories()))
    assert not np.allclose(np.linalg.norm(dot, axis=-1), 1.0, rtol=1e-2)


def test_cosine_loss_matches_a_numpy_softmax_over_unit_vectors() -> None:
    model = _model("cosine", "youtubednn")
    temperature = 0.1
    model.task = build_task(
        "full_softmax",
        sampler=CandidateSampler.from_counts(np.ones(VOCAB)),
        num_negatives=5,
        target_probabilities=np.full(VOCAB, 1 / VOCAB),
        temperature=temperature,
    )
    x, targets = _histories(), np.array([3, 7, 1, 39, 12, 5])
    loss = float(model.compute_loss(x, targets, model(x)))

    raw = np.asarray(model.user_tower(x))[:, 0]  # [B, d], not normalised
    query = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    items = np.asarray(model.item_tower.table)[1:]
    logits = query @ (items / np.linalg.norm(items, axis=1, keepdims=True)).T / temperature  # [B, V-1]
    top = logits.max(axis=1, keepdims=True)
    log_partition = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    expected = np.mean(log_partition - logits[np.arange(6), targets - 1])
    assert loss == pytest.approx(expected, rel=1e-4)


def test_the_scoring_table_is_unit_length_only_for_cosine() -> None:
    cosine, dot = _model("cosine"), _model("dot")
    norms = np.linalg.norm(scoring_table(cosine)[1:], axis=1)
    np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
    assert not scoring_table(cosine)[0].any()  # padding stays zero
    np.testing.assert_array_equal(scoring_table(dot), item_table(dot))
    restored = TwoTowerModel.from_config(cosine.get_config())
    assert restored.similarity == "cosine"
    with pytest.raises(ValueError, match="similarity must be one of"):
        TwoTowerModel(cosine.user_tower, similarity="l2")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def cosine_model(synthetic_csv, tmp_path_factory):
    out = tmp_path_factory.mktemp("cosine") / "model"
    code = run_tool(
        "train",
        "--data", str(synthetic_csv), "--model", "sa", "--out", str(out), "--epochs", "2",
        "--dim", "16", "--max-len", "12", "--batch-size", "64", "--negatives", "20", "--quiet",
        "--set", "model.similarity=cosine", "--set", "train.temperature=0.1",
    )  # fmt: skip
    assert code == 0
    return out


@pytest.fixture(scope="module")
def cosine_index(cosine_model):
    index_dir = cosine_model.parent / "index"
    assert run_tool("build_index", "--model", str(cosine_model), "--out", str(index_dir)) == 0
    return index_dir


def test_a_cosine_artifact_indexes_unit_vectors_and_its_tower_reads_the_trained_ones(cosine_model) -> None:
    manifest = json.loads((cosine_model / "manifest.json").read_text())
    assert manifest["similarity"] == "cosine"
    assert load_model(cosine_model).similarity == "cosine"
    indexed, read = np.load(cosine_model / EMBEDDINGS_FILE), np.load(cosine_model / TOWER_TABLE_FILE)
    np.testing.assert_allclose(np.linalg.norm(indexed[1:], axis=1), 1.0, rtol=1e-5)
    trained = keras.saving.load_model(cosine_model / "model.keras")
    assert trained.similarity == "cosine"
    np.testing.assert_allclose(read, item_table(trained), rtol=1e-6)
    np.testing.assert_allclose(indexed, scoring_table(trained), rtol=1e-6)


def test_served_cosine_results_equal_a_brute_force_over_unit_vectors(cosine_model, cosine_index) -> None:
    retriever = Retriever.from_dirs(cosine_model, cosine_index)
    trained = keras.saving.load_model(cosine_model / "model.keras")
    model = load_model(cosine_model)
    # The reference scales the Keras towers' raw outputs itself: not the artifact's vectors.
    raw_items = np.asarray(trained.item_tower.table)
    unit_items = raw_items / np.maximum(np.linalg.norm(raw_items, axis=1, keepdims=True), 1e-30)
    for history in ([1, 2, 3], [5, 9, 11, 12, 4], [20, 21]):
        dense = np.array(history, np.int32)
        interests = np.asarray(trained.user_tower({"items": dense[None, :]}))
        interests = interests / np.maximum(np.linalg.norm(interests, axis=-1, keepdims=True), 1e-30)
        expected = exact_top_k(interests, unit_items, [dense], 10)[0]
        got = retriever.retrieve(model.vocab.external(dense), k=10)
        assert [item for item, _, _ in got.items] == model.vocab.external(expected)
        assert all(-1.0 - 1e-5 <= score <= 1.0 + 1e-5 for _, score, _ in got.items)  # cosines
