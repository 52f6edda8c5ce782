"""Capsule towers: behaviours are routed to K interest capsules by dynamic routing.

Two variants share the routing (:class:`RoutingTower`) and differ only where the papers do:

* ``dr``, ComiRec-DR (Cen et al. 2020): one bilinear map per interest, ``û_{k|l} = W_k e_l``,
  routing logits start at zero (the per-interest maps already make the capsules differ), the
  squashed capsules are the interests.
* ``mind``, MIND's behaviour-to-interest routing (Li et al. 2019): one bilinear map ``S``
  shared by every interest, ``û_l = S e_l``; random initial routing logits break the symmetry
  between the interests (with a shared ``S`` and equal logits every capsule would stay equal),
  a ReLU layer on the capsules, and by default ``K'_u = max(1, min(K, ⌊log2 |history|⌋))``
  interests per user.

Both maps are shared across history positions (ComiRec's code also has one map per absolute
position; with left padding that would make the output depend on the padding length).
Following ComiRec's reference implementation of both models, the routing logits are computed
from stop-gradient predictions, so gradients reach the maps only through the last iteration.
"""

from __future__ import annotations

from typing import Any, ClassVar

import keras
from keras import ops

from towers.base import UserTower, sequence_mask
from towers.item import ItemTower
from towers.registry import register_tower

_NEG = -1e9  # large finite negative: inactive interests get exactly zero coupling after softmax


def squash(s: Any) -> Any:
    """Capsule non-linearity ``‖s‖² / (1 + ‖s‖²) · s / ‖s‖`` over the last axis; ``0 -> 0``."""
    norm2 = ops.sum(ops.square(s), axis=-1, keepdims=True)
    return s * norm2 / ((1.0 + norm2) * ops.sqrt(norm2 + 1e-9))


def dynamic_interest_count(lengths: Any, num_interests: int) -> Any:
    """MIND's ``K'_u = max(1, min(K, ⌊log2 n⌋))`` for history lengths ``n`` int ``[B]`` -> int32 ``[B]``.

    ``⌊log2 n⌋`` is counted as the number of ``j = 1..K`` with ``2^j <= n``: exact integer
    arithmetic, where a float ``log2`` can land just below an integer.
    """
    lengths = ops.expand_dims(ops.cast(lengths, "int32"), -1)  # [B, 1]
    powers = ops.cast(2 ** ops.arange(1, num_interests + 1), "int32")  # [K]: 2, 4, ..., 2^K
    return ops.maximum(ops.sum(ops.cast(lengths >= powers, "int32"), axis=-1), 1)


