"""The two-tower Keras model: a user tower (which holds the shared item tower) and a task."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from retrieval.artifacts.arrays import scored_rows
from retrieval.artifacts.model import TOWER_TABLE
from retrieval.data.features import SideVocab
from retrieval.training.config import FUSIONS, SIMILARITIES, ModelConfig, Similarity
from retrieval.training.losses.task import RetrievalTask
from towers import ItemTower, UserTower, build_user_tower
from towers.registry import tower_class
from towers.saving import ConstructorConfig, constructor_parameters


@keras.saving.register_keras_serializable(package="retrieval")
class TwoTowerModel(ConstructorConfig, keras.Model):
    """User tower + item tower trained by a :class:`~retrieval.training.losses.task.RetrievalTask`.

    ``call({"items": [B, L]})`` returns the interests ``[B, K, d]``; ``fit`` takes
    ``(inputs, target_ids [B])``. The task is attached for training and is not saved. With
    ``similarity="cosine"`` the interests and the item vectors the task scores are unit length
    (:func:`scoring_table` gives the items' for the index).
    """

    nested = ("user_tower",)

    def __init__(self, user_tower: UserTower, similarity: Similarity = "dot", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if similarity not in SIMILARITIES:
            raise ValueError(f"similarity must be one of {SIMILARITIES}, got {similarity!r}")
        self.user_tower = user_tower
        self.similarity = similarity
        self.task: RetrievalTask | None = None
        self.objective = user_tower.objectives[0]

    @property
    def item_tower(self) -> ItemTower:
        return self.user_tower.item_tower

    def set_objective(self, objective: str | None) -> None:
        """Chooses the training objective (None = the tower's default)."""
        objective = objective or self.user_tower.objectives[0]
        if objective not in self.user_tower.objectives:
            raise ValueError(
                f"tower {type(self.user_tower).__name__} trains with {self.user_tower.objectives}, "
                f"not {objective!r}"
            )
        self.objective = objective

    def call(self, inputs: dict[str, Any], training: bool = False) -> Any:
        if training and self.objective != "last":
            return self._scored(self.user_tower.sequence_output(inputs, training=True))  # [B, L, d]
        return self._scored(self.user_tower(inputs, training=training))  # [B, K, d]

    def _scored(self, vectors: Any) -> Any:
        """``vectors [..., d]`` as the similarity scores them: unit length for cosine (a zero
        vector, a masked interest, stays zero)."""
        return ops.normalize(vectors, axis=-1) if self.similarity == "cosine" else vectors

    def compute_loss(
        self,
        x: Any = None,
        y: Any = None,
        y_pred: Any = None,
        sample_weight: Any = None,
        training: bool = True,
    ) -> Any:
        if self.task is None:
            raise RuntimeError(
                "attach a task (model.task = retrieval.training.losses.task.build_task(...)) before training"
            )
        loss = self.task(y_pred, y, lambda ids: self._scored(self.item_tower.candidates(ids, training)))
        if self.losses:  # regularisation added by layers (add_loss), e.g. attention penalties
            loss = loss + tf.add_n(self.losses)
        return loss


def takes_side_information(tower: str) -> bool:
    """Whether the user tower ``tower`` reads side information (``ModelConfig.fusion``,
    ``side_features``): its constructor takes a ``fusion`` argument.

    Example:
        >>> takes_side_information("sasrec"), takes_side_information("youtubednn")
        (True, False)
    """
    return "fusion" in constructor_parameters(tower_class(tower))


def tower_fusions(tower: str) -> tuple[str, ...]:
    """The ``ModelConfig.fusion`` modes the user tower ``tower`` takes: ``("none",)`` for a tower
    without side information, else every mode of :data:`~retrieval.training.config.FUSIONS` or
    those its class names in ``fusions`` (``fmlprec`` has no attention for ``nova``).

    Example:
        >>> tower_fusions("fmlprec"), tower_fusions("youtubednn")
        (('none', 'sum', 'concat', 'gated'), ('none',))
    """
    if not takes_side_information(tower):
        return ("none",)
    return tuple(getattr(tower_class(tower), "fusions", FUSIONS))


def build_model(
    config: ModelConfig,
    num_embeddings: int,
    side: SideVocab | None = None,
    attributes: np.ndarray | None = None,
) -> TwoTowerModel:
    """Builds an untrained model for a catalogue of ``num_embeddings - 1`` items.

    Every :class:`ModelConfig` field that the chosen tower's constructor accepts is passed to
    it (``None`` = the tower's default), so a new tower option needs only a config field.

    Args:
        side: the side features to use (their vocabularies), if any.
        attributes: the item -> attribute-ids table ``[num_embeddings, A]`` when ``side``
            includes ``attributes``.
    """
    cls = tower_class(config.tower)
    accepted = constructor_parameters(cls)
    skip = ("item_tower", "max_len", "side_features")
    options = {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if f.name in accepted and f.name not in skip and getattr(config, f.name) is not None
    }
    side = side or SideVocab()
    if (side.features or config.fusion != "none") and not takes_side_information(config.tower):
        raise ValueError(f"tower {config.tower!r} does not take side information (fusion, side features)")
    if side.event_features:
        options["side_features"] = side.vocab_sizes()
    use_attributes = "attributes" in side.features
    item_tower = ItemTower(
        num_embeddings,
        config.dim,
        num_attributes=len(side.attributes) if use_attributes else 0,
        max_attributes=side.max_attributes if use_attributes else 0,
        id_dropout=config.id_dropout,
    )
    model = TwoTowerModel(
        build_user_tower(config.tower, item_tower=item_tower, max_len=config.max_len, **options),
        similarity=config.similarity,
    )
    model.user_tower.build()
    if use_attributes:
        if attributes is None:
            raise ValueError("side features include attributes but no item -> attributes table was given")
        item_tower.set_item_attributes(attributes)
    return model


def item_table(model: TwoTowerModel) -> np.ndarray:
    """Every item's vector float32 ``[num_embeddings, d]`` (:meth:`ItemTower.all_items`), row 0
    (padding, never an answer and never read) zero: what a model folder holds."""
    table = np.array(model.item_tower.all_items(), np.float32)
    table[0] = 0.0
    return table


def scoring_table(model: TwoTowerModel, table: np.ndarray | None = None) -> np.ndarray:
    """The item vectors a user vector scores, float32 ``[num_embeddings, d]``: ``table``
    (default :func:`item_table`), itself, or its rows scaled to unit length when
    ``model.similarity`` is cosine. What the index and evaluation read."""
    table = item_table(model) if table is None else table
    return scored_rows(table, model.similarity)


def export_user_tower(
    model: TwoTowerModel, path: Path, inputs: tuple[str, ...] = ("items",), table: np.ndarray | None = None
) -> None:
    """Writes a SavedModel with the serving endpoint
    ``user_vectors({name: int32 [B, L]}, item_vectors) -> [B, K, d]`` and, for a tower with
    per-interest weights (``explanation`` other than ``"none"``), the endpoint
    ``interest_weights`` (same arguments) -> ``[B, K, L]`` that explains the interests.

    ``inputs`` names the tower's inputs (``items`` plus any per-event side features).
    ``item_vectors`` is float32 ``[num_embeddings, d]``, ``table`` (default :func:`item_table`),
    written beside as ``path/item_vectors.npy`` (``TOWER_TABLE``): the endpoints read item vectors from it
    (:meth:`ItemTower.reading`), so the SavedModel holds no item table of its own and the
    processes serving a model share the one file they map. The endpoints are traced graphs:
    serving needs neither the tower classes nor tracing per call.
    """
    features = {name: tf.TensorSpec([None, None], tf.int32, name=name) for name in inputs}
    vectors = tf.TensorSpec([None, model.item_tower.dim], tf.float32, name="item_vectors")

    def reading(fn: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any], Any], Any]:
        def endpoint(features: dict[str, Any], item_vectors: Any) -> Any:
            with model.item_tower.reading(item_vectors):
                return fn(features)

        return endpoint

    # Not archive.track(model): it would save every weight a second time, as the Keras
    # wrappers of the variables the endpoints capture (keras-team/keras#23553), doubling the
    # artifact and the memory of every process that loads it. The endpoints' own variables
    # are saved, once.
    archive = keras.export.ExportArchive()
    archive.add_endpoint(
        name="user_vectors",
        fn=reading(lambda features: model(features, training=False)),
        input_signature=[features, vectors],
    )
    if model.user_tower.explanation != "none":
        archive.add_endpoint(
            name="interest_weights",
            fn=reading(model.user_tower.interest_weights),
            input_signature=[features, vectors],
        )
    archive.write_out(str(path), verbose=False)
    np.save(Path(path) / TOWER_TABLE, item_table(model) if table is None else table)
