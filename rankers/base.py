"""The one interface every ranker implements, and the click loss they are trained with."""

from __future__ import annotations

import abc
from typing import Any

import keras
from keras import ops

from rankers.layers import masked_mean
from towers.base import sequence_mask
from towers.item import ItemTower
from towers.saving import ConstructorConfig


def click_loss(labels: Any, logits: Any, mask: Any) -> Any:
    """Masked mean of the per-candidate sigmoid cross-entropy (click / no click).

    Args:
        labels: float ``[B, C]``, 1 = clicked.
        logits: float ``[B, C]``.
        mask: ``[B, C]`` bool or float weights; 0 for padded candidates.

    Returns:
        Scalar: ``Σ mask · BCE(labels, logits) / max(Σ mask, 1)``.

    Example:
        >>> click_loss(labels, model(inputs), inputs["candidates"] != 0)
    """
    mask = ops.cast(mask, "float32")
    bce = ops.binary_crossentropy(ops.cast(labels, "float32"), ops.cast(logits, "float32"), from_logits=True)
    return ops.sum(bce * mask) / ops.maximum(ops.sum(mask), 1.0)


class Ranker(ConstructorConfig, keras.Model, abc.ABC):
    """Scores a short candidate list given the user's history: one click logit per candidate.

    Item ids are ``1..num_items`` (0 = padding). Histories are left-padded (newest item last,
    as in :mod:`towers.base`) and only their last ``max_len`` columns are read. Attribute ids
    are ``1..num_attributes`` (0 = padding), several per item, mean-pooled.

    **The retriever's score as an input** (``retrieval_score=True``): in a cascade the candidate
    generator's score is the strongest single feature of a pre-ranker. Each candidate's logit
    becomes ``g · f(x) + w · s + b``, with ``f(x)`` the ranker's own logit (:meth:`score`), ``s`` the
    retriever's score of the candidate (``"retrieval_scores"``: max over the user's interests of
    the inner product with the retriever's item embedding, what its search returns) and the
    scalars ``g``, ``w``, ``b`` learned. They start at ``g = 0``, ``w = 1``, ``b = 0``, so an
    untrained ranker orders exactly as the retriever does and training learns a correction to
    that order (a residual branch started at zero, as in ReZero) rather than a new order from
    scratch; ``ranker_scale_init`` sets ``g``'s start. (:mod:`retrieval.ranking` by default
    trains the ranker's own part alone and fits ``g``, ``w``, ``b`` on held-out clicks instead:
    the retriever's scores of its own training clicks are in-sample.)

    Args:
        num_items: catalogue size; the item table has ``num_items + 1`` rows (row 0 = padding).
        dim: embedding size ``d``.
        max_len: the longest history read (older columns are dropped).
        num_attributes: attribute vocabulary size (0 = no attributes).
        retrieval_score: read ``"retrieval_scores"`` and add ``w · s + b`` to the logits (above).
        ranker_scale_init: the initial ``g`` (only with ``retrieval_score``).

    Call:
        inputs: ``{"history": int [B, L], "candidates": int [B, C]}`` plus optionally
            ``"history_attributes"`` int ``[B, L, A]``, ``"candidate_attributes"`` int ``[B, C, A]``,
            ``"unclicked"`` int ``[B, U]`` and ``"context"`` int ``[B, N]`` (DSTN), and
            ``"retrieval_scores"`` float ``[B, C]`` (required with ``retrieval_score``; any value,
            even ``-inf``, in padded slots).
        Returns float32 logits ``[B, C]``; a padded candidate's logit is 0 and no candidate's logit
        depends on the padded ones.

    Training: ``fit(inputs, labels [B, C])`` minimises :func:`click_loss` over the real candidates
    plus any loss the ranker adds (``add_loss``: regularisation, auxiliary losses).
    """

    context_size: int = 0
    """Items of the ``"context"`` input a ranker reads (0 = it reads none; DSTN sets it)."""

    def __init__(
        self,
        num_items: int,
        dim: int,
        max_len: int,
        num_attributes: int = 0,
        retrieval_score: bool = True,
        ranker_scale_init: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if num_items < 1 or dim < 1 or max_len < 1 or num_attributes < 0:
            raise ValueError(
                f"need num_items, dim, max_len >= 1 and num_attributes >= 0, got "
                f"{num_items}, {dim}, {max_len}, {num_attributes}"
            )
        self.num_items, self.dim, self.max_len = num_items, dim, max_len
        self.num_attributes = num_attributes
        self.retrieval_score, self.ranker_scale_init = bool(retrieval_score), float(ranker_scale_init)
        self.item_tower = ItemTower(num_items + 1, dim)
        init = keras.initializers.TruncatedNormal(stddev=0.02)
        self.attribute_table = (
            keras.layers.Embedding(num_attributes + 1, dim, embeddings_initializer=init, name="attributes")
            if num_attributes
            else None
        )

    def build(self, input_shape: Any = None) -> None:
        if getattr(self, "built", False):  # e.g. rebuilt from its build config when deserialized
            return
        self.item_tower.build()
        if self.attribute_table is not None:
            self.attribute_table.build((None,))
        self.build_layers()
        if self.retrieval_score:
            constant = keras.initializers.Constant
            self.ranker_scale = self.add_weight(
                shape=(), initializer=constant(self.ranker_scale_init), name="ranker_scale"
            )
            self.retrieval_weight = self.add_weight(
                shape=(), initializer=constant(1.0), name="retrieval_weight"
            )
            self.retrieval_bias = self.add_weight(shape=(), initializer="zeros", name="retrieval_bias")
        self.built = True

    @property
    def blend_variables(self) -> tuple[Any, Any, Any]:
        """The retrieval term's ``(g, w, b)`` variables (only with ``retrieval_score``)."""
        return self.ranker_scale, self.retrieval_weight, self.retrieval_bias

    def set_blend(self, scale: float, weight: float, bias: float) -> None:
        """Sets ``g``, ``w``, ``b`` of ``g·own + w·s + b`` (only with ``retrieval_score``)."""
        for variable, value in zip(self.blend_variables, (scale, weight, bias), strict=True):
            variable.assign(value)

    @abc.abstractmethod
    def build_layers(self) -> None:
        """Builds the ranker's own layers (the shapes follow from ``dim`` and the options)."""

    @abc.abstractmethod
    def score(self, inputs: dict[str, Any], training: bool = False) -> Any:
        """Logits ``[B, C]`` before padded candidates are zeroed (inputs already truncated)."""

    def call(self, inputs: dict[str, Any], training: bool = False) -> Any:
        logits = ops.cast(self.score(self.truncate(inputs), training=training), "float32")
        valid = sequence_mask(inputs["candidates"])
        if self.retrieval_score:
            logits = self.with_retrieval_score(logits, inputs, valid)
        return ops.where(valid, logits, 0.0)  # [B, C]

    def with_retrieval_score(self, logits: Any, inputs: dict[str, Any], valid: Any) -> Any:
        """``g · logits + w · s + b`` ``[B, C]``, with ``s = 0`` in padded slots (so that an ``-inf``
        there never reaches the arithmetic or its gradient).

        Raises:
            ValueError: the inputs have no ``"retrieval_scores"``.
        """
        if "retrieval_scores" not in inputs:
            raise ValueError(
                f"{type(self).__name__} was built with retrieval_score=True: its inputs need "
                "'retrieval_scores' [B, C], the retriever's score of each candidate"
            )
        s = ops.where(valid, ops.cast(inputs["retrieval_scores"], "float32"), 0.0)
        return self.ranker_scale * logits + self.retrieval_weight * s + self.retrieval_bias

    def truncate(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Keeps the last ``max_len`` history columns (and their attributes)."""
        out = dict(inputs)
        for key in ("history", "history_attributes"):
            if key in out:
                out[key] = out[key][:, -self.max_len :]
        return out

    def attribute_vectors(self, attribute_ids: Any | None, like: Any) -> Any:
        """Mean embedding of each item's attributes ``[..., A]`` -> ``[..., d]``.

        Zeros (shaped as ``like``, ``[..., d]``) without attributes, in the model or the inputs.
        """
        if self.attribute_table is None or attribute_ids is None:
            return ops.zeros_like(like)
        return masked_mean(self.attribute_table(attribute_ids), sequence_mask(attribute_ids))

    def item_vectors(self, ids: Any, attribute_ids: Any | None = None) -> Any:
        """Item representations ``[..., d]``: the id embedding plus the mean attribute embedding
        (the :class:`towers.item.ItemTower` convention), so attributes reach every attention."""
        e = self.item_tower.id_embedding(ids)
        return e + self.attribute_vectors(attribute_ids, e)

    def history_vectors(self, inputs: dict[str, Any]) -> Any:
        """``[B, L, d]`` vectors of the history items."""
        return self.item_vectors(inputs["history"], inputs.get("history_attributes"))

    def candidate_vectors(self, inputs: dict[str, Any]) -> Any:
        """``[B, C, d]`` vectors of the candidates."""
        return self.item_vectors(inputs["candidates"], inputs.get("candidate_attributes"))

    def compute_loss(
        self,
        x: Any = None,
        y: Any = None,
        y_pred: Any = None,
        sample_weight: Any = None,
        training: bool = True,
    ) -> Any:
        mask = ops.cast(sequence_mask(x["candidates"]), "float32")
        if sample_weight is not None:
            mask = mask * ops.cast(sample_weight, "float32")
        loss = click_loss(y, y_pred, mask)
        for extra in self.losses:  # add_loss terms: regularisation, auxiliary losses
            loss = loss + extra
        return loss
