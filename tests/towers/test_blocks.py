"""The transformer towers' shared block against NumPy, and Keras files saved while the removed
block options (``model.block``, ``model.ffn_multiplier``) existed."""

from __future__ import annotations

from math import erf
from typing import Any

import keras
import numpy as np
import pytest

from retrieval.training.config import ModelConfig
from retrieval.training.model import build_model
from towers.transformer import REMOVED_OPTIONS, SequenceBlock

DIM, NUM_ITEMS, MAX_LEN = 8, 30, 10


class IdentityMix(SequenceBlock):
    """A block whose mixing returns its input, so the test sees the joins and the feed-forward."""

    def mix(self, h: Any, qk: Any, attention_mask: Any, keep: Any, training: bool) -> tuple[Any, Any]:
        return h, None


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * gamma + beta


def gelu(x: np.ndarray) -> np.ndarray:  # keras' default: the exact erf form
    return 0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))


def numpy_block(block: IdentityMix, x: np.ndarray) -> np.ndarray:
    """The block's output computed from its weights alone: ``x + LN(x)``, then ``x + FFN(LN(x))``."""

    def weights(layer: Any) -> list[np.ndarray]:
        return [np.asarray(v) for v in layer.weights]

    (w_in, b_in), (w_out, b_out) = weights(block.ffn_in), weights(block.ffn_out)
    x = x + layer_norm(x, *weights(block.norm1))
    return x + gelu(layer_norm(x, *weights(block.norm2)) @ w_in + b_in) @ w_out + b_out


def test_a_block_matches_numpy() -> None:
    keras.utils.set_random_seed(0)
    block = IdentityMix(DIM, dropout=0.3)
    block.build((None, None, DIM))
    x = np.random.default_rng(2).normal(size=(3, 5, DIM)).astype(np.float32)
    got = np.asarray(block(x, attention_mask=None, training=False))
    np.testing.assert_allclose(got, numpy_block(block, x), rtol=1e-4, atol=1e-5)
    assert block.ffn_in.kernel.shape == (DIM, DIM)


def saved_tower(**options: Any) -> dict[str, Any]:
    """A sasrec tower's Keras serialization, with ``options`` written into its config."""
    model = build_model(ModelConfig(tower="sasrec", dim=DIM, max_len=MAX_LEN), NUM_ITEMS + 1)
    saved = keras.saving.serialize_keras_object(model.user_tower)
    saved["config"].update(options)
    return saved


def test_a_tower_saved_with_the_removed_options_at_their_defaults_loads() -> None:
    assert REMOVED_OPTIONS == {"ffn_multiplier": 1, "block": "pre_ln"}
    clone = keras.saving.deserialize_keras_object(saved_tower(**REMOVED_OPTIONS))
    assert [type(b).__name__ for b in clone.blocks] == ["TransformerBlock"] * 2
    assert "block" not in clone.get_config() and "ffn_multiplier" not in clone.get_config()


@pytest.mark.parametrize("options", [{"block": "ligr"}, {"ffn_multiplier": 4}])
def test_a_tower_saved_with_a_removed_option_set_is_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=f"{next(iter(options))}.*removed"):
        keras.saving.deserialize_keras_object(saved_tower(**options))
