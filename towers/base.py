"""The one interface every user tower implements."""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import keras
from keras import ops

from towers.item import ItemTower
from towers.saving import ConstructorConfig


class UserTower(ConstructorConfig, keras.layers.Layer, abc.ABC):
    """Behaviour sequence -> K interest vectors.

    Inputs are left-padded: ``inputs["items"]`` is int ``[batch, L]`` with 0 for padding
    and the most recent item in the last column. Padding never changes the output.

    Args:
        item_tower: the shared item-embedding tower; sequences are embedded with it.
        max_len: the longest history the tower reads (positional tables are this long).
        num_interests: K; single-interest towers fix it to 1.

    Call:
        inputs: ``{"items": int [B, L]}`` (``L <= max_len``) -> float32 ``[B, K, d]``.
    """

    nested = ("item_tower",)

    objectives: tuple[str, ...] = ("last",)
    """Training objectives the tower supports (``retrieval.training.examples.OBJECTIVES``), default first.
    Any other than ``last`` needs :meth:`sequence_output` (``[B, L]`` -> ``[B, L, d]``)."""

    def __init__(self, item_tower: ItemTower, max_len: int, num_interests: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if max_len < 1 or num_interests < 1:
            raise ValueError(f"max_len and num_interests must be >= 1, got {max_len}, {num_interests}")
        self.item_tower = item_tower
        self.max_len = max_len
        self.num_interests = num_interests
        self.dim = item_tower.dim

    @abc.abstractmethod
    def call(self, inputs: dict[str, Any], training: bool = False) -> Any:
        """``{"items": [B, L]}`` -> ``[B, K, d]``."""

    def attention_maps(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Named attention-like weights over the history, for inspection (not used in training).

        Returns:
            name -> float32 ``[B, rows, L]`` (rows = interests or heads, columns = the input's
            positions, padding included); ``{}`` for a tower without such weights.
        """
        return {}

    explanation: ClassVar[str] = "none"
    """What :meth:`interest_weights` are: ``"attention"`` (attention weights), ``"routing"``
    (capsule routing coefficients), or ``"none"`` (the tower has no per-interest weights)."""

    def interest_weights(self, inputs: dict[str, Any]) -> Any:
        """Per interest, the weight of each input position: what explains the interest.

        By default the tower's one attention map (one row per interest); towers whose maps have
        other rows (heads, blocks) override it.

        Returns:
            float32 ``[B, K, L]``, aligned with ``inputs["items"]``; 0 at padding.

        Raises:
            ValueError: the tower has no such weights (:attr:`explanation` is ``"none"``).
        """
        maps = self.attention_maps(inputs)
        if self.explanation == "none" or len(maps) != 1:
            raise ValueError(f"tower {type(self).__name__} has no per-interest weights over the history")
        return next(iter(maps.values()))

    def compute_output_shape(self, input_shape: Any) -> tuple[Any, ...]:
        return (input_shape["items"][0], self.num_interests, self.dim)


def sequence_mask(items: Any) -> Any:
    """``[B, L]`` ids -> bool ``[B, L]``, True where there is an item (id != 0)."""
    return ops.not_equal(items, 0)


@keras.saving.register_keras_serializable(package="towers")
class RecencyPositionEmbedding(ConstructorConfig, keras.layers.Layer):
    """Learned embedding of each event's distance from the most recent event.

    Sequences are left-padded, so position ``L - 1`` is always the newest event and
    indexing positions from the end makes the output independent of padding length.

    Call:
        x: ``[B, L, d]`` -> ``[B, L, d]`` (x plus the positional embedding).
    """

    def __init__(self, max_len: int, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_len = max_len
        self.dim = dim
        self.table = keras.layers.Embedding(
            max_len, dim, embeddings_initializer=keras.initializers.TruncatedNormal(stddev=0.02)
        )

    def build(self, input_shape: Any = None) -> None:
        self.table.build((None,))
        self.built = True

    def call(self, x: Any) -> Any:
        return x + ops.expand_dims(self.embeddings(ops.shape(x)[1]), 0)

    def embeddings(self, length: Any) -> Any:
        """The embeddings of positions ``0..length-1`` ``[length, d]`` (the last is the newest)."""
        recency = ops.flip(ops.arange(length), axis=0)  # [L]: L-1, ..., 1, 0
        return self.table(recency)
