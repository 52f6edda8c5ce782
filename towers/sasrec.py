"""SASRec: causal self-attention over the history; the newest position's output is the user (K = 1)."""

from __future__ import annotations

from typing import Any

from towers.registry import register_tower
from towers.transformer import TransformerTower


@register_tower("sasrec")
class SASRecTower(TransformerTower):
    """Kang & McAuley 2018, with pre-LN blocks and optional side-information fusion.

    Position t attends only to positions <= t, so training predicts every next item at once
    (objective ``all_positions``) and serving reads the newest position.
    """

    causal = True
    objectives = ("all_positions", "last")

    def call(self, inputs: dict[str, Any], training: bool = False) -> Any:
        return self.sequence_output(inputs, training=training)[:, -1:, :]  # [B, 1, d]
