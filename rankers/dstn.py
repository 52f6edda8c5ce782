"""DSTN, Deep Spatio-Temporal Neural Networks (Ouyang et al. 2019), as a ranker.

The target candidate is scored with three sets of auxiliary items: the *context* (the other
items of the same request: the spatial domain), the user's *clicked* items (the history)
and *unclicked* items (shown but skipped: the temporal domain). The interactive-attention
variant weighs each auxiliary item by its interaction with the target,
``α_i = exp(hᵀ ReLU(W [e_t, e_i] + b) + b')``, un-normalised so that a set's aggregate
``Σ_i α_i e_i`` also says how much relevant evidence it holds (zero for an empty set); the target
and the three aggregates are concatenated and scored by an MLP.

**A fixed-size context.** Because the sum is un-normalised, the context aggregate grows with the
number of context items: a ranker trained on lists of 21 candidates and evaluated on lists of 200
(the request's *other candidates*, as in the paper) sees sums about ten times larger at test time
than any it was trained on. So by default (``context_size`` N > 0) a candidate's context is the
first N items of the ``"context"`` input other than the candidate itself: the request's top
retrieved items in the retriever's order, the same function of the request in training,
evaluation and serving (:mod:`retrieval.ranking`, :class:`retrieval.artifacts.ranker_scorer.RankerScorer`),
so every candidate sees N context items wherever it is scored (fewer only when fewer were
retrieved). ``context_size=0`` keeps the paper's "every other candidate".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
from keras import ops

from rankers.base import Ranker
from rankers.layers import ClickMLP
from rankers.registry import register_ranker
from towers.base import sequence_mask
from towers.saving import ConstructorConfig

MAX_EXPONENT = 20.0
"""``α = exp(min(s, 20))``: a guard against overflow early in training (e^20 ≈ 4.9e8); scores
this large never occur in a trained model, so the weights are the paper's."""

AUXILIARY_SETS = ("context", "clicked", "unclicked")


