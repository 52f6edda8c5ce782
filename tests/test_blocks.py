"""Transformer block options (``model.block``, ``model.ffn_multiplier``): the arithmetic against
NumPy, and the towers built with them: padding, causality, round trips, export, bad values."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest

from retrieval.training.config import ModelConfig
from retrieval.training.model import TwoTowerModel, build_model, export_user_tower
from tests.helpers import saved_endpoint
from towers.transformer import SequenceBlock

DIM, NUM_ITEMS, MAX_LEN = 8, 30, 10
TRANSFORMERS = ("sasrec", "bert4rec", "fmlprec", "bsarec")


class IdentityMix(SequenceBlock):
    """A block whose mixing returns its input, so the test sees the joins and the feed-forward."""

    def mix(self, h: Any, qk: Any, attention_mask: Any, keep: Any, training: bool) -> tuple[Any, Any]:
        return h, None


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * gamma + beta


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def gelu(x: np.ndarray) -> np.ndarray:  # keras' default: the exact erf form
    from math import erf

    return 0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))


def numpy_block(block: IdentityMix, x: np.ndarray) -> np.ndarray:
    """The block's output computed from its weights alone."""

    def weights(layer: Any) -> list[np.ndarray]:
        return [np.asarray(v) for v in layer.weights]

    n1, n2 = weights(block.norm1), weights(block.norm2)
    (w_in, b_in), (w_out, b_out) = weights(block.ffn_in), weights(block.ffn_out)
    gates = [weights(g) for g in block.gates]

    def join(x: np.ndarray, h: np.ndarray, part: int) -> np.ndarray:
        return x + (sigmoid(x @ gates[part][0] + gates[part][1]) * h if gates else h)

    x = join(x, layer_norm(x, *n1), 0)
    h = layer_norm(x, *n2) @ w_in + b_in
    if block.style == "ligr":
        gate, up = np.split(h, 2, axis=-1)
        h = gate * sigmoid(gate) * up
    else:
        h = gelu(h)
    return join(x, h @ w_out + b_out, 1)


@pytest.mark.parametrize(("style", "multiplier"), [("pre_ln", 1), ("pre_ln", 4), ("ligr", 1), ("ligr", 4)])
def test_a_block_matches_numpy(style: str, multiplier: int) -> None:
    keras.utils.set_random_seed(0)
    block = IdentityMix(DIM, dropout=0.3, ffn_multiplier=multiplier, style=style)
    block.build((None, None, DIM))
    for gate in block.gates:  # away from the initial zero bias, so a wrong gate shows
        gate.bias.assign(np.random.default_rng(1).normal(size=DIM).astype(np.float32))
    x = np.random.default_rng(2).normal(size=(3, 5, DIM)).astype(np.float32)
    got = np.asarray(block(x, attention_mask=None, training=False))
    np.testing.assert_allclose(got, numpy_block(block, x), rtol=1e-4, atol=1e-5)
    assert block.ffn_in.kernel.shape == (DIM, multiplier * DIM * (2 if style == "ligr" else 1))


def test_bad_block_options_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown block style 'post_ln'"):
        IdentityMix(DIM, style="post_ln")
    with pytest.raises(ValueError, match="ffn_multiplier must be >= 1"):
        IdentityMix(DIM, ffn_multiplier=0)
    with pytest.raises(ValueError, match="block"):
        ModelConfig(tower="sasrec", block="post_ln")  # type: ignore[arg-type]


def ligr_model(tower: str) -> TwoTowerModel:
    keras.utils.set_random_seed(0)
    config = ModelConfig(tower=tower, dim=DIM, max_len=MAX_LEN, num_heads=2, block="ligr", ffn_multiplier=4)
    return build_model(config, NUM_ITEMS + 1)


def histories(seed: int, length: int = MAX_LEN) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros((4, length), np.int32)
    for row in out:
        n = rng.integers(1, length + 1)
        row[length - n :] = rng.integers(1, NUM_ITEMS + 1, n)
    return out


@pytest.mark.parametrize("tower", TRANSFORMERS)
def test_build_model_gives_every_block_the_options(tower: str) -> None:
    blocks = ligr_model(tower).user_tower.blocks
    assert [(b.style, b.ffn_multiplier, len(b.gates)) for b in blocks] == [("ligr", 4, 2)] * 2


@pytest.mark.parametrize("tower", TRANSFORMERS)
def test_ligr_towers_ignore_padding(tower: str) -> None:
    model = ligr_model(tower)
    x = histories(3, length=6)
    wider = np.concatenate([np.zeros((len(x), MAX_LEN - 6), np.int32), x], axis=1)
    expected = np.asarray(model({"items": wider}))
    np.testing.assert_allclose(np.asarray(model({"items": x})), expected, atol=1e-5)


def test_ligr_sasrec_does_not_see_the_future() -> None:
    tower = ligr_model("sasrec").user_tower
    x = np.arange(1, MAX_LEN + 1, dtype=np.int32)[None, :]
    changed = x.copy()
    changed[0, 6:] = NUM_ITEMS
    a = np.asarray(tower.sequence_output({"items": x}))
    b = np.asarray(tower.sequence_output({"items": changed}))
    np.testing.assert_allclose(a[0, :6], b[0, :6], atol=1e-5)
    assert np.abs(a[0, 6:] - b[0, 6:]).max() > 1e-3


@pytest.mark.parametrize("tower", ["sasrec", "bsarec"])
def test_ligr_towers_survive_a_keras_file_and_the_export(tower: str, tmp_path) -> None:
    model = ligr_model(tower)
    x = histories(4)
    expected = np.asarray(model({"items": x}))
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert [b.style for b in loaded.user_tower.blocks] == ["ligr", "ligr"]
    np.testing.assert_allclose(np.asarray(loaded({"items": x})), expected, atol=1e-6)
    export_user_tower(model, tmp_path / "user_tower")
    np.testing.assert_allclose(saved_endpoint(tmp_path / "user_tower")({"items": x}), expected, atol=1e-5)


def test_a_model_saved_before_the_options_loads_as_pre_ln() -> None:
    model = build_model(ModelConfig(tower="sasrec", dim=DIM, max_len=MAX_LEN), NUM_ITEMS + 1)
    config = keras.saving.serialize_keras_object(model.user_tower)
    config["config"].pop("ffn_multiplier")
    config["config"].pop("block")
    clone = keras.saving.deserialize_keras_object(config)
    assert [(b.style, b.ffn_multiplier, b.gates) for b in clone.blocks] == [("pre_ln", 1, [])] * 2
