"""BSARec: self-attention beside a frequency-domain inductive bias (Shin et al., AAAI 2024)."""

from __future__ import annotations

from typing import Any

import keras

from towers.frequency import BeyondFilter, FrequencyTower
from towers.registry import register_tower
from towers.transformer import SequenceBlock, TransformerBlock


@keras.saving.register_keras_serializable(package="towers")
class BSARecBlock(TransformerBlock):
    """A :class:`~towers.transformer.TransformerBlock` whose mixing is
    ``alpha · beyond(LN(x)) + (1 − alpha) · attention``, ``beyond`` the
    :class:`~towers.frequency.BeyondFilter` over ``length`` positions (padding zeroed first)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        length: int,
        alpha: float,
        cutoff: int,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(dim, num_heads, dropout, **kwargs)
        self.length, self.alpha, self.cutoff = length, alpha, cutoff
        self.beyond = BeyondFilter(length, dim, cutoff)

    def build(self, input_shape: Any) -> None:
        self.beyond.build()
        super().build(input_shape)

    def mix(self, h: Any, qk: Any, attention_mask: Any, keep: Any, training: bool) -> tuple[Any, Any]:
        attended, scores = super().mix(h, qk, attention_mask, keep, training)
        return self.alpha * self.beyond(h * keep) + (1.0 - self.alpha) * attended, scores


@register_tower("bsarec")
class BSARecTower(FrequencyTower):
    """BSARec with this package's pre-LN blocks and side-information fusion (NOVA included:
    it shapes the attention's queries and keys).

    Args:
        filter_alpha: BSARec's α, the filter's share of each block's mixing (1 − α is the
            attention's; 0 = SASRec's block). The authors' 0.7 on Beauty is the default.
        filter_cutoff: how many of the lowest rFFT frequencies (the mean included) the low-pass
            keeps; the authors' ``c`` keeps ``c // 2 + 1`` (their ``c = 5`` on Beauty: 3).
        **kwargs: :class:`~towers.transformer.TransformerTower`'s arguments, by name. Interest
        weights are the attention's only (the filter's share is not in them).
    """

    def __init__(self, *, filter_alpha: float = 0.7, filter_cutoff: int = 3, **kwargs: Any) -> None:
        if not 0.0 <= filter_alpha <= 1.0:
            raise ValueError(f"filter_alpha must be in [0, 1], got {filter_alpha}")
        self.filter_alpha, self.filter_cutoff = filter_alpha, filter_cutoff  # make_block reads them
        super().__init__(**kwargs)

    def make_block(self) -> SequenceBlock:
        return BSARecBlock(
            self.dim,
            self.num_heads,
            self.max_len,
            self.filter_alpha,
            self.filter_cutoff,
            self.dropout_rate,
        )
