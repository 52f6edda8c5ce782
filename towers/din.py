"""DIN's local activation unit (Zhou et al. 2018) as a candidate-free, multi-interest retrieval tower.

In DIN the query of the activation unit is the *candidate* ad: the user vector
``Σ_l a(h_l, e_candidate) h_l`` is recomputed for every candidate. That is target attention,
and it cannot sit inside a two-tower retriever: retrieval works because the user vector does
not depend on the candidate, so that all items are embedded once, pre-indexed, and the best
ones are found by one inner-product search per user vector. A candidate-dependent user
vector would need one tower evaluation per (user, item) pair, i.e. a ranking model.

This tower keeps DIN's activation unit and replaces the candidate by K candidate-free
queries: the user's most recent item (the best single guess of what comes next) and K−1
learned interest queries. Each query gives one interest ``v_k = Σ_l w_kl h_l`` over the
unpadded positions, with DIN's un-normalised weights: no softmax, so the size of ``v_k``
keeps how strongly the history supports that interest.

It overfits fast, as the DIN paper reports of DIN itself (its mini-batch aware regularisation
exists for that): on Amazon Beauty validation NDCG@10 peaked after 4 epochs (0.039) and fell
to 0.024 by epoch 6 while the training loss kept falling, so the ``*-din`` presets stop early
(``train.patience``) and export the best epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
from keras import ops

from towers.base import UserTower, sequence_mask
from towers.item import ItemTower
from towers.registry import register_tower


def activation_first_layer(first: keras.layers.Dense, keys: Any, queries: Any) -> Any:
    """DIN's activation unit's first layer over every (query, key) pair: ``[B, Q, L, u]``.

    ``first`` is a Dense layer on ``[k, q, k − q, k ⊙ q]`` (``4d`` inputs); keys ``[B, L, d]``,
    queries ``[B, Q, d]``. That input is linear in its four blocks, so with the kernel split in
    four ``k·(W_k + W_−)`` is computed once per key and ``q·(W_q − W_−)`` once per query instead
    of once per pair; only the ``k ⊙ q`` block needs the ``[B, Q, L]`` grid. Same result as the
    concatenation (the numpy tests compute that), ~4x less work in this layer.
    """
    d = first.kernel.shape[0] // 4
    w_k, w_q, w_diff, w_prod = (first.kernel[i * d : (i + 1) * d] for i in range(4))
    products = ops.expand_dims(keys, 1) * ops.expand_dims(queries, 2)  # [B, Q, L, d]
    x = (
        ops.expand_dims(ops.matmul(keys, w_k + w_diff), 1)  # [B, 1, L, u]
        + ops.expand_dims(ops.matmul(queries, w_q - w_diff), 2)  # [B, Q, 1, u]
        # (k ⊙ q)·W_⊙ as a product then one matmul: the equivalent einsum "bld,bqdu->bqlu"
        # builds a [B, Q, d, u] operand and was slower (docs/benchmarks.md).
        + ops.matmul(products, w_prod)
        + first.bias
    )
    return first.activation(x)


@register_tower("din")
class DINTower(UserTower):
    """K queries (newest item + K−1 learned) weigh the history through DIN's activation unit.

    ``w_kl = MLP([h_l, q_k, h_l − q_k, h_l ⊙ q_k])`` (sigmoid hidden layers, as in DIN's reference
    code, and a linear scalar output), ``w_kl = 0`` at padded positions, ``v_k = Σ_l w_kl h_l``.

    Args:
        item_tower: shared item tower.
        max_len: longest history read.
        num_interests: K; K = 1 uses only the most recent item as query.
        attention_units: widths of the activation unit's hidden layers; (80, 40) as in DIN's
            reference code. The MLP runs on every (query, position) pair: the paper's single layer
            of 36 trained 2.6x faster on ML-100K but reached a lower NDCG@10 (0.031 vs 0.041).

    Call:
        inputs: ``{"items": int [B, L]}`` -> float32 ``[B, K, d]``.
    """

    explanation = "attention"

    def __init__(
        self,
        item_tower: ItemTower,
        max_len: int,
        num_interests: int = 4,
        attention_units: Sequence[int] = (80, 40),
        **kwargs: Any,
    ) -> None:
        super().__init__(item_tower, max_len, num_interests, **kwargs)
        if not attention_units:
            raise ValueError("the activation unit needs at least one hidden layer (attention_units)")
        self.attention_units = [int(u) for u in attention_units]
        self.hidden = [keras.layers.Dense(units, activation="sigmoid") for units in self.attention_units]
        self.weight_layer = keras.layers.Dense(1)

    def build(self, input_shape: Any = None) -> None:
        self.item_tower.build()
        width = 4 * self.dim
        for layer in self.hidden:
            layer.build((None, None, None, width))
            width = layer.units
        self.weight_layer.build((None, None, None, width))
        if self.num_interests > 1:
            # Same scale as the item table: the queries are compared with item embeddings.
            self.learned_queries = self.add_weight(
                shape=(self.num_interests - 1, self.dim),
                initializer=keras.initializers.TruncatedNormal(stddev=0.02),
                name="interest_queries",
            )
        self.built = True

    def queries(self, h: Any) -> Any:
        """Item embeddings ``[B, L, d]`` -> queries ``[B, K, d]``: the newest item, then the learned ones."""
        newest = h[:, -1:, :]  # left padding: the last column is the newest item
        if self.num_interests == 1:
            return newest
        learned = ops.broadcast_to(
            ops.expand_dims(self.learned_queries, 0), (ops.shape(h)[0], self.num_interests - 1, self.dim)
        )
        return ops.concatenate([newest, learned], axis=1)

    def activation(self, inputs: dict[str, Any]) -> tuple[Any, Any]:
        """Activation weights ``w`` ``[B, K, L]`` (0 on padding) and item embeddings ``[B, L, d]``."""
        items = inputs["items"]
        h = self.item_tower(items)  # [B, L, d]
        q = self.queries(h)  # [B, K, d]
        x = activation_first_layer(self.hidden[0], h, q)
        for layer in self.hidden[1:]:
            x = layer(x)
        w = ops.squeeze(self.weight_layer(x), -1)  # [B, K, L], not normalised
        return ops.where(ops.expand_dims(sequence_mask(items), 1), w, 0.0), h

    def call(self, inputs: dict[str, Any], training: bool = False) -> Any:
        w, h = self.activation(inputs)
        return ops.matmul(w, h)  # [B, K, d]

    def attention_maps(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """``{"activation": [B, K, L]}``: the un-normalised weight of each behaviour per query."""
        return {"activation": self.activation(inputs)[0]}
