"""DIEN, the Deep Interest Evolution Network (Zhou et al. 2019), as a ranker.

An interest extractor (a GRU over the history) turns clicks into interest states ``h_t``; an
auxiliary loss makes each ``h_t`` predict the next click against a random item. An interest
evolving layer (AUGRU) then re-reads the states per candidate, its update gate scaled by the
attention between ``h_t`` and the candidate, so that interests unrelated to the candidate barely
move the final state, which an MLP scores with the candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
from keras import ops

from rankers.base import Ranker
from rankers.layers import AUGRUCell, ClickMLP, masked_softmax
from rankers.registry import register_ranker
from towers.base import sequence_mask


@register_ranker("dien")
class DIEN(Ranker):
    """GRU interest extractor + auxiliary loss, attention, AUGRU interest evolution, MLP.

    The history is tiled per candidate (``[B·C, L, d]``) for the AUGRU: fine for a pre-ranking
    list of a few hundred candidates at small ``d``.

    Args:
        hidden_units: hidden widths of the final MLP.
        activation: ``"dice"``, ``"prelu"`` or ``"relu"`` in the final MLP.
        dropout: in the final MLP.
        aux_weight: weight of the auxiliary loss (0 = off), added in training.
        seed: of the negative sampler of the auxiliary loss.
        **kwargs: :class:`~rankers.base.Ranker`'s arguments (``num_items``, ``dim``, ...).

    Call:
        inputs: see :class:`~rankers.base.Ranker` -> logits ``[B, C]``.
    """

    def __init__(
        self,
        *,
        hidden_units: Sequence[int] = (200, 80),
        activation: str = "dice",
        dropout: float = 0.0,
        aux_weight: float = 1.0,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.hidden_units = [int(u) for u in hidden_units]
        self.aux_weight = aux_weight
        self.extractor = keras.layers.GRU(self.dim, return_sequences=True, name="interest_extractor")
        self.cell = AUGRUCell(self.dim, self.dim)
        self.evolution = keras.layers.RNN(self.cell, name="interest_evolution")
        self.mlp = ClickMLP(self.hidden_units, activation, dropout)
        self.sampler = keras.random.SeedGenerator(seed)

    def build_layers(self) -> None:
        self.extractor.build((None, None, self.dim))
        self.cell.build()
        self.evolution.build((None, None, self.dim + 1))
        # a_t ∝ exp(h_t W e_c): the paper's bilinear attention.
        self.attention_kernel = self.add_weight(
            shape=(self.dim, self.dim), initializer="glorot_uniform", name="attention_kernel"
        )
        self.mlp.build((None, 3 * self.dim))

    def interest_states(self, inputs: dict[str, Any]) -> Any:
        """The extractor's states ``h_t`` ``[B, L, d]`` (zeros on padding)."""
        valid = sequence_mask(inputs["history"])
        states = self.extractor(self.history_vectors(inputs), mask=valid)
        return ops.where(ops.expand_dims(valid, -1), states, 0.0)

    def attention(self, states: Any, candidates: Any, history: Any) -> Any:
        """``a_ct = softmax_t(h_t W e_c)`` over valid steps: ``[B, L, d]``, ``[B, C, d]`` -> ``[B, C, L]``."""
        query = ops.matmul(candidates, ops.transpose(self.attention_kernel))  # [B, C, d]: W e_c
        scores = ops.matmul(query, ops.transpose(states, (0, 2, 1)))  # [B, C, L]
        return masked_softmax(scores, ops.expand_dims(sequence_mask(history), 1))

    def evolve(self, states: Any, attention: Any, history: Any) -> Any:
        """AUGRU over the states per candidate: ``[B, L, d]``, ``[B, C, L]`` -> final states ``[B, C, d]``."""
        batch, num, length = ops.shape(attention)[0], ops.shape(attention)[1], ops.shape(attention)[2]
        tiled = ops.broadcast_to(ops.expand_dims(states, 1), (batch, num, length, self.dim))
        steps = ops.concatenate([tiled, ops.expand_dims(attention, -1)], axis=-1)  # [B, C, L, d+1]
        valid = ops.broadcast_to(ops.expand_dims(sequence_mask(history), 1), (batch, num, length))
        final = self.evolution(
            ops.reshape(steps, (-1, length, self.dim + 1)), mask=ops.reshape(valid, (-1, length))
        )  # [B·C, d]; padding steps carry the (zero) state
        return ops.reshape(final, (batch, num, self.dim))

    def auxiliary_loss(self, states: Any, history: Any, negatives: Any) -> Any:
        """``h_t`` should score the next click ``e_{t+1}`` above a negative item ``ê_{t+1}``.

        ``mean_t [−log σ(h_t·e_{t+1}) − log(1 − σ(h_t·ê_{t+1}))]`` over the steps whose next step is
        a real click (a mean, as in DIEN's code, so ``aux_weight`` does not depend on ``L``).
        Item id embeddings are used for both, so attributes cannot tell the negatives apart.

        Args:
            states: ``[B, L, d]``; history: int ``[B, L]``; negatives: int ``[B, L - 1]``.
        """
        valid = ops.cast(sequence_mask(history[:, :-1]) & sequence_mask(history[:, 1:]), "float32")
        h = states[:, :-1]  # [B, L-1, d]
        positive = ops.sum(h * self.item_tower.id_embedding(history[:, 1:]), axis=-1)  # [B, L-1]
        negative = ops.sum(h * self.item_tower.id_embedding(negatives), axis=-1)
        loss = ops.softplus(-positive) + ops.softplus(negative)  # −log σ(x) = softplus(−x)
        return ops.sum(loss * valid) / ops.maximum(ops.sum(valid), 1.0)

    def sample_negatives(self, history: Any) -> Any:
        """Uniform item ids ``[B, L - 1]`` in ``1..num_items``, never the next click itself."""
        shape = (ops.shape(history)[0], ops.shape(history)[1] - 1)
        negatives = keras.random.randint(shape, 1, self.num_items + 1, dtype="int32", seed=self.sampler)
        positives = ops.cast(history[:, 1:], "int32")
        return ops.where(negatives == positives, negatives % self.num_items + 1, negatives)

    def score(self, inputs: dict[str, Any], training: bool = False) -> Any:
        history = inputs["history"]
        states = self.interest_states(inputs)  # [B, L, d]
        e = self.candidate_vectors(inputs)  # [B, C, d]
        final = self.evolve(states, self.attention(states, e, history), history)  # [B, C, d]
        x = ops.concatenate([final, e, final * e], axis=-1)  # [B, C, 3d]
        batch, num = ops.shape(e)[0], ops.shape(e)[1]
        valid = ops.reshape(sequence_mask(inputs["candidates"]), (-1,))
        logits = self.mlp(ops.reshape(x, (-1, 3 * self.dim)), valid=valid, training=training)
        if training and self.aux_weight > 0:
            negatives = self.sample_negatives(history)
            self.add_loss(self.aux_weight * self.auxiliary_loss(states, history, negatives))
        return ops.reshape(logits, (batch, num))
