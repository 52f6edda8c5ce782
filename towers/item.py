"""Item tower: dense item ids -> item vectors in the user towers' space."""

from __future__ import annotations

from typing import Any

import keras


@keras.saving.register_keras_serializable(package="towers")
class ItemTower(keras.layers.Layer):
    """An item-embedding table; row 0 is padding.

    User towers embed their input sequences with the same table, so that history
    items and retrieved items live in one space.

    Args:
        num_embeddings: number of items + 1 (the padding row).
        dim: embedding size ``d``.

    Call:
        ids: int ``[...]`` -> float32 ``[..., d]``.
    """

    def __init__(self, num_embeddings: int, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_embeddings = num_embeddings
        self.dim = dim
        # Small init as in SASRec/ComiRec; large initial norms slow early training.
        self.embedding = keras.layers.Embedding(
            num_embeddings, dim, embeddings_initializer=keras.initializers.TruncatedNormal(stddev=0.02)
        )

    def build(self, input_shape: Any = None) -> None:
        self.embedding.build((None,))
        self.built = True

    def call(self, ids: Any) -> Any:
        return self.embedding(ids)

    @property
    def table(self) -> Any:
        """The full table ``[num_embeddings, d]``, row 0 = padding."""
        return self.embedding.embeddings

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_embeddings": self.num_embeddings, "dim": self.dim}
