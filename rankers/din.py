"""DIN, the Deep Interest Network (Zhou et al. 2018), as a ranker.

The candidate is the query of a local activation unit over the history: every candidate gets
its own user vector ``Σ_l w_l h_l`` with un-normalised weights (no softmax, so the vector's size
says how much of the history supports the candidate). The final MLP uses Dice or PReLU, and the
item table may carry DIN's mini-batch-aware L2 regularisation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keras import ops

from rankers.base import Ranker
from rankers.layers import ClickMLP, LocalActivationUnit, mini_batch_aware_l2
from rankers.registry import register_ranker
from towers.base import sequence_mask


@register_ranker("din")
class DIN(Ranker):
    """Target attention over the history, then an MLP on ``[u, e_c, u ⊙ e_c]``.

    Args:
        attention_units: hidden widths of the activation unit ((80, 40) as in DIN's code).
        hidden_units: hidden widths of the final MLP ((200, 80) as in the paper).
        activation: ``"dice"`` or ``"prelu"`` (or ``"relu"``) in the final MLP.
        dropout: in the final MLP.
        mba_l2: ``λ`` of the mini-batch-aware L2 on the item table (0 = off), added in training.
        **kwargs: :class:`~rankers.base.Ranker`'s arguments (``num_items``, ``dim``, ...).

    Call:
        inputs: see :class:`~rankers.base.Ranker` -> logits ``[B, C]``.
    """

    def __init__(
        self,
        *,
        attention_units: Sequence[int] = (80, 40),
        hidden_units: Sequence[int] = (200, 80),
        activation: str = "dice",
        dropout: float = 0.0,
        mba_l2: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.attention_units = [int(u) for u in attention_units]
        self.hidden_units = [int(u) for u in hidden_units]
        self.mba_l2 = mba_l2
        self.unit = LocalActivationUnit(self.dim, self.attention_units)
        self.mlp = ClickMLP(self.hidden_units, activation, dropout)

    def build_layers(self) -> None:
        self.unit.build()
        self.mlp.build((None, 3 * self.dim))

    def attention(self, inputs: dict[str, Any]) -> Any:
        """Activation weights ``[B, C, L]`` of each history item per candidate (0 on padding)."""
        inputs = self.truncate(inputs)
        return self.unit(self.candidate_vectors(inputs), self.history_vectors(inputs), inputs["history"] != 0)

    def user_vectors(self, inputs: dict[str, Any]) -> Any:
        """``Σ_l w_cl h_l`` per candidate ``[B, C, d]`` (zeros for an all-padding history)."""
        inputs = self.truncate(inputs)
        return ops.matmul(self.attention(inputs), self.history_vectors(inputs))

    def mba_penalty(self, inputs: dict[str, Any]) -> Any:
        """``λ Σ_j ‖w_j‖² / n_j`` over the distinct item ids of the batch (history and candidates)."""
        inputs = self.truncate(inputs)
        ids = ops.concatenate(
            [ops.reshape(inputs["history"], (-1,)), ops.reshape(inputs["candidates"], (-1,))], axis=0
        )
        return self.mba_l2 * mini_batch_aware_l2(self.item_tower.table, ids)

    def score(self, inputs: dict[str, Any], training: bool = False) -> Any:
        h = self.history_vectors(inputs)  # [B, L, d]
        e = self.candidate_vectors(inputs)  # [B, C, d]
        w = self.unit(e, h, sequence_mask(inputs["history"]))  # [B, C, L]
        u = ops.matmul(w, h)  # [B, C, d]
        x = ops.concatenate([u, e, u * e], axis=-1)  # [B, C, 3d]
        batch, num = ops.shape(e)[0], ops.shape(e)[1]
        valid = ops.reshape(sequence_mask(inputs["candidates"]), (-1,))  # [B·C]
        logits = self.mlp(ops.reshape(x, (-1, 3 * self.dim)), valid=valid, training=training)
        if training and self.mba_l2 > 0:
            self.add_loss(self.mba_penalty(inputs))
        return ops.reshape(logits, (batch, num))
