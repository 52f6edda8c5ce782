"""Pre-LN transformer block shared by the sequence towers."""

from __future__ import annotations

from typing import Any

import keras


@keras.saving.register_keras_serializable(package="towers")
class TransformerBlock(keras.layers.Layer):
    """``x + MHA(LN(x))`` then ``x + FFN(LN(x))`` (pre-layer-norm, as in SASRec's later versions).

    Call:
        x: ``[B, L, d]``; attention_mask: bool ``[B, L, L]``, True where query i may attend
        to key j -> ``[B, L, d]``.
    """

    def __init__(self, dim: int, num_heads: int, dropout: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.dim, self.num_heads, self.dropout_rate = dim, num_heads, dropout
        self.norm1 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.norm2 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.attention = keras.layers.MultiHeadAttention(num_heads, dim // num_heads, dropout=dropout)
        self.ffn_in = keras.layers.Dense(dim, activation="gelu")
        self.ffn_out = keras.layers.Dense(dim)
        self.dropout = keras.layers.Dropout(dropout)

    def build(self, input_shape: Any) -> None:
        self.norm1.build(input_shape)
        self.norm2.build(input_shape)
        self.attention.build(input_shape, input_shape)
        self.ffn_in.build(input_shape)
        self.ffn_out.build(input_shape)
        self.built = True

    def call(self, x: Any, attention_mask: Any, training: bool = False) -> Any:
        h = self.norm1(x)
        h = self.attention(h, h, attention_mask=attention_mask, training=training)
        x = x + self.dropout(h, training=training)
        h = self.ffn_out(self.dropout(self.ffn_in(self.norm2(x)), training=training))
        return x + self.dropout(h, training=training)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "dim": self.dim,
            "num_heads": self.num_heads,
            "dropout": self.dropout_rate,
        }
