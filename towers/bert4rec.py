"""BERT4Rec: a bidirectional transformer trained with the cloze task (Sun et al. 2019)."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from towers.registry import register_tower
from towers.transformer import TransformerTower


@register_tower("bert4rec")
class BERT4RecTower(TransformerTower):
    """Every position attends to every other; training hides random items behind a mask token
    and predicts them (objective ``cloze``). At serving time a mask token is appended after the
    newest item and its output is the user vector (K = 1): "what comes next?" is the cloze
    question for the last position.

    The mask token has its own learned embedding and the id :attr:`mask_id` (one past the item
    table), so it never enters the item table or the index.
    """

    causal = False
    objectives = ("cloze",)

    def build(self, input_shape: Any = None) -> None:
        self.mask_embedding = self.add_weight(
            shape=(self.dim,),
            initializer=keras.initializers.TruncatedNormal(stddev=0.02),
            name="mask_embedding",
        )
        super().build(input_shape)

    @property
    def mask_id(self) -> int:
        return int(self.item_tower.num_embeddings)

    def embed_items(self, items: Any) -> Any:
        is_mask = ops.expand_dims(ops.equal(items, self.mask_id), -1)
        embedded = super().embed_items(ops.where(ops.equal(items, self.mask_id), 0, items))
        return ops.where(is_mask, self.mask_embedding, embedded)

    def with_mask_appended(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The inputs plus a final mask event (no side features), cut to ``max_len`` events."""
        out = {}
        for name, value in inputs.items():
            last = ops.full_like(value[:, :1], self.mask_id if name == "items" else 0)
            out[name] = ops.concatenate([value, last], axis=1)[:, -self.max_len :]
        return out

    def call(self, inputs: dict[str, Any], training: bool = False) -> Any:
        return self.sequence_output(self.with_mask_appended(inputs), training=training)[
            :, -1:, :
        ]  # [B, 1, d]

    def attention_maps(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return super().attention_maps(self.with_mask_appended(inputs))

    def interest_weights(self, inputs: dict[str, Any]) -> Any:
        """The mask token's attention over the input's items ``[B, 1, L]`` (its weight on itself
        left out). An input of ``max_len`` events loses its oldest to the mask token: the tower
        never reads it, its weight is 0."""
        w = super().interest_weights(self.with_mask_appended(inputs))  # [B, 1, L'], the mask last
        length = ops.shape(inputs["items"])[1]
        return ops.concatenate([ops.zeros_like(w[:, :, :1]), w[:, :, :-1]], axis=-1)[:, :, -length:]