@keras.saving.register_keras_serializable(package="rankers")
class InteractiveAttention(ConstructorConfig, keras.layers.Layer):
    """DSTN's interactive attention of targets over one auxiliary set.

    Args:
        dim: ``d`` of targets and auxiliary items.
        units: hidden size of ``W``.

    Call:
        target ``[B, C, d]``, aux ``[B, N, d]``, valid bool ``[B, C, N]`` (which auxiliary items each
        target may see) -> aggregate ``Σ_i α_i e_i`` ``[B, C, d]``.
    """

    def __init__(self, dim: int, units: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dim, self.units = dim, units

    def build(self, input_shape: Any = None) -> None:
        self.kernel = self.add_weight(
            shape=(2 * self.dim, self.units), initializer="glorot_uniform", name="w"
        )
        self.bias = self.add_weight(shape=(self.units,), initializer="zeros", name="b")
        self.h = self.add_weight(shape=(self.units,), initializer="glorot_uniform", name="h")
        self.out_bias = self.add_weight(shape=(), initializer="zeros", name="b_out")
        self.built = True

    def alpha(self, target: Any, aux: Any, valid: Any) -> Any:
        """Un-normalised weights ``[B, C, N]`` (0 where not ``valid``)."""
        # W [e_t, e_i] = W_t e_t + W_a e_i: project targets and auxiliary items once, then pair them.
        x = (
            ops.expand_dims(ops.matmul(target, self.kernel[: self.dim]), 2)  # [B, C, 1, u]
            + ops.expand_dims(ops.matmul(aux, self.kernel[self.dim :]), 1)  # [B, 1, N, u]
            + self.bias
        )
        scores = ops.matmul(ops.relu(x), self.h) + self.out_bias  # [B, C, N]
        return ops.where(ops.cast(valid, "bool"), ops.exp(ops.minimum(scores, MAX_EXPONENT)), 0.0)

    def call(self, target: Any, aux: Any, valid: Any) -> Any:
        return ops.matmul(self.alpha(target, aux, valid), aux)  # [B, C, d]


@register_ranker("dstn")
class DSTN(Ranker):
    """Interactive attention over context, clicked and unclicked items, then an MLP.

    Args:
        attention_units: hidden size of each interactive attention (one per auxiliary set).
        hidden_units: hidden widths of the final MLP.
        activation: ``"relu"`` (the paper), ``"dice"`` or ``"prelu"``.
        dropout: in the final MLP.
        context_size: N, context items per candidate (0 = every other candidate of the request).
        **kwargs: :class:`~rankers.base.Ranker`'s arguments (``num_items``, ``dim``, ...).

    Call:
        inputs: see :class:`~rankers.base.Ranker`; ``"unclicked"`` int ``[B, U]`` is optional (absent
        = no unclicked items) and is embedded without attributes; ``"context"`` int ``[B, M]``
        (required when ``context_size`` > 0; 0 = padding) holds the request's retrieved items in
        the retriever's order, with ``"context_attributes"`` ``[B, M, A]`` optional; only its first
        ``N + 1`` columns are read -> logits ``[B, C]``.
    """

    def __init__(
        self,
        *,
        attention_units: int = 32,
        hidden_units: Sequence[int] = (128, 64),
        activation: str = "relu",
        dropout: float = 0.0,
        context_size: int = 20,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if context_size < 0:
            raise ValueError(f"context_size must be >= 0, got {context_size}")
        self.context_size = int(context_size)
        self.hidden_units = [int(u) for u in hidden_units]
        self.attentions = {
            name: InteractiveAttention(self.dim, attention_units, name=f"{name}_attention")
            for name in AUXILIARY_SETS
        }
        self.mlp = ClickMLP(self.hidden_units, activation, dropout)

    def build_layers(self) -> None:
        for layer in self.attentions.values():
            layer.build()
        self.mlp.build((None, 4 * self.dim))

    def context_set(self, inputs: dict[str, Any], target: Any) -> tuple[Any, Any]:
        """The context items ``[B, M, d]`` and which of them each target sees ``[B, C, M]``.

        With ``context_size`` N: the first N non-padding items of ``"context"`` (``M = N + 1``
        columns read) that are not the target itself, so N of them whether or not the target is
        among them. With N = 0: every other real candidate (never itself, never padding).

        Raises:
            ValueError: ``context_size`` > 0 and no ``"context"`` input.
        """
        candidates = inputs["candidates"]
        if not self.context_size:
            num = ops.shape(candidates)[1]
            others = ops.not_equal(ops.expand_dims(ops.arange(num), 1), ops.expand_dims(ops.arange(num), 0))
            return target, ops.expand_dims(sequence_mask(candidates), 1) & ops.expand_dims(others, 0)
        if "context" not in inputs:
            raise ValueError(
                f"DSTN with context_size={self.context_size} needs the 'context' input [B, N]: the "
                "request's retrieved items in the retriever's order"
            )
        width = self.context_size + 1
        context = inputs["context"][:, :width]  # [B, M]
        attributes = inputs.get("context_attributes")
        items = self.item_vectors(context, None if attributes is None else attributes[:, :width])
        seen = ops.expand_dims(sequence_mask(context), 1) & ops.not_equal(
            ops.expand_dims(context, 1), ops.expand_dims(ops.cast(candidates, context.dtype), 2)
        )  # [B, C, M]: a real item other than the target
        kept = ops.cumsum(ops.cast(seen, "int32"), axis=-1) <= self.context_size  # the first N of them
        return items, seen & kept

    def auxiliary_sets(self, inputs: dict[str, Any], target: Any) -> dict[str, tuple[Any, Any]]:
        """Set name -> (items ``[B, N, d]``, which of them each target sees ``[B, C, N]``)."""
        history = inputs["history"]
        sets = {
            "context": self.context_set(inputs, target),
            "clicked": (self.history_vectors(inputs), ops.expand_dims(sequence_mask(history), 1)),
        }
        if "unclicked" in inputs:
            unclicked = inputs["unclicked"]
            sets["unclicked"] = (self.item_vectors(unclicked), ops.expand_dims(sequence_mask(unclicked), 1))
        return sets

    def attention(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Set name -> un-normalised weights ``α`` ``[B, C, N]`` of each auxiliary item per candidate."""
        inputs = self.truncate(inputs)
        target = self.candidate_vectors(inputs)
        return {
            name: self.attentions[name].alpha(target, aux, valid)
            for name, (aux, valid) in self.auxiliary_sets(inputs, target).items()
        }

    def score(self, inputs: dict[str, Any], training: bool = False) -> Any:
        target = self.candidate_vectors(inputs)  # [B, C, d]
        sets = self.auxiliary_sets(inputs, target)
        parts = [target]
        for name in AUXILIARY_SETS:  # an absent set aggregates to zeros
            parts.append(
                self.attentions[name](target, *sets[name]) if name in sets else ops.zeros_like(target)
            )
        x = ops.concatenate(parts, axis=-1)  # [B, C, 4d]
        batch, num = ops.shape(target)[0], ops.shape(target)[1]
        valid = ops.reshape(sequence_mask(inputs["candidates"]), (-1,))
        logits = self.mlp(ops.reshape(x, (-1, 4 * self.dim)), valid=valid, training=training)
        return ops.reshape(logits, (batch, num))