class RoutingTower(UserTower):
    """Dynamic routing from the history to K interest capsules (shared by ``dr`` and ``mind``).

    For ``routing_iterations`` rounds: coupling ``c_kl = softmax_k(b_kl)`` over the active
    interests (zero at padded positions), capsules ``v_k = squash(Σ_l c_kl û_{k|l})``, and
    ``b_kl += <û_{k|l}, v_k>``. The variants differ only in the class attributes below, so
    that they share one constructor (which ``retrieval.training.model.build_model`` inspects) and one
    routing.

    Args:
        item_tower: shared item tower.
        max_len: longest history read.
        num_interests: K.
        routing_iterations: rounds of routing (3 in both papers).
        dynamic_interests: keep only ``K'_u`` interests per user (the others are zero vectors
            and take no behaviour in the routing); ``None`` = the variant's default.

    Call:
        inputs: ``{"items": int [B, L]}`` -> float32 ``[B, K, d]``.
    """

    SHARED_BILINEAR: ClassVar[bool]
    """One map ``S`` for every interest (MIND), else one ``W_k`` per interest (ComiRec-DR)."""
    STORED_INITIAL_LOGITS: ClassVar[bool]
    """Initial logits from a stored Gaussian draw (MIND), else zeros (ComiRec-DR)."""
    RELU_READOUT: ClassVar[bool]
    """A ReLU layer on the capsules (MIND's "H layers"), else the capsules are the interests."""
    DYNAMIC_INTERESTS: ClassVar[bool]
    """Default of ``dynamic_interests``."""

    explanation = "routing"

    def __init__(
        self,
        item_tower: ItemTower,
        max_len: int,
        num_interests: int = 4,
        routing_iterations: int = 3,
        dynamic_interests: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(item_tower, max_len, num_interests, **kwargs)
        if routing_iterations < 1:
            raise ValueError(f"routing_iterations must be >= 1, got {routing_iterations}")
        self.routing_iterations = routing_iterations
        self.dynamic_interests = self.DYNAMIC_INTERESTS if dynamic_interests is None else dynamic_interests
        width = self.dim if self.SHARED_BILINEAR else num_interests * self.dim
        self.bilinear = keras.layers.Dense(width, use_bias=False)
        self.output_layer = keras.layers.Dense(self.dim, activation="relu") if self.RELU_READOUT else None

    def build(self, input_shape: Any = None) -> None:
        self.item_tower.build()
        self.bilinear.build((None, None, self.dim))
        if self.output_layer is not None:
            self.output_layer.build((None, None, self.dim))
        if self.STORED_INITIAL_LOGITS:
            # MIND draws the initial logits from a Gaussian at every call, which would make
            # serving non-deterministic; zeros cannot replace them, because with a shared S all K
            # capsules would then receive identical inputs and stay identical. So one draw is
            # made here and stored as a non-trainable weight (saved and exported with the model),
            # indexed by recency (column 0 = newest) so that padding does not change it.
            self.stored_logits = self.add_weight(
                shape=(self.num_interests, self.max_len),
                initializer=keras.initializers.RandomNormal(stddev=1.0),
                trainable=False,
                name="initial_routing_logits",
            )
        self.built = True

    def predictions(self, h: Any) -> Any:
        """Item embeddings ``[B, L, d]`` -> predictions ``û`` ``[B, K, L, d]`` (shared: ``[B, 1, L, d]``)."""
        u = self.bilinear(h)
        if self.SHARED_BILINEAR:
            return ops.expand_dims(u, 1)  # the same for every interest; matmul broadcasts it
        batch, length = ops.shape(h)[0], ops.shape(h)[1]
        u = ops.reshape(u, (batch, length, self.num_interests, self.dim))
        return ops.transpose(u, (0, 2, 1, 3))

    def initial_logits(self, length: Any) -> Any:
        """Routing logits before the first round, ``[K, L]`` for an input of ``length`` positions."""
        if not self.STORED_INITIAL_LOGITS:
            # ComiRec's choice with per-interest maps: every behaviour starts equally coupled and
            # the maps make the capsules differ; no state to store.
            return ops.zeros((self.num_interests, length))
        recency = ops.flip(ops.arange(length), axis=0)  # [L]: L-1, ..., 1, 0
        return ops.take(self.stored_logits, recency, axis=1)

    def active_interests(self, mask: Any) -> Any:
        """bool ``[B, K]``: which interests a user has (all of them unless ``dynamic_interests``)."""
        batch = ops.shape(mask)[0]
        if not self.dynamic_interests:
            return ops.ones((batch, self.num_interests), dtype="bool")
        count = dynamic_interest_count(ops.sum(ops.cast(mask, "int32"), axis=1), self.num_interests)
        return ops.expand_dims(ops.arange(self.num_interests), 0) < ops.expand_dims(count, 1)

    def route(self, inputs: dict[str, Any]) -> tuple[Any, Any]:
        """Returns the interests ``[B, K, d]`` and the final coupling coefficients ``c`` ``[B, K, L]``."""
        items = inputs["items"]
        mask = sequence_mask(items)  # [B, L]
        u = self.predictions(self.item_tower(items))  # [B, K or 1, L, d]
        # The logits (and so the coupling) come from stop-gradient predictions, as in ComiRec's
        # code for both models: routing is a clustering step, gradients reach û only through
        # the last round's weighted sum.
        u_fixed = ops.stop_gradient(u)
        active = self.active_interests(mask)  # [B, K]
        allowed = ops.expand_dims(active, -1)  # [B, K, 1]
        real = ops.expand_dims(mask, 1)  # [B, 1, L]
        logits = self.initial_logits(ops.shape(items)[1])  # [K, L], broadcast over the batch
        for step in range(self.routing_iterations):
            c = ops.softmax(ops.where(allowed, logits, _NEG), axis=1)  # over interests, [B, K, L]
            c = ops.where(real, c, 0.0)
            last = step == self.routing_iterations - 1
            s = ops.squeeze(ops.matmul(ops.expand_dims(c, 2), u if last else u_fixed), 2)  # [B, K, d]
            v = squash(s)
            if not last:
                logits = logits + ops.squeeze(ops.matmul(u_fixed, ops.expand_dims(v, -1)), -1)  # [B, K, L]
        interests = v if self.output_layer is None else self.output_layer(v)
        # Inactive interests are exact zero vectors (search skips them); the ReLU layer's bias
        # would otherwise make them non-zero.
        return interests * ops.expand_dims(ops.cast(active, v.dtype), -1), c

    def call(self, inputs: dict[str, Any], training: bool = False) -> Any:
        return self.route(inputs)[0]

    def attention_maps(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """``{"routing": [B, K, L]}``: the final coupling of each behaviour to each interest."""
        return {"routing": self.route(inputs)[1]}


@register_tower("dr")
class DynamicRoutingTower(RoutingTower):
    """ComiRec-DR: per-interest bilinear maps ``W_k``, zero initial logits, all K interests."""

    SHARED_BILINEAR = False
    STORED_INITIAL_LOGITS = False
    RELU_READOUT = False
    DYNAMIC_INTERESTS = False


@register_tower("mind")
class MINDTower(RoutingTower):
    """MIND: one shared bilinear map ``S``, stored random initial logits, ReLU read-out, ``K'_u``."""

    SHARED_BILINEAR = True
    STORED_INITIAL_LOGITS = True
    RELU_READOUT = True
    DYNAMIC_INTERESTS = True
