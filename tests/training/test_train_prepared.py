"""Training and evaluation from a prepared folder (tools/prepare_data.py) instead of the raw log.

The oracle is the in-memory run on the same log with the same seed. A prepared folder holds the
same vocabulary, split, item counts and examples (tests/data/test_parquet_data.py); what differs is
the order of the examples (a shuffle buffer over row groups instead of one permutation of the
epoch), so the runs are compared with one batch per epoch, where order cannot matter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import retrieval.training.inputs
import retrieval.training.run
from retrieval.artifacts.model import ModelArtifact
from retrieval.config import apply_overrides
from retrieval.data.prepared.reader import is_prepared, read_vocab
from retrieval.data.prepared.writer import prepare
from retrieval.data.vocab import ItemVocab
from retrieval.evaluation.prepared import evaluate_prepared
from retrieval.evaluation.protocols import evaluate_protocol
from retrieval.storage.manifest import ArtifactError
from retrieval.training.callbacks import run_folder
from retrieval.training.config import Config
from tests.helpers import crash_after_round, run_tool

TINY = ["model.tower=youtubednn", "model.dim=8", "model.max_len=6", "train.num_negatives=5", "train.epochs=2"]


@pytest.fixture(scope="module")
def prepared(synthetic_csv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic log prepared into 2 partitions of row groups of 8 users (8 row groups)."""
    out = tmp_path_factory.mktemp("prepared") / "log"
    prepare(synthetic_csv, out, partitions=2, users_per_row_group=8, progress=False)
    return out


def config_for(data: Path, *extra: str) -> Config:
    return apply_overrides(Config(), [f"data.path={data}", *TINY, *extra])


@pytest.fixture
def weights(monkeypatch: pytest.MonkeyPatch) -> list[list[np.ndarray]]:
    """Replaces the artifact export by a record of the final weights."""
    recorded: list[list[np.ndarray]] = []

    def record(model: Any, *args: Any, **kwargs: Any) -> None:
        recorded.append([np.array(w) for w in model.get_weights()])

    monkeypatch.setattr(retrieval.training.run, "save_model", record)
    return recorded


