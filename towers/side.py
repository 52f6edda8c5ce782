"""Side information per history event, and how it is fused into the sequence towers.

Side features are categorical per event: ``action`` (e.g. the rating or the behaviour type),
``gap_prev`` (bucketised time since the previous event), ``gap_now`` (bucketised time from the
event to the request), and the item's ``attributes`` (read
from the item tower). Each is embedded in ``d`` dimensions and the embeddings are summed.

Fusion modes (``FUSIONS``):
    ``none``: no side information.
    ``sum``, ``concat``, ``gated``: invasive, the side embedding is merged into the item
        representation that then flows through every layer.
    ``nova``: non-invasive (NOVA-BERT, Liu et al. 2021): the side embedding shapes each
        attention layer's queries and keys only; values, and so the layer outputs, stay
        combinations of pure item representations, and the side embedding reaches every
        layer unchanged instead of being propagated.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from towers.saving import ConstructorConfig

FUSIONS = ("none", "sum", "concat", "gated", "nova")
INVASIVE = ("sum", "concat", "gated")
EVENT_FEATURES = ("action", "gap_prev", "gap_now")
"""Per-event side inputs a request or a training example may carry (``inputs[name]``: int ``[B, L]``)."""


@keras.saving.register_keras_serializable(package="towers")
class SideEmbedding(ConstructorConfig, keras.layers.Layer):
    """Sum of the embeddings of each event's side features ``[B, L, d]``.

    Args:
        dim: ``d``.
        vocab_sizes: per-event feature name (from ``EVENT_FEATURES``) -> number of values
            (ids ``1..n``; 0 = padding or unknown, embedded as zeros).
    """

    def __init__(self, dim: int, vocab_sizes: dict[str, int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        unknown = set(vocab_sizes) - set(EVENT_FEATURES)
        if unknown:
            raise ValueError(f"unknown side features {sorted(unknown)}; known: {list(EVENT_FEATURES)}")
        self.dim, self.vocab_sizes = dim, dict(sorted(vocab_sizes.items()))
        init = keras.initializers.TruncatedNormal(stddev=0.02)
        self.tables = {
            name: keras.layers.Embedding(n + 1, dim, embeddings_initializer=init, name=f"{name}_embedding")
            for name, n in self.vocab_sizes.items()
        }

    def build(self, input_shape: Any = None) -> None:
        for table in self.tables.values():
            table.build((None,))
        self.built = True

    def call(self, inputs: dict[str, Any]) -> Any:
        items = inputs["items"]
        total = ops.zeros((ops.shape(items)[0], ops.shape(items)[1], self.dim), "float32")
        for name, table in self.tables.items():
            present = ops.expand_dims(ops.cast(inputs[name] > 0, "float32"), -1)
            total = total + table(inputs[name]) * present
        return total


@keras.saving.register_keras_serializable(package="towers")
class InvasiveFusion(ConstructorConfig, keras.layers.Layer):
    """Merges side embeddings into item representations: ``sum``, ``concat`` (then a linear map
    back to ``d``) or ``gated`` (``g ⊙ h + (1 - g) ⊙ s`` with ``g = σ(W [h, s])``).

    Call:
        h, side: ``[B, L, d]`` each -> ``[B, L, d]``.
    """

    def __init__(self, mode: str, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if mode not in INVASIVE:
            raise ValueError(f"invasive fusion is one of {INVASIVE}, got {mode!r}")
        self.mode, self.dim = mode, dim
        self.dense = None if mode == "sum" else keras.layers.Dense(dim)

    def build(self, input_shape: Any = None) -> None:
        if self.dense is not None:
            self.dense.build((None, None, 2 * self.dim))
        self.built = True

    def call(self, h: Any, side: Any) -> Any:
        if self.dense is None:
            return h + side
        joined = self.dense(ops.concatenate([h, side], axis=-1))
        if self.mode == "concat":
            return joined
        gate = ops.sigmoid(joined)
        return gate * h + (1.0 - gate) * side


@keras.saving.register_keras_serializable(package="towers")
class SideInformation(ConstructorConfig, keras.layers.Layer):
    """What a sequence tower does with side information, whatever its architecture.

    Args:
        fusion: one of :data:`FUSIONS`.
        dim: ``d``.
        side_features: per-event feature -> vocabulary size (:data:`EVENT_FEATURES`).
        item_attributes: whether the item tower has attributes (they join the side embedding).

    Raises:
        ValueError: side information without a fusion mode, or a fusion mode without any.
    """

    def __init__(
        self, fusion: str, dim: int, side_features: dict[str, int], item_attributes: bool, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if fusion not in FUSIONS:
            raise ValueError(f"unknown fusion {fusion!r}; choose one of {FUSIONS}")
        if (bool(side_features) or item_attributes) != (fusion != "none"):
            raise ValueError(
                "side information needs a fusion mode other than 'none', and a fusion mode needs side "
                f"information (fusion {fusion!r}, side features {sorted(side_features)}, "
                f"item attributes {item_attributes})"
            )
        self.fusion, self.dim = fusion, dim
        self.side_features, self.item_attributes = dict(side_features), item_attributes
        self.embedding = SideEmbedding(dim, side_features) if fusion != "none" else None
        self.merge = InvasiveFusion(fusion, dim) if fusion in INVASIVE else None

    def build(self, input_shape: Any = None) -> None:
        if self.embedding is not None:
            self.embedding.build()
        if self.merge is not None:
            self.merge.build()
        self.built = True

    @property
    def invasive(self) -> bool:
        return self.merge is not None

    def fuse(self, h: Any, side: Any) -> Any:
        """Invasive fusion of item representations and side embeddings ``[B, L, d]``."""
        if self.merge is None:
            raise ValueError(f"fusion {self.fusion!r} does not merge side information into the items")
        return self.merge(h, side)

    def items(self, items: Any, item_tower: Any) -> Any:
        """Item representations ``[B, L, d]``: the item tower's full vectors (id and attributes,
        what the index holds), except under invasive fusion, where they are id embeddings alone
        (the attributes arrive through :meth:`side`). Under ``nova`` the values are so the same
        vectors the targets are scored against, whatever side information chose their weights."""
        return item_tower.id_embedding(items) if self.invasive else item_tower(items)

    def side(self, inputs: dict[str, Any], item_tower: Any) -> Any:
        """The side embedding of every event ``[B, L, d]``: event features plus item attributes."""
        assert self.embedding is not None, "no side information with fusion 'none'"
        items = inputs["items"]
        known = ops.where(items < item_tower.num_embeddings, items, 0)  # e.g. BERT4Rec's mask token
        return self.embedding(inputs) + item_tower.attributes(known)
