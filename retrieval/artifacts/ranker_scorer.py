"""Scores candidate lists with a loaded ranker inside one ``tf.function`` (TensorFlow: imported only
when a ranker is loaded)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from rankers import Ranker
from retrieval.artifacts.model import pad_left
from retrieval.artifacts.ranker_inputs import AttributeTable, context_of
from retrieval.artifacts.xla import COMPILED_BATCHES, COMPILED_WIDTHS, XlaFunction, pad_to, padded_size
from retrieval.data.vocab import PAD

XLA_ROWS = 1
"""Lists a call may hold to run compiled (``xla``); larger calls run the plain graph: compiled
micro-batches cost the server more CPU per request than the plain graph (docs/benchmarks.md,
"XLA in the server")."""

_VARYING_WIDTHS = ("candidates", "retrieval_scores", "unclicked")
"""Scorer inputs whose width varies between calls (padded to ``COMPILED_WIDTHS`` under XLA)."""

MAX_CELLS = 16_384
"""Most ``rows × candidates`` one call of the model scores; larger requests are split into rows.
Bounds the memory of DIEN, which runs one AUGRU per (user, candidate)."""


def with_attributes(inputs: Mapping[str, Any], table: Any | None) -> dict[str, Any]:
    """Adds ``history_attributes`` ``[B, L, A]`` and ``candidate_attributes`` ``[B, C, A]`` (and
    ``context_attributes`` ``[B, N, A]`` when there is a ``context``) looked up in ``table``
    (``[num_items + 1, A]``, a tensor) to the ranker inputs; unchanged without a table.

    Runs inside TensorFlow (``tf.data`` maps and the scorer's ``tf.function``), so training and
    serving embed attributes alike.
    """
    out = dict(inputs)
    if table is not None:
        out["history_attributes"] = tf.gather(table, out["history"])
        out["candidate_attributes"] = tf.gather(table, out["candidates"])
        if "context" in out:
            out["context_attributes"] = tf.gather(table, out["context"])
    return out


class RankerScorer:
    """Scores candidate lists of dense item ids with a ranker; safe to call from several threads.

    The model runs inside one ``tf.function`` whose input signature fixes the history width
    (``max_len``) and leaves the batch and candidate dimensions open, so it is traced once (at
    construction) and every later call, whatever its shape, reuses that graph (called through
    its concrete function, without ``tf.function``'s per-call argument matching). The signature
    holds ``retrieval_scores`` when the ranker reads them (``model.retrieval_score``) and
    ``context`` when it reads one (``model.context_size`` > 0: DSTN's top retrieved items, taken
    here from the candidates, which callers give in the retriever's order).

    With ``xla`` the same function runs compiled by XLA (:class:`retrieval.artifacts.xla.XlaFunction`, as
    the user tower's ``--xla``), on inputs zero-padded to a few shapes so that XLA compiles few
    programs: candidate and unclicked lists to :data:`~retrieval.artifacts.xla.COMPILED_WIDTHS` (longer
    ones run the plain graph). Only calls of at most :data:`XLA_ROWS` lists run compiled: XLA
    shortens one request's rerank, but the plain graph scores a micro-batch of several lists
    about twice as fast per list (see :data:`XLA_ROWS`). Padding changes no
    logit: no ranker's logit of a candidate depends on padded candidates, rows or unclicked
    slots, and inference reads no batch statistics (Dice uses its moving averages).

    Args:
        model: a built ranker.
        attributes: the item attribute table the ranker was trained with (``None`` when it reads none).
        uses_unclicked: whether to feed the ``unclicked`` input (DSTN).
        xla: run the model compiled by XLA (falls back to the plain graph should XLA refuse it).

    Example:
        >>> scorer = RankerScorer(ranker, attributes, uses_unclicked=False)
        >>> candidates, scores = np.array([[12, 5, 40]]), np.array([[2.0, 1.5, 0.3]])  # retrieval order
        >>> scorer.score([np.array([3, 7, 9])], candidates, retrieval_scores=scores)  # float32 [1, 3]
    """

    def __init__(
        self, model: Ranker, attributes: AttributeTable | None, uses_unclicked: bool, xla: bool = False
    ) -> None:
        self.model = model
        self.attributes = attributes
        self.uses_unclicked = uses_unclicked
        self.max_len = int(model.max_len)
        self.num_items = int(model.num_items)
        self.uses_scores = bool(model.retrieval_score)
        self.context_width = int(model.context_size) + 1 if model.context_size else 0
        table = None if attributes is None else tf.constant(attributes.table, tf.int32)
        signature = {
            "history": tf.TensorSpec([None, self.max_len], tf.int32),
            "candidates": tf.TensorSpec([None, None], tf.int32),
        }
        if uses_unclicked:
            signature["unclicked"] = tf.TensorSpec([None, None], tf.int32)
        if self.uses_scores:
            signature["retrieval_scores"] = tf.TensorSpec([None, None], tf.float32)
        if self.context_width:
            signature["context"] = tf.TensorSpec([None, self.context_width], tf.int32)

        def logits(inputs: dict[str, tf.Tensor]) -> tf.Tensor:
            return tf.cast(model(with_attributes(inputs, table), training=False), tf.float32)

        self.function = tf.function(logits, input_signature=[signature], autograph=False)
        # Traced here, once: a first trace racing between server threads is avoided.
        self.concrete = self.function.get_concrete_function()
        self.compiled = (
            XlaFunction(logits, self.concrete, f"ranker {type(model).__name__}", signature) if xla else None
        )
        probe = {"history": np.zeros((1, self.max_len), np.int32), "candidates": np.ones((1, 1), np.int32)}
        if uses_unclicked:
            probe["unclicked"] = np.zeros((1, 1), np.int32)
        if self.uses_scores:
            probe["retrieval_scores"] = np.zeros((1, 1), np.float32)
        if self.context_width:
            probe["context"] = np.zeros((1, self.context_width), np.int32)
        self.function(probe)

    def tracing_count(self) -> int:
        """How often the model's graph was traced (1 for the scorer's whole life)."""
        return int(self.function.experimental_get_tracing_count())

    def score(
        self,
        histories: Sequence[np.ndarray],
        candidates: np.ndarray,
        unclicked: Sequence[np.ndarray] | None = None,
        retrieval_scores: np.ndarray | None = None,
    ) -> np.ndarray:
        """Click logits of each user's candidates.

        Args:
            histories: per user, dense item ids, oldest first (only the last ``max_len`` are read).
            candidates: int ``[B, C]`` dense ids in the retriever's order (best first); 0 or
                negative (a retriever's empty slot) = no item.
            unclicked: per user, dense ids of items shown and not clicked (DSTN only; ignored by
                the other rankers; ``None`` = none).
            retrieval_scores: float ``[B, C]``, the retriever's score of each candidate (what its
                search returned; any value in empty slots). Required by a ranker that reads them,
                ignored by the others.

        Item attributes come from the artifact's own table: callers give ids only.

        Returns:
            float32 ``[B, C]`` logits (higher = more likely clicked); ``-inf`` where there is no item.

        Raises:
            ValueError: mismatched lengths or shapes, an id outside ``0..num_items``, or no (or a
                non-finite) retrieval score for a ranker that reads them.
        """
        present, cand, history = self._dense_ids(histories, candidates)
        batch, width = cand.shape
        out = np.full((batch, width), -np.inf, np.float32)
        if not batch or not width:
            return out
        inputs: dict[str, np.ndarray] = {"history": history, "candidates": cand.astype(np.int32)}
        if self.uses_unclicked:
            inputs["unclicked"] = self._unclicked(unclicked, batch)
        if self.uses_scores:
            inputs["retrieval_scores"] = _retrieval_scores(retrieval_scores, cand, present)
        if self.context_width:
            inputs["context"] = context_of(cand, self.context_width)
        step = self._rows_per_call(width)
        for start in range(0, batch, step):
            out[start : start + step] = self._run({k: v[start : start + step] for k, v in inputs.items()})
        out[~present] = -np.inf
        return out

    def _dense_ids(
        self, histories: Sequence[np.ndarray], candidates: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where the candidates hold an item, the candidates with PAD elsewhere (int64 ``[B, C]``),
        and the histories padded to ``max_len``; refuses shapes or ids that do not fit."""
        candidates = np.asarray(candidates)
        if candidates.ndim != 2 or len(candidates) != len(histories):
            raise ValueError(
                f"candidates must be [B, C] for B = {len(histories)} histories, got {list(candidates.shape)}"
            )
        present = candidates > 0
        cand = np.where(present, candidates, PAD).astype(np.int64)
        history = pad_left(histories, self.max_len)
        for name, ids in (("candidates", cand), ("histories", history)):
            if ids.size and ids.max() > self.num_items:
                raise ValueError(f"{name} hold id {int(ids.max())}, beyond the {self.num_items} items")
            if ids.size and ids.min() < 0:
                raise ValueError(f"{name} hold a negative id")
        return present, cand, history

    def _unclicked(self, unclicked: Sequence[np.ndarray] | None, batch: int) -> np.ndarray:
        """The ``unclicked`` input: each row left-padded to the longest (none = one empty slot)."""
        if unclicked is not None and len(unclicked) != batch:
            raise ValueError(f"unclicked has {len(unclicked)} rows for {batch} histories")
        rows = list(unclicked) if unclicked is not None else [np.zeros(0, np.int32)] * batch
        longest = max([len(u) for u in rows] + [1])
        shown = pad_left(rows, longest)
        if shown.size and (shown.max() > self.num_items or shown.min() < 0):
            raise ValueError(f"unclicked ids must be in 0..{self.num_items}")
        return shown

    def _rows_per_call(self, width: int) -> int:
        """Rows one call scores: at most ``MAX_CELLS`` cells."""
        return max(1, MAX_CELLS // width)

    def _run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """Logits ``[rows, width]`` of one call's inputs: compiled on zero-padded copies with
        ``xla`` (when the shapes fit its sizes), else the plain graph."""
        rows, width = inputs["candidates"].shape
        if self.compiled is not None and rows <= XLA_ROWS:
            # Rows and the candidate and unclicked lists vary; the history and context are fixed.
            widths = {
                k: padded_size(v.shape[1], COMPILED_WIDTHS) if k in _VARYING_WIDTHS else v.shape[1]
                for k, v in inputs.items()
            }
            size = padded_size(rows, COMPILED_BATCHES)
            if size is not None and None not in widths.values():
                padded = {k: tf.constant(pad_to(v, (size, widths[k] or 0))) for k, v in inputs.items()}
                return self.compiled(padded)[:rows, :width]
        return self.concrete({k: tf.constant(v) for k, v in inputs.items()}).numpy()


def _retrieval_scores(
    retrieval_scores: np.ndarray | None, cand: np.ndarray, present: np.ndarray
) -> np.ndarray:
    """The ``retrieval_scores`` input, float32 ``[B, C]`` (0 where no item); refuses missing,
    misshapen or non-finite scores of candidates."""
    if retrieval_scores is None:
        raise ValueError("this ranker reads the retriever's scores: pass retrieval_scores [B, C]")
    scores = np.asarray(retrieval_scores, np.float32)
    if scores.shape != cand.shape:
        raise ValueError(f"retrieval_scores is {list(scores.shape)}, candidates {list(cand.shape)}")
    if not np.isfinite(scores[present]).all():
        raise ValueError("retrieval_scores must be finite for every candidate")
    return np.where(present, scores, 0.0).astype(np.float32)
