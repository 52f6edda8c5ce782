"""ComiRec-SA: the self-attentive multi-interest extractor (Lin et al. 2017; Cen et al. 2020)."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from towers.base import RecencyPositionEmbedding, UserTower, sequence_mask
from towers.item import ItemTower
from towers.registry import register_tower

_NEG = -1e9  # large finite negative: a fully padded row stays finite after softmax


@register_tower("sa")
class SelfAttentiveTower(UserTower):
    """K attention heads over the history, each a weighted sum of item embeddings.

    ``A = softmax(W2 tanh(W1 (H + P)ᵀ))`` over the unpadded positions (``[B, K, L]``) and
    ``V = A H`` (``[B, K, d]``): positions ``P`` shape the attention, the interests are
    combinations of pure item embeddings ``H``, as in ComiRec's reference code.

    Args:
        item_tower: shared item tower.
        max_len: longest history read.
        num_interests: K.
        attention_dim: width of ``W1``; ComiRec uses ``4 d``.
    """

    def __init__(
        self,
        item_tower: ItemTower,
        max_len: int,
        num_interests: int = 4,
        attention_dim: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(item_tower, max_len, num_interests, **kwargs)
        self.attention_dim = attention_dim or 4 * self.dim
        self.positions = RecencyPositionEmbedding(max_len, self.dim)
        self.w1 = keras.layers.Dense(self.attention_dim, activation="tanh")
        self.w2 = keras.layers.Dense(num_interests, use_bias=False)

    def build(self, input_shape: Any = None) -> None:
        self.item_tower.build()
        self.positions.build()
        self.w1.build((None, None, self.dim))
        self.w2.build((None, None, self.attention_dim))
        self.built = True

    def attention(self, inputs: dict[str, Any]) -> tuple[Any, Any]:
        """Returns the interest attention ``A`` ``[B, K, L]`` and item embeddings ``H`` ``[B, L, d]``."""
        items = inputs["items"]
        h = self.item_tower(items)  # [B, L, d]
        logits = self.w2(self.w1(self.positions(h)))  # [B, L, K]
        logits = ops.transpose(logits, (0, 2, 1))  # [B, K, L]
        mask = ops.expand_dims(sequence_mask(items), 1)  # [B, 1, L]
        logits = ops.where(mask, logits, _NEG)
        return ops.softmax(logits, axis=-1), h

    def call(self, inputs: dict[str, Any], training: bool = False) -> Any:
        a, h = self.attention(inputs)
        return ops.matmul(a, h)  # [B, K, d]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "attention_dim": self.attention_dim}
