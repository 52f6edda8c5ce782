"""Item tower: dense item ids -> item vectors in the user towers' space."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import keras
import numpy as np
from keras import ops

from towers.saving import ConstructorConfig


@keras.saving.register_keras_serializable(package="towers")
class ItemTower(ConstructorConfig, keras.layers.Layer):
    """An item-id embedding table (row 0 is padding), optionally plus the item's attributes.

    User towers embed their input sequences with the same table, so that history items and
    retrieved items live in one space. With attributes (categories, brand, genres), an item's
    vector is its id embedding plus the mean of its attributes' embeddings, so that items with
    few interactions borrow strength from their attributes. With ``id_dropout``, training drops
    the id embedding of that share of the candidate vectors the loss scores (:meth:`candidates`;
    never of the history a user tower reads), leaving the attribute part alone, which is then a
    usable vector by itself: that of an item never seen in training (:meth:`attributes`, cold
    start).

    Within :meth:`reading`, the vectors come from a table given with the call instead of the
    embedding variable: that is how an exported user tower reads the model folder's item
    table, shared by every process that maps it, rather than a copy of its own.

    Args:
        num_embeddings: number of items + 1 (the padding row).
        dim: embedding size ``d``.
        num_attributes: size of the attribute vocabulary (ids ``1..num_attributes``; 0 = none).
        max_attributes: attributes kept per item (columns of the item -> attributes table).
        id_dropout: in training, the probability that a candidate vector is its attributes'
            part alone (needs attributes; 0 = off). Its random stream follows
            ``keras.utils.set_random_seed``.

    Call:
        ids: int ``[...]`` -> float32 ``[..., d]``.
    """

    def __init__(
        self,
        num_embeddings: int,
        dim: int,
        num_attributes: int = 0,
        max_attributes: int = 0,
        id_dropout: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (num_attributes > 0) != (max_attributes > 0):
            raise ValueError("num_attributes and max_attributes must both be 0 or both be positive")
        if not 0.0 <= id_dropout < 1.0 or (id_dropout and not num_attributes):
            raise ValueError(f"id_dropout must be in [0, 1) and needs attributes, got {id_dropout}")
        self.num_embeddings, self.dim = num_embeddings, dim
        self.num_attributes, self.max_attributes = num_attributes, max_attributes
        self.id_dropout = id_dropout
        self.seed_generator = keras.random.SeedGenerator() if id_dropout else None
        self._rows: Any = None  # the table being read (:meth:`reading`), else None
        init = keras.initializers.TruncatedNormal(stddev=0.02)  # small, as in SASRec/ComiRec
        self.embedding = keras.layers.Embedding(num_embeddings, dim, embeddings_initializer=init)
        self.attribute_embedding = (
            keras.layers.Embedding(num_attributes + 1, dim, embeddings_initializer=init)
            if num_attributes
            else None
        )

    def build(self, input_shape: Any = None) -> None:
        if getattr(self, "built", False):  # shared by the user tower, which builds it too
            return
        self.embedding.build((None,))
        if self.attribute_embedding is not None:
            self.attribute_embedding.build((None,))
            # The item -> attributes table is data, not a parameter: saved with the weights so
            # that a loaded tower needs nothing else, never trained.
            self.item_attributes = self.add_weight(
                shape=(self.num_embeddings, self.max_attributes),
                dtype="int32",
                initializer="zeros",
                trainable=False,
                name="item_attributes",
            )
        self.built = True

    def set_item_attributes(self, table: np.ndarray) -> None:
        """Sets the item -> attribute-ids table, int ``[num_embeddings, max_attributes]`` (0 = none)."""
        if table.shape != (self.num_embeddings, self.max_attributes):
            raise ValueError(
                f"attribute table has shape {table.shape}, expected {self.item_attributes.shape}"
            )
        self.item_attributes.assign(table.astype(np.int32))

    @contextmanager
    def reading(self, table: Any) -> Iterator[None]:
        """Within the block, the tower's vectors are rows of ``table`` float32
        ``[num_embeddings, d]``, the vectors :meth:`all_items` gave (what a model folder's
        ``item_embeddings.npy`` holds), and the id-embedding variable is not read."""
        self._rows = table
        try:
            yield
        finally:
            self._rows = None

    def id_embedding(self, ids: Any) -> Any:
        """The items' id embeddings alone ``[..., d]``."""
        if self._rows is not None:
            return ops.take(self._rows, ids, axis=0) - self.attributes(ids)
        return self.embedding(ids)

    def attributes(self, ids: Any) -> Any:
        """Mean embedding of each item's attributes ``[..., d]`` (zeros without attributes)."""
        if self.attribute_embedding is None:
            return ops.repeat(ops.expand_dims(ops.zeros_like(ids, dtype="float32"), -1), self.dim, axis=-1)
        attribute_ids = ops.take(self.item_attributes, ids, axis=0)  # [..., A]
        present = ops.expand_dims(ops.cast(attribute_ids > 0, "float32"), -1)  # [..., A, 1]
        total = ops.sum(self.attribute_embedding(attribute_ids) * present, axis=-2)
        return total / ops.maximum(ops.sum(present, axis=-2), 1.0)

    def call(self, ids: Any) -> Any:
        if self._rows is not None:
            return ops.take(self._rows, ids, axis=0)
        if self.attribute_embedding is None:
            return self.embedding(ids)
        return self.embedding(ids) + self.attributes(ids)

    def candidates(self, ids: Any, training: bool = False) -> Any:
        """The vectors the training loss scores ``[..., d]``: those of :meth:`call`, except that
        in training ``id_dropout`` of them are their attribute part alone."""
        if not training or self.seed_generator is None:
            return self(ids)
        keep = keras.random.uniform(ops.shape(ids), seed=self.seed_generator) >= self.id_dropout
        id_part = self.embedding(ids) * ops.expand_dims(ops.cast(keep, "float32"), -1)
        return id_part + self.attributes(ids)

    @property
    def table(self) -> Any:
        """The id-embedding table ``[num_embeddings, d]``, row 0 = padding."""
        return self.embedding.embeddings

    @property
    def attribute_table(self) -> Any:
        """The attribute-embedding table ``[num_attributes + 1, d]``, row 0 = none; ``None``
        without attributes. An item's attribute part is the mean of its attributes' rows."""
        return None if self.attribute_embedding is None else self.attribute_embedding.embeddings

    def all_items(self) -> Any:
        """Vectors of every row ``[num_embeddings, d]`` (row 0 = padding), what the index holds."""
        return self(ops.arange(self.num_embeddings))
