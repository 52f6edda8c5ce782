"""The native engine's kernel: a loaded :class:`~retrieval.serving.retriever.Retriever`'s user tower
and index, called by the C++ data plane (:mod:`retrieval.serving.native`) once per micro-batch.

C++ parses, checks and looks up each request, forms a batch and hands this kernel its arrays;
the kernel runs the user tower on them and the index search the Python engine runs
(:func:`index.multi_interest.search_interests`'s batched search: the history over-fetched, an
allow-list or category inside the index), and returns each row's candidates per interest. C++
then drops the excluded ids, merges (max-score, round-robin, diversity), builds and sends the
responses. The same objects do the work as in the Python engine (the tower, the index, the
ranker, the tower's interest weights): no second implementation.

Rarer calls complete it: :meth:`NativeKernel.alone` answers a row whose batched search came back
short (an approximate index, a narrow filter) with the Python engine's own search of that row
(:meth:`Retriever.search_group`), :meth:`NativeKernel.rescore` scores a DIVERSITY row's
candidates under each of its interests as the Python engine does, and
:meth:`NativeKernel.rerank` scores a batch's reranked candidates with its ranker.

Example:
    >>> kernel = NativeKernel(retriever)
    >>> ids, scores, fetched, _, _ = kernel.search(histories, fetch, groups, [], None, False, rows)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import faiss
import numpy as np

from index import SearchFilter
from retrieval.api.convert import model_info_message
from retrieval.api.types import MergeStrategy, ModelInfo
from retrieval.data.features import encode_events
from retrieval.serving.explain import WEIGHED
from retrieval.serving.retriever import Retriever

__all__ = ["BatchKernel", "Events", "NativeKernel", "NativeServable", "SearchAnswer", "native_servable"]

Events = tuple[np.ndarray, Sequence[str], int, np.ndarray]
"""One row's events, for a tower reading side features: timestamps int64 ``[n]``, actions
``[n]``, the request time (0 = now) and the positions int64 ``[m]`` of the known events the
row's history holds (oldest first)."""

SearchAnswer = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]
"""``(ids int64 [B, K, n], scores float32 [B, K, n], fetched int32 [B], interests float32
[B, K, d] | None, weights float32 [E, K, w] | None)``: see :meth:`NativeKernel.search`."""


