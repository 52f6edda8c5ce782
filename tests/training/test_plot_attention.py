"""tools/plot_attention.py and retrieval.training.attention: the maps drawn are the tower's, for the
right user."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

from retrieval.data.interactions import build_sequences
from retrieval.data.loaders import load_interactions
from retrieval.data.vocab import ItemVocab
from retrieval.training.attention import attention_for_history, user_history
from retrieval.training.config import ModelConfig
from retrieval.training.model import build_model
from tests.helpers import run_tool


@pytest.fixture(scope="module")
def mind_model(synthetic_csv, tmp_path_factory):
    out = tmp_path_factory.mktemp("plot") / "model"
    args = ["--data", str(synthetic_csv), "--model", "mind", "--out", str(out), "--epochs", "1"]
    assert run_tool("train", *args, "--dim", "16", "--max-len", "12", "--negatives", "10", "--quiet") == 0
    return out


def test_plot_attention_writes_the_towers_maps_for_the_user(
    mind_model, synthetic_csv, tmp_path, capsys
) -> None:
    png = tmp_path / "u3.png"
    code = run_tool(
        "plot_attention",
        "--model",
        str(mind_model),
        "--data",
        str(synthetic_csv),
        "--user",
        "u3",
        "--out",
        str(png),
    )
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000

    # The history is user u3's, mapped through the model's vocabulary, and the maps are the
    # loaded tower's attention maps on it.
    vocab = ItemVocab.load(mind_model / "vocab.json")
    history = user_history(synthetic_csv, "u3", vocab)
    data = build_sequences(load_interactions(synthetic_csv))
    assert vocab.external(history) == data.vocab.external(data.sequences[data.users.index("u3")])
    # K = 4 interests over the last max_len (12) items of the history.
    assert printed["maps"] == {"routing": [4, min(len(history), 12)]}
    model = keras.saving.load_model(mind_model / "model.keras")
    expected = np.asarray(
        model.user_tower.attention_maps({"items": history[None, -12:].astype(np.int32)})["routing"]
    )[0]
    np.testing.assert_allclose(attention_for_history(model, history)["routing"], expected, atol=1e-6)


def test_plot_attention_reports_bad_input(mind_model, synthetic_csv, tmp_path, capsys) -> None:
    args = ["--model", str(mind_model), "--data", str(synthetic_csv), "--out", str(tmp_path / "x.png")]
    assert run_tool("plot_attention", *args, "--user", "nobody") == 2
    assert "user 'nobody' is not in" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()
    # A tower without attention maps says so.
    mean_pool = build_model(ModelConfig(tower="youtubednn", dim=8, max_len=5), 10)
    with pytest.raises(ValueError, match="no attention maps"):
        attention_for_history(mean_pool, np.array([1, 2, 3]))
