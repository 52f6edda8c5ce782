"""AFM, the Attentional Factorization Machine (Xiao et al. 2017), as a ranker.

Each (user, candidate) pair is a handful of fields, each a ``d``-vector: the candidate's id
embedding, the candidate's attributes (mean-pooled), the user's history (mean-pooled item
embeddings) and the history's attributes (mean-pooled). Like an FM, AFM scores the pairwise
element-wise products of the fields, but weighs them by an attention network instead of
summing them: ``ŷ = w_0 + Σ_i w_i + pᵀ Σ_{i<j} a_ij (v_i ⊙ v_j)``,
``a_ij = softmax_ij(hᵀ ReLU(W (v_i ⊙ v_j) + b))``.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

import keras
from keras import ops

from rankers.base import Ranker
from rankers.layers import masked_mean, masked_softmax
from rankers.registry import register_ranker
from towers.base import sequence_mask


@register_ranker("afm")
class AFM(Ranker):
    """Attention-weighted pairwise interactions of 4 fields (2 without attributes) + linear terms.

    Args:
        attention_units: ``t``, the attention network's hidden size.
        attention_dropout: dropout on the attention weights (training only).
        **kwargs: :class:`~rankers.base.Ranker`'s arguments (``num_items``, ``dim``, ...).

    Call:
        inputs: see :class:`~rankers.base.Ranker` -> logits ``[B, C]``.
    """

    def __init__(
        self,
        *,
        attention_units: int = 16,
        attention_dropout: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.attention_units = attention_units
        self.num_fields = 4 if self.num_attributes else 2
        self.pairs = tuple(combinations(range(self.num_fields), 2))
        self.attention_hidden = keras.layers.Dense(attention_units, activation="relu", name="attention_w")
        self.attention_out = keras.layers.Dense(1, use_bias=False, name="attention_h")
        self.projection = keras.layers.Dense(1, use_bias=False, name="p")
        self.drop = keras.layers.Dropout(attention_dropout)
        self.item_bias = keras.layers.Embedding(self.num_items + 1, 1, embeddings_initializer="zeros")
        self.attribute_bias = (
            keras.layers.Embedding(self.num_attributes + 1, 1, embeddings_initializer="zeros")
            if self.num_attributes
            else None
        )

    def build_layers(self) -> None:
        self.attention_hidden.build((None, self.dim))
        self.attention_out.build((None, self.attention_units))
        self.projection.build((None, self.dim))
        self.item_bias.build((None,))
        if self.attribute_bias is not None:
            self.attribute_bias.build((None,))
        self.bias = self.add_weight(shape=(), initializer="zeros", name="bias")

    def fields(self, inputs: dict[str, Any]) -> Any:
        """The field vectors ``[B, C, m, d]``: candidate, (its attributes), history, (history attributes)."""
        candidates, history = inputs["candidates"], inputs["history"]
        e = self.item_tower.id_embedding(candidates)  # [B, C, d]
        user = masked_mean(self.item_tower.id_embedding(history), sequence_mask(history))  # [B, d]
        user = ops.broadcast_to(ops.expand_dims(user, 1), ops.shape(e))
        if not self.num_attributes:
            return ops.stack([e, user], axis=2)
        e_attributes = self.attribute_vectors(inputs.get("candidate_attributes"), e)  # [B, C, d]
        bag = self.history_attribute_bag(inputs)  # [B, 1, L·A]
        user_attributes = (
            ops.zeros_like(e)
            if bag is None
            else ops.broadcast_to(self.attribute_vectors(bag, user[:, :1]), ops.shape(e))
        )
        return ops.stack([e, e_attributes, user, user_attributes], axis=2)

    @staticmethod
    def history_attribute_bag(inputs: dict[str, Any]) -> Any | None:
        """Every attribute id of the history as one bag, shaped to broadcast per candidate ``[B, 1, L·A]``."""
        ids = inputs.get("history_attributes")
        if ids is None:
            return None
        return ops.expand_dims(ops.reshape(ids, (ops.shape(ids)[0], -1)), 1)

    def linear(self, inputs: dict[str, Any]) -> Any:
        """First-order terms ``w_0 + Σ_fields w`` ``[B, C]`` (multi-valued fields mean-pooled)."""
        candidates, history = inputs["candidates"], inputs["history"]
        out = self.bias + ops.squeeze(self.item_bias(candidates), -1)  # [B, C]
        out = out + ops.expand_dims(self.pooled_bias(self.item_bias, history), 1)
        if self.attribute_bias is not None:
            for ids in (inputs.get("candidate_attributes"), self.history_attribute_bag(inputs)):
                if ids is not None:
                    out = out + self.pooled_bias(self.attribute_bias, ids)
        return out

    @staticmethod
    def pooled_bias(table: keras.layers.Embedding, ids: Any) -> Any:
        """Mean scalar weight of the non-zero ids ``[..., n]`` -> ``[...]``."""
        return ops.squeeze(masked_mean(table(ids), sequence_mask(ids)), -1)

    def attention(self, inputs: dict[str, Any]) -> tuple[Any, Any]:
        """Attention weights ``a`` ``[B, C, P]`` (softmax over the P pairs), products ``[B, C, P, d]``."""
        v = self.fields(self.truncate(inputs))  # [B, C, m, d]
        left = ops.take(v, [i for i, _ in self.pairs], axis=2)
        right = ops.take(v, [j for _, j in self.pairs], axis=2)
        products = left * right  # [B, C, P, d]
        logits = ops.squeeze(self.attention_out(self.attention_hidden(products)), -1)  # [B, C, P]
        # (Keras's softmax warns on the single pair of the attribute-free case, which is fine: a = 1.)
        return masked_softmax(logits, ops.ones_like(logits) > 0), products

    def score(self, inputs: dict[str, Any], training: bool = False) -> Any:
        a, products = self.attention(inputs)
        a = self.drop(a, training=training)
        pooled = ops.sum(ops.expand_dims(a, -1) * products, axis=2)  # [B, C, d]
        return ops.squeeze(self.projection(pooled), -1) + self.linear(inputs)
