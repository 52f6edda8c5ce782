"""ComiRec-SA: the self-attentive multi-interest extractor (Lin et al. 2017; Cen et al. 2020)."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from towers.base import RecencyPositionEmbedding, UserTower, sequence_mask
from towers.item import ItemTower
from towers.registry import register_tower
from towers.side import SideInformation

_NEG = -1e9  # large finite negative: a fully padded row stays finite after softmax


def attention_penalty_term(a: Any) -> Any:
    """Lin et al. 2017's redundancy penalty ``‖A Aᵀ − I‖²_F``, averaged over the batch.

    It pushes the K heads towards attending to different positions (each head to few of them).

    Args:
        a: attention ``[B, K, L]`` (rows sum to 1 over the unpadded positions).

    Returns:
        scalar: ``mean_b Σ_ij ((A_b A_bᵀ)_ij − δ_ij)²``.
    """
    gram = ops.matmul(a, ops.transpose(a, (0, 2, 1)))  # [B, K, K]
    eye = ops.eye(ops.shape(a)[1], dtype=a.dtype)
    return ops.mean(ops.sum(ops.square(gram - eye), axis=(1, 2)))


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
        attention_penalty: weight of :func:`attention_penalty_term`, added to the training loss
            with ``add_loss`` (only when ``training``); 0 = off, as in ComiRec.
        fusion, side_features: side information (``towers.side``). With ``nova`` it joins
            ``H + P`` in choosing the attention and the interests stay combinations of pure
            item embeddings; the invasive modes merge it into ``H`` itself.
    """

    explanation = "attention"

    def __init__(
        self,
        item_tower: ItemTower,
        max_len: int,
        num_interests: int = 4,
        attention_dim: int | None = None,
        attention_penalty: float = 0.0,
        fusion: str = "none",
        side_features: dict[str, int] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(item_tower, max_len, num_interests, **kwargs)
        self.fusion, self.side_features = fusion, dict(side_features or {})
        self.side_info = SideInformation(fusion, self.dim, self.side_features, item_tower.num_attributes > 0)
        if attention_penalty < 0:
            raise ValueError(f"attention_penalty must be >= 0, got {attention_penalty}")
        self.attention_dim = attention_dim or 4 * self.dim
        self.attention_penalty = attention_penalty
        self.positions = RecencyPositionEmbedding(max_len, self.dim)
        self.w1 = keras.layers.Dense(self.attention_dim, activation="tanh")
        self.w2 = keras.layers.Dense(num_interests, use_bias=False)

    def build(self, input_shape: Any = None) -> None:
        self.item_tower.build()
        self.positions.build()
        self.w1.build((None, None, self.dim))
        self.w2.build((None, None, self.attention_dim))
        self.side_info.build()
        self.built = True

    def attention(self, inputs: dict[str, Any]) -> tuple[Any, Any]:
        """Returns the interest attention ``A`` ``[B, K, L]`` and item embeddings ``H`` ``[B, L, d]``."""
        items = inputs["items"]
        h = self.side_info.items(items, self.item_tower)  # [B, L, d], the values
        keys = self.positions(h)
        if self.fusion == "nova":
            keys = keys + self.side_info.side(inputs, self.item_tower)
        elif self.side_info.invasive:
            h = self.side_info.fuse(h, self.side_info.side(inputs, self.item_tower))
            keys = self.positions(h)
        logits = self.w2(self.w1(keys))  # [B, L, K]
        logits = ops.transpose(logits, (0, 2, 1))  # [B, K, L]
        mask = ops.expand_dims(sequence_mask(items), 1)  # [B, 1, L]
        logits = ops.where(mask, logits, _NEG)
        return ops.softmax(logits, axis=-1), h

    def call(self, inputs: dict[str, Any], training: bool = False) -> Any:
        a, h = self.attention(inputs)
        if training and self.attention_penalty > 0:
            # Collected by the model's `losses`, which TwoTowerModel.compute_loss adds to the task loss.
            self.add_loss(self.attention_penalty * attention_penalty_term(a))
        return ops.matmul(a, h)  # [B, K, d]

    def attention_maps(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """``{"interests": [B, K, L]}``: each interest's attention over the history."""
        return {"interests": self.attention(inputs)[0]}
