"""SASRec: causal self-attention over the history; the newest position's output is the user (K = 1)."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from towers.base import RecencyPositionEmbedding, UserTower, sequence_mask
from towers.item import ItemTower
from towers.registry import register_tower
from towers.transformer import TransformerBlock


@register_tower("sasrec")
class SASRecTower(UserTower):
    """Kang & McAuley 2018, with pre-LN blocks.

    Args:
        item_tower: shared item tower.
        max_len: longest history read.
        num_interests: must be 1 (accepted so that every tower takes the same arguments).
        num_blocks: transformer blocks.
        num_heads: attention heads per block.
        dropout: dropout on embeddings, attention and feed-forward outputs.
    """

    objectives = ("all_positions", "last")

    def __init__(
        self,
        item_tower: ItemTower,
        max_len: int,
        num_interests: int = 1,
        num_blocks: int = 2,
        num_heads: int = 1,
        dropout: float = 0.2,
        **kwargs: Any,
    ) -> None:
        if num_interests != 1:
            raise ValueError(
                f"sasrec is a single-interest tower: num_interests must be 1, got {num_interests}"
            )
        super().__init__(item_tower, max_len, 1, **kwargs)
        self.num_blocks, self.num_heads, self.dropout_rate = num_blocks, num_heads, dropout
        self.positions = RecencyPositionEmbedding(max_len, self.dim)
        self.input_dropout = keras.layers.Dropout(dropout)
        self.blocks = [TransformerBlock(self.dim, num_heads, dropout) for _ in range(num_blocks)]
        self.final_norm = keras.layers.LayerNormalization(epsilon=1e-6)

    def build(self, input_shape: Any = None) -> None:
        self.item_tower.build()
        self.positions.build()
        for block in self.blocks:
            block.build((None, None, self.dim))
        self.final_norm.build((None, None, self.dim))
        self.built = True

    def sequence_output(self, inputs: dict[str, Any], training: bool = False) -> Any:
        """Output at every position ``[B, L, d]``; position t sees only positions <= t."""
        items = inputs["items"]
        mask = sequence_mask(items)  # [B, L]
        keep = ops.expand_dims(ops.cast(mask, "float32"), -1)  # [B, L, 1]
        length = ops.shape(items)[1]
        causal = ops.tril(ops.ones((length, length), dtype="bool"))  # [L, L]: key j <= query i
        attention_mask = ops.logical_and(ops.expand_dims(causal, 0), ops.expand_dims(mask, 1))
        x = self.item_tower(items) * (self.dim**0.5)
        x = self.input_dropout(self.positions(x), training=training) * keep
        for block in self.blocks:
            x = block(x, attention_mask=attention_mask, training=training) * keep
        return self.final_norm(x)

    def call(self, inputs: dict[str, Any], training: bool = False) -> Any:
        return self.sequence_output(inputs, training=training)[:, -1:, :]  # [B, 1, d]

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.pop("num_interests")
        return {
            **config,
            "num_blocks": self.num_blocks,
            "num_heads": self.num_heads,
            "dropout": self.dropout_rate,
        }
