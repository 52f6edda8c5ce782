"""FMLP-Rec: self-attention replaced by a learnable filter (Zhou et al., WWW 2022)."""

from __future__ import annotations

from typing import Any

import keras

from towers.frequency import FrequencyTower, LearnableFilter
from towers.registry import register_tower
from towers.transformer import SequenceBlock


@keras.saving.register_keras_serializable(package="towers")
class FilterBlock(SequenceBlock):
    """A :class:`~towers.transformer.SequenceBlock` mixing positions by a learned spectrum over
    ``length`` positions (:class:`~towers.frequency.LearnableFilter`), padding zeroed first."""

    def __init__(self, dim: int, length: int, dropout: float = 0.0, **kwargs: Any) -> None:
        super().__init__(dim, dropout, **kwargs)
        self.length = length
        self.filter = LearnableFilter(length, dim)

    def build(self, input_shape: Any) -> None:
        self.filter.build()
        super().build(input_shape)

    def mix(self, h: Any, qk: Any, attention_mask: Any, keep: Any, training: bool) -> tuple[Any, Any]:
        return self.filter(h * keep), None


@register_tower("fmlprec")
class FMLPRecTower(FrequencyTower):
    """FMLP-Rec with this package's pre-LN blocks: each block is ``x + filter(LN(x))`` then the
    feed-forward block. Side information only by invasive fusion (``sum``, ``concat``, ``gated``):
    NOVA shapes attention, which this tower has none of. Nothing to explain (no attention)."""

    explanation = "none"
    fusions = ("none", "sum", "concat", "gated")
    """The side-information fusions it takes (``retrieval.training.model.tower_fusions``)."""

    def make_block(self) -> SequenceBlock:
        if self.fusion not in self.fusions:  # the tower's constructor calls this: refused when built
            raise ValueError("fmlprec has no attention for NOVA's side information: use sum, concat or gated")
        return FilterBlock(self.dim, self.max_len, self.dropout_rate)