def test_detection(prepared: Path, synthetic_csv: Path) -> None:
    assert is_prepared(prepared) and is_prepared(prepared.resolve().as_uri())
    assert not is_prepared(synthetic_csv) and not is_prepared(prepared / "missing")
    opened = retrieval.training.inputs.open_training_data
    assert isinstance(opened(config_for(prepared)), retrieval.training.inputs.PreparedData)
    assert isinstance(opened(config_for(synthetic_csv)), retrieval.training.inputs.InMemoryData)


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_one_batch_per_epoch_trains_as_the_csv_does(
    synthetic_csv: Path, prepared: Path, tmp_path: Path, weights: list[list[np.ndarray]]
) -> None:
    """496 examples in one batch of 1024: the mean loss, its gradient, the shared negatives (same
    seed, same draws) and therefore every weight are the in-memory run's, up to the float32
    summation order inside the batch (~1e-7); so are the validation and test metrics."""
    one_batch = "train.batch_size=1024"
    from_csv = retrieval.training.run.train(config_for(synthetic_csv, one_batch), tmp_path / "csv", verbose=0)
    streamed = retrieval.training.run.train(config_for(prepared, one_batch), tmp_path / "prepared", verbose=0)
    assert streamed.train_examples == from_csv.train_examples == 496
    assert streamed.protocol == "loo"
    np.testing.assert_allclose(streamed.train_loss_per_epoch, from_csv.train_loss_per_epoch, rtol=1e-5)
    for a, b in zip(weights[0], weights[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    for key in ("test", "baseline_popularity_test"):
        assert getattr(streamed, key) == pytest.approx(getattr(from_csv, key), abs=1e-9), key
    for a, b in zip(streamed.validation_per_epoch, from_csv.validation_per_epoch, strict=True):
        assert a == pytest.approx(b, abs=1e-9)


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_resume_from_a_prepared_folder(prepared: Path, synthetic_csv: Path, tmp_path: Path) -> None:
    """Several batches per epoch (32 of 496): the interrupted and resumed run ends where the
    uninterrupted one does, through the command line, and writes a complete artifact."""
    flags = ["--data", str(prepared), "--model", "youtubednn", "--dim", "8", "--max-len", "6"]
    flags += ["--epochs", "2", "--batch-size", "32", "--negatives", "5", "--quiet"]
    assert run_tool("train", *flags, "--format", "prepared", "--out", str(tmp_path / "full")) == 0
    full = json.loads((tmp_path / "full" / "metrics.json").read_text())

    out = tmp_path / "resumed"
    with crash_after_round(0):
        run_tool("train", *flags, "--out", str(out))
    assert not out.exists() and (run_folder(out) / "checkpoint").is_dir()
    assert run_tool("train", *flags, "--out", str(out), "--resume") == 0
    resumed = json.loads((out / "metrics.json").read_text())
    np.testing.assert_allclose(resumed["train_loss_per_epoch"], full["train_loss_per_epoch"], rtol=1e-6)
    assert resumed["test"] == pytest.approx(full["test"])
    np.testing.assert_allclose(
        np.load(out / "item_embeddings.npy"), np.load(tmp_path / "full" / "item_embeddings.npy"), atol=1e-6
    )
    assert json.loads((out / "vocab.json").read_text())["ids"] == list(read_vocab(prepared).ids)
    assert not run_folder(out).exists()

    # tools/evaluate.py reads the prepared folder as it reads the log it came from.
    evaluated = []
    for data in (prepared, synthetic_csv):
        target = tmp_path / "evaluated"
        assert run_tool("evaluate", "--model", str(out), "--data", str(data), "--out", str(target)) == 0
        evaluated.append(json.loads((target / "metrics.json").read_text()))
    assert evaluated[0]["users"] == evaluated[1]["users"] == 60
    assert evaluated[0]["ndcg@10"] == pytest.approx(evaluated[1]["ndcg@10"])
    assert evaluated[0]["ndcg@10"] == pytest.approx(resumed["test"]["ndcg@10"], rel=1e-5)


def test_prepared_folders_hold_leave_one_out_only(
    prepared: Path, tmp_path: Path, synthetic_csv: Path
) -> None:
    with pytest.raises(ValueError, match="leave-one-out split only"):
        retrieval.training.run.train(config_for(prepared, "data.protocol=comirec"), tmp_path / "m", verbose=0)
    with pytest.raises(ArtifactError, match="not a prepared-data folder"):
        retrieval.training.run.train(config_for(synthetic_csv.parent, "data.format=prepared"), tmp_path / "m")
    with pytest.raises(SystemExit, match="2"):  # refused by the argument parser, before any model is read
        run_tool("evaluate", "--model", str(tmp_path), "--data", str(prepared), "--protocol", "comirec")


def table_model(vocab: ItemVocab, vectors: dict[str, np.ndarray]) -> ModelArtifact:
    """A numpy stand-in for a trained model over ``vocab``: an item's vector is ``vectors[id]``
    and a user's is the mean of their history's."""
    table = np.zeros((vocab.num_embeddings, 4), np.float32)
    for i, item in enumerate(vocab.ids, start=1):
        table[i] = vectors[item]

    def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:
        items = inputs["items"]
        return (table[items].sum(1) / np.maximum((items > 0).sum(1, keepdims=True), 1))[:, None, :]

    manifest = {"version": "test", "max_len": 6, "num_interests": 1}
    return ModelArtifact(None, manifest, vocab, table, user_vectors)


def test_a_model_with_another_vocabulary_is_evaluated_through_it(prepared: Path, synthetic_csv: Path) -> None:
    """The model knows the items in another order and not at all some of them: its metrics on the
    prepared folder are those of the in-memory protocol on the raw log, which maps the log's ids
    through the model's vocabulary (unknown history items dropped, unknown targets missed)."""
    ids = list(read_vocab(prepared).ids)
    rng = np.random.default_rng(0)
    vectors = {item: rng.normal(size=4).astype(np.float32) for item in ids}
    known = [item for item in reversed(ids) if item not in ("i3", "i17")]
    model = table_model(ItemVocab(tuple(known)), vectors)
    for split in ("valid", "test"):
        expected = evaluate_protocol(model, synthetic_csv, "loo", split=split).metrics
        assert evaluate_prepared(model, prepared, split, batch_size=7) == pytest.approx(expected)
