"""Transformer sequence towers (SASRec, BERT4Rec): pre-LN blocks and side-information fusion."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from towers.base import RecencyPositionEmbedding, UserTower, sequence_mask
from towers.item import ItemTower
from towers.saving import ConstructorConfig
from towers.side import SideInformation


@keras.saving.register_keras_serializable(package="towers")
class SequenceBlock(ConstructorConfig, keras.layers.Layer):
    """``x + mix(LN(x))`` then ``x + FFN(LN(x))`` (pre-layer-norm, a GELU feed-forward of width
    ``dim``, as in SASRec): the part every sequence block shares; subclasses choose :meth:`mix`,
    how positions exchange information.

    Args:
        dim: the stream's width ``d``.
        dropout: on the mixing's and the feed-forward's outputs and inside the feed-forward.

    Call:
        x: ``[B, L, d]``; attention_mask: bool ``[B, L, L]``, True where query i may attend to
        key j; side: optional ``[B, L, d]`` (NOVA, see :class:`TransformerBlock`); keep: float
        ``[B, L, 1]``, 1 at items and 0 at padding -> ``[B, L, d]`` (and the attention weights
        ``[B, heads, L, L]``, or None for a block without attention, with ``return_attention=True``).
    """

    def __init__(self, dim: int, dropout: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dim, self.dropout_rate = dim, dropout
        self.norm1 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.norm2 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.ffn_in = keras.layers.Dense(dim, activation="gelu")
        self.ffn_out = keras.layers.Dense(dim)
        self.dropout = keras.layers.Dropout(dropout)

    def build(self, input_shape: Any) -> None:
        for layer in (self.norm1, self.norm2, self.ffn_in, self.ffn_out):
            layer.build(input_shape)
        self.built = True

    def mix(self, h: Any, qk: Any, attention_mask: Any, keep: Any, training: bool) -> tuple[Any, Any]:
        """Mixing across positions: ``h = LN(x)`` ``[B, L, d]`` (``qk`` = ``LN(x + side)`` under
        NOVA, else ``h``) -> ``[B, L, d]`` and the attention weights ``[B, heads, L, L]`` or None."""
        raise NotImplementedError

    def call(
        self,
        x: Any,
        attention_mask: Any,
        side: Any = None,
        keep: Any = None,
        training: bool = False,
        return_attention: bool = False,
    ) -> Any:
        h = self.norm1(x)
        qk = h if side is None else self.norm1(x + side)
        keep = ops.ones_like(x[:, :, :1]) if keep is None else keep
        h, scores = self.mix(h, qk, attention_mask, keep, training)
        x = x + self.dropout(h, training=training)
        h = self.ffn_out(self.dropout(self.ffn_in(self.norm2(x)), training=training))
        x = x + self.dropout(h, training=training)
        return (x, scores) if return_attention else x


@keras.saving.register_keras_serializable(package="towers")
class TransformerBlock(SequenceBlock):
    """A :class:`SequenceBlock` mixing by multi-head self-attention.

    With ``side`` (NOVA), queries and keys are computed from ``LN(x + side)`` (NOVA-BERT's
    additive fusion of the layer's item representation and the side embedding, under this
    block's pre-layer-norm) and values from ``LN(x)`` alone, so the attention output is a
    combination of item-only values whose weights the side information chooses. Normalising
    the sum, not adding ``side`` after the norm, keeps the side embedding at the scale it has
    in the invasive ``sum`` (beside the first block's ``sqrt(d)``-scaled item embeddings)
    instead of a few hundredths beside a unit-variance ``LN(x)``.
    """

    def __init__(self, dim: int, num_heads: int, dropout: float = 0.0, **kwargs: Any) -> None:
        super().__init__(dim, dropout, **kwargs)
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.attention = keras.layers.MultiHeadAttention(num_heads, dim // num_heads, dropout=dropout)

    def build(self, input_shape: Any) -> None:
        self.attention.build(input_shape, input_shape, input_shape)
        super().build(input_shape)

    def mix(self, h: Any, qk: Any, attention_mask: Any, keep: Any, training: bool) -> tuple[Any, Any]:
        return self.attention(
            qk, h, qk, attention_mask=attention_mask, return_attention_scores=True, training=training
        )


class TransformerTower(UserTower):
    """Embedding, positions, side-information fusion and a stack of blocks; subclasses choose
    the attention direction (``causal``) and how the user vector is read out.

    Args:
        item_tower: shared item tower.
        max_len: longest input read.
        num_interests: must be 1 (accepted so that every tower takes the same arguments).
        num_blocks, num_heads, dropout: the stack.
        fusion: one of ``towers.side.FUSIONS``.
        side_features: per-event feature name -> vocabulary size (``towers.side.EVENT_FEATURES``);
            the item tower's attributes join the side information whenever it has them.
    """

    causal: bool = True
    explanation = "attention"

    def __init__(
        self,
        item_tower: ItemTower,
        max_len: int,
        num_interests: int = 1,
        num_blocks: int = 2,
        num_heads: int = 1,
        dropout: float = 0.2,
        fusion: str = "none",
        side_features: dict[str, int] | None = None,
        **kwargs: Any,
    ) -> None:
        if num_interests != 1:
            raise ValueError(
                f"{type(self).__name__} is a single-interest tower: num_interests must be 1, "
                f"got {num_interests}"
            )
        super().__init__(item_tower, max_len, 1, **kwargs)
        self.num_blocks, self.num_heads, self.dropout_rate = num_blocks, num_heads, dropout
        self.fusion, self.side_features = fusion, dict(side_features or {})
        self.side_info = SideInformation(fusion, self.dim, self.side_features, item_tower.num_attributes > 0)
        self.positions = RecencyPositionEmbedding(max_len, self.dim)
        self.input_dropout = keras.layers.Dropout(dropout)
        self.blocks = [self.make_block() for _ in range(num_blocks)]
        self.final_norm = keras.layers.LayerNormalization(epsilon=1e-6)

    def build(self, input_shape: Any = None) -> None:
        self.item_tower.build()
        self.positions.build()
        for block in self.blocks:
            block.build((None, None, self.dim))
        self.final_norm.build((None, None, self.dim))
        self.side_info.build()
        self.built = True

    def make_block(self) -> SequenceBlock:
        """One block of the stack (the hook a tower overrides to mix positions otherwise)."""
        return TransformerBlock(self.dim, self.num_heads, self.dropout_rate)

    def embed_items(self, items: Any) -> Any:
        """Item representations ``[B, L, d]`` (see :meth:`SideInformation.items`)."""
        return self.side_info.items(items, self.item_tower)

    def encode(self, inputs: dict[str, Any], training: bool = False) -> tuple[Any, list[Any]]:
        """Outputs at every position ``[B, L, d]`` and each block's attention ``[B, heads, L, L]``
        (None for a block without attention)."""
        items = inputs["items"]
        mask = sequence_mask(items)  # [B, L]
        keep = ops.expand_dims(ops.cast(mask, "float32"), -1)  # [B, L, 1]
        attention_mask = ops.expand_dims(mask, 1)  # [B, 1, L]: never attend to padding
        if self.causal:
            length = ops.shape(items)[1]
            causal = ops.tril(ops.ones((length, length), dtype="bool"))  # key j <= query i
            attention_mask = ops.logical_and(ops.expand_dims(causal, 0), attention_mask)
        else:
            attention_mask = ops.repeat(attention_mask, ops.shape(items)[1], axis=1)
        x = self.embed_items(items) * (self.dim**0.5)
        side = None if self.fusion == "none" else self.side_info.side(inputs, self.item_tower)
        if self.fusion == "nova":  # positions are side information too; values stay pure items
            side = side + ops.expand_dims(self.positions.embeddings(ops.shape(items)[1]), 0)
        else:
            x = self.positions(x)
            if self.side_info.invasive:
                x, side = self.side_info.fuse(x, side), None
        x = self.input_dropout(x, training=training) * keep
        side = None if side is None else side * keep
        attention = []
        for block in self.blocks:
            x, scores = block(
                x, attention_mask, side=side, keep=keep, training=training, return_attention=True
            )
            x = x * keep
            attention.append(scores)
        return self.final_norm(x), attention

    def sequence_output(self, inputs: dict[str, Any], training: bool = False) -> Any:
        """Output at every position ``[B, L, d]``."""
        return self.encode(inputs, training=training)[0]

    def attention_maps(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Per block, each head's attention from the newest position ``[B, heads, L]``."""
        _, attention = self.encode(inputs)
        return {f"block{i}": a[:, :, -1, :] for i, a in enumerate(attention) if a is not None}

    def interest_weights(self, inputs: dict[str, Any]) -> Any:
        """The last block's attention from the newest position, averaged over its heads:
        ``[B, 1, L]`` (the one interest is that position's output)."""
        if self.explanation == "none":
            return super().interest_weights(inputs)  # raises: no such weights
        _, attention = self.encode(inputs)
        return ops.mean(attention[-1][:, :, -1:, :], axis=1)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> UserTower:
        return super().from_config(without_removed_options(config))


REMOVED_OPTIONS = {"ffn_multiplier": 1, "block": "pre_ln"}
"""Options of the transformer towers taken out (``model.ffn_multiplier``, ``model.block``:
measured without gain), each with the value every tower had unless it was set."""


def without_removed_options(config: dict[str, Any]) -> dict[str, Any]:
    """A tower's saved ``config`` without :data:`REMOVED_OPTIONS`, so that a Keras file saved
    while they existed loads.

    Raises:
        ValueError: ``config`` sets a removed option to another value: no code builds it now.
    """
    changed = {k: config[k] for k, v in REMOVED_OPTIONS.items() if k in config and config[k] != v}
    if changed:
        raise ValueError(
            f"{changed}: options removed from the transformer blocks (only {REMOVED_OPTIONS} load)"
        )
    return {k: v for k, v in config.items() if k not in REMOVED_OPTIONS}
