"""The validation callback traces the user tower once per run, not once per epoch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import retrieval.training.run
from retrieval.config import apply_overrides
from retrieval.data.features import SideVocab
from retrieval.training import Config, ModelConfig
from retrieval.training.model import TwoTowerModel, build_model
from retrieval.training.validation import FullRankingValidation, live_tower

TINY = ["model.tower=youtubednn", "model.dim=8", "model.max_len=6", "train.num_negatives=5"]
TINY += ["train.batch_size=32", "train.epochs=3"]


@pytest.fixture
def traces(monkeypatch) -> list[int]:
    """One entry per inference-mode trace of a :class:`TwoTowerModel` from now on: Python runs
    the model's ``call`` in graph mode only while TensorFlow traces it."""
    traced: list[int] = []
    call = TwoTowerModel.call

    def counted_call(self: TwoTowerModel, inputs: dict[str, Any], training: bool = False) -> Any:
        if not training and not tf.executing_eagerly():
            traced.append(1)
        return call(self, inputs, training=training)

    monkeypatch.setattr(TwoTowerModel, "call", counted_call)
    return traced


@pytest.mark.parametrize("tower", ["youtubednn", "sa"])
def test_the_live_tower_is_traced_once_for_every_batch_size_and_width(traces: list[int], tower: str) -> None:
    model = build_model(ModelConfig(tower=tower, dim=8, max_len=16), 21)
    user_vectors = live_tower(model, SideVocab())
    rng = np.random.default_rng(0)
    for rows, width in [(3, 8), (5, 16), (1, 4), (7, 8)]:
        items = rng.integers(0, 21, size=(rows, width)).astype(np.int32)
        items[:, -1] = rng.integers(1, 21, size=rows)  # no empty history
        got = user_vectors({"items": items})
        expected = model({"items": tf.constant(items)}, training=False).numpy()  # eager: no trace
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert len(traces) == 1


def test_validation_traces_the_tower_once_per_run(
    synthetic_csv: Path, tmp_path: Path, monkeypatch, traces: list[int]
) -> None:
    """Three epochs, each validated: the first validation traces the tower, the next two reuse
    that graph. Before, every epoch built a new ``tf.function`` and traced it again, and
    TensorFlow warned about retracing from the fifth trace on."""
    per_validation: list[int] = []
    on_epoch_end = FullRankingValidation.on_epoch_end

    def counted_validation(self: FullRankingValidation, epoch: int, logs: dict[str, Any] | None = None):
        before = len(traces)
        on_epoch_end(self, epoch, logs)
        per_validation.append(len(traces) - before)

    monkeypatch.setattr(FullRankingValidation, "on_epoch_end", counted_validation)
    monkeypatch.setattr(retrieval.training.run, "save_model", lambda *args, **kwargs: None)  # not under test
    config = apply_overrides(Config(), [f"data.path={synthetic_csv}", *TINY])
    metrics = retrieval.training.run.train(config, tmp_path / "m", verbose=0)
    assert len(metrics.validation_per_epoch) == 3
    assert per_validation == [1, 0, 0]
