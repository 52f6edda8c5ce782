"""YouTube DNN (Covington et al. 2016): the mean of the watched items' embeddings through an MLP (K = 1)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
from keras import ops

from towers.base import UserTower, sequence_mask
from towers.item import ItemTower
from towers.registry import register_tower


def masked_mean(x: Any, mask: Any) -> Any:
    """Mean of ``x`` ``[B, L, d]`` over the positions where ``mask`` ``[B, L]`` is True -> ``[B, d]``.

    A row without any True position gives the zero vector.
    """
    keep = ops.expand_dims(ops.cast(mask, x.dtype), -1)  # [B, L, 1]
    count = ops.maximum(ops.sum(keep, axis=1), 1.0)  # [B, 1]; 1 avoids 0 / 0 on empty rows
    return ops.sum(x * keep, axis=1) / count


@register_tower("youtubednn")
class YouTubeDNNTower(UserTower):
    """Masked mean of the history's item embeddings, then ReLU layers and a linear output of size d.

    The output layer is linear (the paper's last layer is ReLU): inner products with the
    item table must be free to be negative, and a non-negative user vector wastes half the
    space. Order is ignored by design: this is the bag-of-items baseline.

    Args:
        item_tower: shared item tower.
        max_len: longest history read.
        num_interests: must be 1 (accepted so that every tower takes the same arguments).
        hidden_units: widths of the hidden ReLU layers; default ``(4 d,)``.

    Call:
        inputs: ``{"items": int [B, L]}`` -> float32 ``[B, 1, d]``.
    """

    def __init__(
        self,
        item_tower: ItemTower,
        max_len: int,
        num_interests: int = 1,
        hidden_units: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> None:
        if num_interests != 1:
            raise ValueError(
                f"youtubednn is a single-interest tower: num_interests must be 1, got {num_interests}"
            )
        super().__init__(item_tower, max_len, 1, **kwargs)
        self.hidden_units = [int(u) for u in (hidden_units or (4 * self.dim,))]
        self.hidden = [keras.layers.Dense(units, activation="relu") for units in self.hidden_units]
        self.output_layer = keras.layers.Dense(self.dim)

    def build(self, input_shape: Any = None) -> None:
        self.item_tower.build()
        width = self.dim
        for layer in self.hidden:
            layer.build((None, width))
            width = layer.units
        self.output_layer.build((None, width))
        self.built = True

    def call(self, inputs: dict[str, Any], training: bool = False) -> Any:
        items = inputs["items"]
        x = masked_mean(self.item_tower(items), sequence_mask(items))  # [B, d]
        for layer in self.hidden:
            x = layer(x)
        return ops.expand_dims(self.output_layer(x), 1)  # [B, 1, d]