class BatchKernel(Protocol):
    """What the engine calls (:class:`NativeKernel` is the retriever's; tests give toy ones)."""

    def search(
        self,
        histories: np.ndarray,
        fetch: np.ndarray,
        allow_group: np.ndarray,
        allows: Sequence[np.ndarray],
        events: Sequence[Events | None] | None,
        want_interests: bool,
        explain_rows: np.ndarray,
    ) -> SearchAnswer: ...

    def alone(
        self,
        interests: np.ndarray,
        depth: int,
        search: tuple[str, float, int],
        exclude: np.ndarray,
        allow: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

    def rescore(self, interests: np.ndarray, ids: np.ndarray) -> np.ndarray: ...

    def rerank(
        self,
        ranker: str,
        histories: Sequence[np.ndarray],
        candidates: np.ndarray,
        scores: np.ndarray,
        unclicked: Sequence[np.ndarray] | None,
    ) -> np.ndarray: ...


class NativeKernel:
    """The per-batch calls of one servable (a retriever), made on the engine's batcher thread.

    Args:
        retriever: the loaded model, index, categories and rankers.
        search_threads: FAISS's threads per search, set on the calling thread (as the Python
            engine sets it on its request threads); ``None`` leaves FAISS's default.
    """

    def __init__(self, retriever: Retriever, search_threads: int | None = 1) -> None:
        self.retriever = retriever
        self.search_threads = search_threads
        self._features = retriever.model.side.event_features

    def search(
        self,
        histories: np.ndarray,
        fetch: np.ndarray,
        allow_group: np.ndarray,
        allows: Sequence[np.ndarray],
        events: Sequence[Events | None] | None,
        want_interests: bool,
        explain_rows: np.ndarray,
    ) -> SearchAnswer:
        """The tower call and the index searches of one batch.

        Args:
            histories: int32 ``[B, max_len]`` each row's known history (dense ids the tower
                reads), its last ``max_len`` ids left-padded with 0, as the tower reads them.
            fetch: int32 ``[B]`` candidates each interest of a row needs: its depth plus its
                excluded ids (the history is dropped after the search, as the Python engine does).
            allow_group: int32 ``[B]`` the row's filter, an index into ``allows``; -1 = none.
            allows: sorted unique int64 dense ids, the only ones a group's rows may get (an
                allow-list, a category or both); rows sharing one share a search.
            events: per row its events (:data:`Events`) or ``None``; ``None`` for every row when
                the tower reads no side feature.
            want_interests: also return the interests.
            explain_rows: int32 ``[E]`` the rows asking for explanations.

        Returns:
            ``ids`` int64 / ``scores`` float32 ``[B, K, n]``: per row and interest the search's
            candidates, best first (-1 / -inf: empty; a whole row for an all-zero interest,
            which the Python engine does not search either); ``fetched`` int32 ``[B]`` the depth
            each row was searched to (fewer candidates than that: the index ran out);
            ``interests`` ``[B, K, d]`` when asked; ``weights`` float32 ``[E, K, w]`` the
            tower's interest weights of the explained rows over their last ``w`` events, when
            the model has them.
        """
        if self.search_threads is not None:
            faiss.omp_set_num_threads(self.search_threads)
        model, index = self.retriever.model, self.retriever.index
        inputs = {"items": histories, **self._side_inputs(histories, events)}
        encoded = model.user_vectors(inputs)  # [B, K, d]
        batch, num_interests = encoded.shape[:2]
        ntotal = index.ntotal
        depth = max(1, min(int(fetch.max()), ntotal))
        ids = np.full((batch, num_interests, depth), -1, np.int64)
        scores = np.full((batch, num_interests, depth), -np.inf, np.float32)
        fetched = np.zeros(batch, np.int32)
        active = np.any(encoded != 0, axis=2)  # all-zero (masked) interests are never searched
        for group in np.unique(allow_group).tolist():
            members = np.flatnonzero(allow_group == group)
            users, slots = np.nonzero(active[members])
            if not len(users) or ntotal == 0:
                continue
            n = min(int(fetch[members].max()), ntotal)
            allowed = None if group < 0 else allows[group]
            queries = np.ascontiguousarray(encoded[members][users, slots])
            started = time.perf_counter()
            found_scores, found_ids = index.search(queries, n, SearchFilter.of(allow=allowed))
            if self.retriever.observe_search is not None:  # retrieval_index_search_seconds
                self.retriever.observe_search(time.perf_counter() - started)
            ids[members[users], slots, :n] = found_ids
            scores[members[users], slots, :n] = found_scores
            fetched[members] = n
        weights = None
        if len(explain_rows) and model.interest_weights is not None and model.explanation in WEIGHED:
            rows = histories[explain_rows]
            width = int(max(1, (rows > 0).sum(axis=1).max()))  # the longest history it reads
            weights = model.interest_weights({name: v[explain_rows, -width:] for name, v in inputs.items()})
        return ids, scores, fetched, encoded if want_interests else None, weights

    def alone(
        self,
        interests: np.ndarray,
        depth: int,
        search: tuple[str, float, int],
        exclude: np.ndarray,
        allow: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One row answered by the Python engine's own search and merge (its batched search
        came back short: the Python engine would have searched it again).

        Args:
            interests: float32 ``[K, d]``.
            depth: items wanted.
            search: the merge's name, its λ, each interest's depth (0 = ``depth``).
            exclude: sorted unique int64 dense ids never returned.
            allow: sorted unique int64 dense ids, the only ones returned; ``None`` = any.

        Returns:
            The row's items, best first: ids int64, scores float32, interests int32 ``[m]``.
        """
        if self.search_threads is not None:
            faiss.omp_set_num_threads(self.search_threads)
        merge, lam, fetch = search
        found = self.retriever.search_group(
            interests[None], depth, [exclude], allow, (MergeStrategy(merge), lam, fetch)
        )
        kept = np.flatnonzero(found.ids[0] >= 0)[:depth]
        return found.ids[0][kept], found.scores[0][kept], found.interests[0][kept]

    def rescore(self, interests: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """DIVERSITY's candidates scored under the row's active interests, the product the Python
        engine computes (:func:`index.multi_interest.search_interests` with ``item_vectors``), so
        that both engines rank by the same float32 values: float32 ``[K', n]``.

        Args:
            interests: float32 ``[K', d]`` the active interests, in their order.
            ids: int64 ``[n]`` sorted unique dense ids.
        """
        result: np.ndarray = interests @ self.retriever.model.item_embeddings[ids].T
        return result

    def rerank(
        self,
        ranker: str,
        histories: Sequence[np.ndarray],
        candidates: np.ndarray,
        scores: np.ndarray,
        unclicked: Sequence[np.ndarray] | None,
    ) -> np.ndarray:
        """The click logits of one ranker's candidates, as the Python engine's rerank asks them
        (:meth:`LoadedRanker.score`): float32 ``[R, w]``.

        Args:
            ranker: its name.
            histories: per row, its known history (dense ids, oldest first).
            candidates: int64 ``[R, w]`` the retrieved items in their order (0 = none).
            scores: float32 ``[R, w]`` their retrieval scores.
            unclicked: per row, the dense ids shown and not clicked, for a ranker reading them.
        """
        return self.retriever.rankers[ranker].score(histories, candidates, unclicked, retrieval_scores=scores)

    def _side_inputs(
        self, histories: np.ndarray, events: Sequence[Events | None] | None
    ) -> dict[str, np.ndarray]:
        """The tower's side inputs ``{name: int32 [B, max_len]}``, aligned with ``histories``:
        each row's event features as the Python engine encodes them (from the whole timeline,
        then at its known events), 0 for a row without events."""
        if not self._features:
            return {}
        out = {name: np.zeros_like(histories) for name in self._features}
        side, width = self.retriever.model.side, histories.shape[1]
        for row, given in enumerate(events or ()):
            if given is None:
                continue
            timestamps, actions, request_time, positions = given
            encoded = encode_events(side, timestamps, actions, request_time=request_time or int(time.time()))
            for name, values in encoded.items():
                if len(values) == len(timestamps):
                    tail = values[positions][-width:]
                    out[name][row, width - len(tail) :] = tail
        return out


@dataclass(frozen=True)
class NativeServable:
    """What the native engine is handed for one version: the kernel and what C++ reads itself.

    Attributes:
        kernel: the per-batch calls.
        vocabulary: external ids, ``vocabulary[i]`` is dense id ``i + 1``.
        tower_items: dense ids ``1..tower_items`` are read as history (later ones are items
            added after training: retrieved, excluded, not read).
        model_version: reported in every answer.
        max_len: the tower's history width.
        num_interests: K.
        num_items: items in the index (the cost formula's N).
        category_members: category -> sorted int64 dense ids of its items.
        category_codes: int64 ``[num_items + 1]`` each dense id's category code (DIVERSITY).
        explanation: what the tower's weights are (:class:`~retrieval.api.types.ExplanationKind`).
        rankers: name -> (version, unclicked items it reads).
        side_features: whether the tower reads side features (events are handed to the kernel).
        model_info: the serialized ``ModelInfo`` message ``GetModelInfo`` answers.
    """

    kernel: BatchKernel
    vocabulary: list[str]
    tower_items: int
    model_version: str
    max_len: int
    num_interests: int
    num_items: int
    category_members: dict[str, np.ndarray]
    category_codes: np.ndarray
    explanation: str
    rankers: dict[str, tuple[str, int]]
    side_features: bool
    model_info: bytes


def native_servable(
    retriever: Retriever, info: ModelInfo | None = None, search_threads: int | None = 1
) -> NativeServable:
    """The native engine's :class:`NativeServable` of ``retriever``; ``info`` (default: its own
    :meth:`Retriever.model_info`) is what ``GetModelInfo`` answers."""
    model = retriever.model
    info = retriever.model_info() if info is None else info
    return NativeServable(
        kernel=NativeKernel(retriever, search_threads),
        # Not vocab.ids: that tuple stays cached in the vocabulary; this list goes once handed over.
        vocabulary=model.vocab.external(np.arange(1, len(model.vocab) + 1)),
        tower_items=model.tower_items,
        model_version=retriever.model_version,
        max_len=model.max_len,
        num_interests=model.num_interests,
        num_items=retriever.index.ntotal,
        category_members=dict(retriever.categories.members.ids_by_category),
        category_codes=np.ascontiguousarray(retriever.categories.codes, np.int64),
        explanation=model.explanation,
        rankers={name: (r.version, r.num_unclicked) for name, r in retriever.rankers.items()},
        side_features=bool(model.side.event_features),
        model_info=model_info_message(info).SerializeToString(),
    )
