"""The retriever: user histories in, the top-k items over each user's interests out (no gRPC)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import retrieval.api.types as api_types
from index import VectorIndex
from index.merge import strategy
from index.multi_interest import SearchResult, search_interests
from retrieval.api.errors import DeadlineExceeded, InvalidArgument, shorten
from retrieval.api.types import Explanations, MergeStrategy, ModelInfo, Query, Rerank, Retrieved, as_query
from retrieval.artifacts.categories import Categories
from retrieval.artifacts.changes import CatalogueChanges, changed_attributes
from retrieval.artifacts.index import load_index
from retrieval.artifacts.model import KIND as MODEL_KIND
from retrieval.artifacts.model import ModelArtifact, load_model, read_item_attributes
from retrieval.artifacts.ranker import LoadedRanker, check_same_vocab, load_ranker
from retrieval.data.features import encode_events
from retrieval.data.vocab import PAD
from retrieval.serving.explain import explain_histories
from retrieval.storage.manifest import ArtifactError, read_manifest
from retrieval.storage.versions import resolve_current

logger = logging.getLogger(__name__)


_Found = tuple[np.ndarray, np.ndarray, np.ndarray]
"""A row's retrieved items: ids, scores, and the interest that found each (``[n]`` each)."""

_SearchKey = tuple[MergeStrategy, float, int, tuple[tuple[str, ...], str]]
"""Merge, diversity λ, per-interest depth, and what ``allow`` came from (allow ids, category):
rows sharing it share an index search."""

_PREVIOUS_SEARCH: _SearchKey = (MergeStrategy.MAX_SCORE, 0.0, 0, ((), ""))
"""A previous request's search, as ranker training retrieved: max-score, no filter."""


@dataclass(frozen=True)
class _Prepared:
    """A validated query in dense ids: a row of the tower call and of a search (so is the
    previous request of a rerank computing its unclicked items, :meth:`Retriever._previous`)."""

    known: np.ndarray  # int [n] known history ids, oldest first
    features: dict[str, np.ndarray]  # per side feature of the tower, int [n]
    exclude: np.ndarray  # sorted unique int64: history and exclude list
    allow: np.ndarray | None  # sorted unique int64 dense ids, None = everything
    search: _SearchKey
    unknown: int
    ranker: LoadedRanker | None  # the rerank's ranker, None = no rerank
    depth: int  # items retrieved: k, or the rerank's candidates
    unclicked: np.ndarray | None = None  # int64 dense ids the ranker reads, None = none or computed
    previous: np.ndarray | None = None  # int [n - 1] the previous request's history, to compute them
    num_unclicked: int = 0  # unclicked items the ranker reads (0 = none)
    positions: np.ndarray | None = None  # int [n] index of each known event in the history, to explain


class Retriever:
    """Turns histories of external item ids into the top-k items across each user's K interests.

    Safe to call from several threads: it only reads the model and the index.

    Example:
        >>> retriever = Retriever.from_dirs(Path("runs/model"), Path("runs/index"))
        >>> retriever.retrieve(["B0001", "B0042"], k=10).items[0]
        ('B0107', 3.52, 1)
    """

    def __init__(
        self,
        model: ModelArtifact,
        index: VectorIndex,
        index_model_version: str | None = None,
        *,
        index_manifest: Mapping[str, Any] | None = None,
        item_attributes: Mapping[str, Sequence[str]] | Categories | None = None,
        rankers: Sequence[LoadedRanker] = (),
        index_dir: Path | None = None,
    ) -> None:
        """Pairs a model with an index of its item embeddings.

        Args:
            model: the model whose user tower encodes histories.
            index: items indexed under the model's dense ids.
            index_model_version: version of the model the index was built from (its manifest's
                ``model_version``); ``None`` when the index was just built from ``model``.
            index_manifest: the index folder's manifest (for :meth:`model_info`), if any.
            item_attributes: external id -> attributes, the first being the item's category
                (for the diversity merge), or :class:`Categories` built from them; by default
                the model folder's ``item_attributes.json``.
            rankers: pre-ranking models a query can ask to rerank with (:class:`Rerank`), loaded
                against this model's vocabulary (:func:`~retrieval.artifacts.ranker.load_ranker`).
            index_dir: the folder ``index`` was read from, if any (a later version may reuse it).

        Raises:
            ArtifactError: the index was built from another model or has another dimension;
                two rankers share a name, or a ranker's item vocabulary is not the model's.
        """
        if index_model_version is not None and index_model_version != model.version:
            raise ArtifactError(
                f"index built from model {index_model_version!r} cannot serve model {model.version!r}"
            )
        if index.dim != model.dim:
            raise ArtifactError(f"index has dimension {index.dim}, model {model.dim}")
        self.model = model
        self.index = index
        self.index_dir = index_dir
        self.index_manifest = dict(index_manifest or {})
        if isinstance(item_attributes, Categories):
            self.categories = item_attributes
        else:
            if item_attributes is None and model.path is not None:
                item_attributes = read_item_attributes(model.path)
            self.categories = Categories.of(model.vocab, item_attributes or {})
        self.rankers: dict[str, LoadedRanker] = {}
        for ranker in rankers:
            if ranker.name in self.rankers:
                raise ArtifactError(
                    f"two rankers are named {ranker.name!r}: {self.rankers[ranker.name].path}, {ranker.path}"
                )
            check_same_vocab(ranker.path, ranker.vocab, model.vocab)
            self.rankers[ranker.name] = ranker
        self.start_time = time.time()
        self.observe_search: Callable[[float], None] | None = None
        """Called with the seconds each index search took (the server's metrics hook)."""

    @classmethod
    def from_dirs(
        cls,
        model_dir: Path,
        index_dir: Path,
        ranker_dirs: Sequence[Path] = (),
        xla: bool = False,
        reuse: Retriever | None = None,
    ) -> Retriever:
        """Loads a model folder, an index folder and ranker folders, refusing an index built
        from another model and rankers trained against another vocabulary. ``xla`` compiles the
        user tower (:func:`retrieval.artifacts.model.load_model`) and the rankers
        (:class:`retrieval.artifacts.ranker_scorer.RankerScorer`).

        ``reuse`` (the retriever in service) lends what the new folders share with its own: its
        user tower, and for a catalogue change (``mitt add-items``) its catalogue, index and
        categories, to which only the change is applied.

        The versions are compared before the model's TensorFlow graph is loaded, so a mismatch
        fails fast.

        Raises:
            ArtifactError: a folder is missing or corrupted, or the versions differ.
        """
        model_version = str(read_manifest(Path(model_dir), MODEL_KIND, verify=False)["version"])
        previous = None if reuse is None or reuse.index_dir is None else (reuse.index_dir, reuse.index)
        index, manifest = load_index(
            Path(index_dir), expected_model_version=model_version, previous=previous, mmap=True
        )
        model = load_model(Path(model_dir), xla=xla, reuse=None if reuse is None else reuse.model)
        categories = None
        if reuse is not None and model.grown_from == reuse.model_version and model.changes is not None:
            earlier = reuse.model.changes or CatalogueChanges.none(model.dim)
            changed = changed_attributes({}, model.changes.since(earlier))
            categories = reuse.categories.changed(model.vocab, changed)
        rankers = []
        if ranker_dirs:
            rankers = [load_ranker(Path(d), model, xla=xla) for d in ranker_dirs]
        return cls(
            model,
            index,
            manifest["model_version"],
            index_manifest=manifest,
            item_attributes=categories,
            rankers=rankers,
            index_dir=resolve_current(Path(index_dir)),
        )

    @property
    def model_version(self) -> str:
        return self.model.version

    def model_info(self) -> ModelInfo:
        """What this retriever serves: the model's shape, the index and its measured recall."""
        index = dict(self.index.describe())
        measured = self.index_manifest.get("measured") or {}
        if "recall" in measured:
            index.update(recall=float(measured["recall"]), recall_k=int(measured.get("k", 0)))
        manifest = self.model.manifest
        return ModelInfo(
            model_version=self.model_version,
            tower=str(manifest.get("tower", "")),
            num_interests=self.model.num_interests,
            dim=self.model.dim,
            max_len=self.model.max_len,
            num_items=len(self.model.vocab),
            index=index,
            side_features=tuple(self.model.side.features),
            start_time=self.start_time,
            rankers=tuple(sorted(self.rankers)),
        )

    def retrieve(self, history: Query | Sequence[str], k: int | None = None, **fields: Any) -> Retrieved:
        """Top-``k`` items for one user: a :class:`Query` (whose fields say what each option
        does), or a history with ``k`` (default 10) and any other field by name (:func:`as_query`).

        Raises:
            InvalidArgument: an argument out of range (the message says which and why).
        """
        return self.retrieve_many([as_query(history, k, **fields)])[0]

    def retrieve_many(self, queries: Sequence[Query], deadline: float | None = None) -> list[Retrieved]:
        """Answers several users with one user-tower call and one index search per group of
        queries sharing merge options, per-interest depth and filters (one search when
        they all share them); each answer equals :meth:`retrieve` of that query alone.

        A rerank by a ranker that reads unclicked items (:attr:`LoadedRanker.num_unclicked` > 0,
        DSTN) without the request's own (``Rerank.unclicked``) gets them as its training did
        (:mod:`retrieval.ranking`, "Unclicked items"): the first ``num_unclicked`` items the
        retriever returns for the *previous* request, the known history without its last event
        (max-score merge, that history excluded, no side features and none of the request's
        filters, as ranker training retrieved), other than the last event's item. That previous
        request is one more row of the same tower call and of a search (the request's own when
        it has no filters and the max-score merge); a history of one known event has none.

        The queries asking for explanations (``explain``) get them from one more call of the
        tower's interest weights, on their rows only (:func:`~retrieval.serving.explain.explain_histories`);
        a batch where none asks does no more work than before.

        ``deadline`` (a :func:`time.monotonic` time) is checked between the stages (lookup,
        tower call, search, rerank): past it, the work stops.

        Raises:
            InvalidArgument: no queries, more than ``MAX_BATCH``, or a bad query (the message
                starts with ``requests[i]`` when there are several).
            DeadlineExceeded: ``deadline`` passed before the answers were ready.
        """
        prepared, errors = self._prepare_each(queries)
        if errors:
            i = min(errors)
            raise InvalidArgument(errors[i].reason, i if len(queries) > 1 else None)
        return self._answer_all(queries, [p for p in prepared if p is not None], deadline)

    def retrieve_each(
        self, queries: Sequence[Query], deadline: float | None = None
    ) -> list[Retrieved | InvalidArgument]:
        """:meth:`retrieve_many`, but a bad query gets its error in its place while the others are
        answered (with one tower call, as always): the answers of a micro-batch, whose callers
        are independent.

        Raises:
            InvalidArgument: no queries, or more than ``MAX_BATCH``.
            DeadlineExceeded: ``deadline`` passed before the answers were ready.
        """
        prepared, errors = self._prepare_each(queries)
        good = [(queries[i], p) for i, p in enumerate(prepared) if p is not None]
        answers = iter(self._answer_all([q for q, _ in good], [p for _, p in good], deadline))
        return [errors[i] if i in errors else next(answers) for i in range(len(queries))]

    def _answer_all(
        self, queries: Sequence[Query], prepared: Sequence[_Prepared], deadline: float | None
    ) -> list[Retrieved]:
        """The answers of ``queries`` from their rows (:meth:`_prepare`); no work for none."""
        if not queries:
            return []
        prepared = list(prepared)
        # Rows of the tower call and the searches: the queries, then the previous requests of
        # the reranks that compute their unclicked items, in the order of those reranks.
        previous = [self._previous(p.previous, p.num_unclicked) for p in prepared if p.previous is not None]
        rows = prepared + previous
        features = {name: [r.features[name] for r in rows] for name in self.model.side.event_features}
        check_deadline(deadline, "looking up the histories")
        encoded = self.model.encode([r.known for r in rows], features)  # [B + E, K, d], one call
        check_deadline(deadline, "the user tower call")
        found = self._search(rows, encoded)
        check_deadline(deadline, "the index search")
        unclicked = _unclicked(prepared, found)
        rank_scores = self._rerank(queries, prepared, found, unclicked)
        check_deadline(deadline, "the rerank")
        explanations = self._explain(queries, prepared)
        check_deadline(deadline, "the explanations")
        return [
            self._answer(query, p, found[i], encoded[i], rank_scores.get(i), explanations.get(i))
            for i, (query, p) in enumerate(zip(queries, prepared, strict=True))
        ]

    def validate(self, query: Query) -> None:
        """Refuses ``query`` for what :meth:`retrieve_many` would refuse it without looking its
        ids up: what a query passes before it joins a micro-batch, so that a bad one is refused
        on its own. (A history without a known id is found by the batch's one lookup, and
        refused there alone: :meth:`retrieve_each`.)

        Raises:
            InvalidArgument: an argument out of range, an unknown ranker or category (the
                message says which and why).
        """
        _check(query)
        self._ranker(query.rerank, query.k)
        self._category(query.category)

    def _explain(self, queries: Sequence[Query], prepared: Sequence[_Prepared]) -> dict[int, Explanations]:
        """The explanations of the queries asking for them (one tower call for all), by query."""
        asking = [i for i, query in enumerate(queries) if query.explain]
        if not asking:
            return {}
        rows = [prepared[i] for i in asking]
        features = {name: [r.features[name] for r in rows] for name in self.model.side.event_features}
        explained = explain_histories(
            self.model,
            [queries[i].history for i in asking],
            [r.known for r in rows],
            [r.positions for r in rows if r.positions is not None],
            features,
        )
        return dict(zip(asking, explained, strict=True))

    def _prepare_each(
        self, queries: Sequence[Query]
    ) -> tuple[list[_Prepared | None], dict[int, InvalidArgument]]:
        """Each query validated and in dense ids (:meth:`_prepare`), ``None`` for a bad one, and
        the bad ones' errors by position.

        Raises:
            InvalidArgument: no queries, or more than ``MAX_BATCH``.
        """
        if not queries:
            raise InvalidArgument("the batch is empty: send at least one request")
        if len(queries) > api_types.MAX_BATCH:
            raise InvalidArgument(
                f"the batch has {len(queries)} requests, at most {api_types.MAX_BATCH} are accepted"
            )
        errors: dict[int, InvalidArgument] = {}
        for i, query in enumerate(queries):
            try:
                _check(query)
            except InvalidArgument as e:
                errors[i] = e
        checked = [i for i in range(len(queries)) if i not in errors]
        prepared: list[_Prepared | None] = [None] * len(queries)
        if not checked:
            return prepared, errors
        # One vocabulary lookup for every history of the batch (checked: sized, non-empty).
        lengths = [len(queries[i].history) for i in checked]
        dense = self.model.vocab.lookup([item for i in checked for item in queries[i].history])
        for i, ids in zip(checked, np.split(dense, np.cumsum(lengths)[:-1]), strict=True):
            try:
                prepared[i] = self._prepare(queries[i], ids)
            except InvalidArgument as e:
                errors[i] = e
        return prepared, errors

    def _previous(self, history: np.ndarray, num_unclicked: int) -> _Prepared:
        """The request before a rerank's, for its unclicked items: ``history`` (the known history
        without its last event), that history excluded, no side features, no filter; its first
        ``num_unclicked`` items other than the one clicked at it are wanted."""
        return _Prepared(
            known=history,
            features={name: np.zeros(len(history), np.int32) for name in self.model.side.event_features},
            exclude=np.unique(history).astype(np.int64),
            allow=None,
            search=_PREVIOUS_SEARCH,
            unknown=0,
            ranker=None,
            depth=num_unclicked + 1,  # + the clicked one
        )

    def _search(self, rows: Sequence[_Prepared], encoded: np.ndarray) -> dict[int, _Found]:
        """One index search per group of rows sharing a :data:`_SearchKey`, in the order of their
        first rows.

        Args:
            encoded: float32 ``[len(rows), K, d]`` the rows' interests.

        Returns:
            Per row, its first ``depth`` items: ids, scores and the interest that found each.
        """
        groups: dict[_SearchKey, list[int]] = {}
        for r, p in enumerate(rows):
            groups.setdefault(p.search, []).append(r)
        found: dict[int, _Found] = {}
        for (merge, lam, fetch, _), members in groups.items():
            started = time.perf_counter()
            result = self.search_group(
                encoded[members],
                max(rows[i].depth for i in members),
                [rows[i].exclude for i in members],
                rows[members[0]].allow,
                (merge, lam, fetch),
            )
            if self.observe_search is not None:
                self.observe_search(time.perf_counter() - started)
            for row, i in enumerate(members):
                kept = np.flatnonzero(result.ids[row] >= 0)[: rows[i].depth]
                found[i] = (result.ids[row][kept], result.scores[row][kept], result.interests[row][kept])
        return found

    def search_group(
        self,
        encoded: np.ndarray,
        depth: int,
        exclude: Sequence[np.ndarray],
        allow: np.ndarray | None,
        search: tuple[MergeStrategy, float, int],
    ) -> SearchResult:
        """One index search and merge of rows sharing a search: what :meth:`retrieve_many` runs
        per group of rows, and the native engine's kernel for a row it cannot merge from one
        batched search (:mod:`retrieval.serving.native_kernel`).

        Args:
            encoded: float32 ``[B, K, d]`` the rows' interests.
            depth: items wanted per row.
            exclude: per row, sorted unique int64 dense ids never returned.
            allow: sorted unique int64 dense ids, the only ones returned; ``None`` = every item.
            search: the merge, its diversity λ and each interest's depth (0 = ``depth``).

        Returns:
            ``[B, depth]`` items per row, best first (``index.multi_interest.SearchResult``).
        """
        merge, lam, fetch = search
        return search_interests(
            self.index,
            encoded,
            depth,
            exclude=exclude,
            allow=allow,
            merge=None if merge is MergeStrategy.MAX_SCORE else strategy(merge, self.categories.codes, lam),
            per_interest_k=fetch,
            # DIVERSITY ranks by each item's best score over all interests: score exactly.
            item_vectors=self.model.item_embeddings if merge is MergeStrategy.DIVERSITY else None,
        )

    def _answer(
        self,
        query: Query,
        p: _Prepared,
        found: _Found,
        interests: np.ndarray,
        rank_scores: list[float] | None,
        explanations: Explanations | None,
    ) -> Retrieved:
        """The answer to ``query`` from its items (``found``) and its ``[K, d]`` interests."""
        ids, scores, slots = found
        answer = Retrieved(
            list(zip(self.model.vocab.external(ids), scores.tolist(), slots.tolist(), strict=True)),
            unknown_items=p.unknown,
            model_version=self.model_version,
            interests=interests.copy() if query.return_interests else None,
            rank_scores=rank_scores,
            ranker_version="" if p.ranker is None else p.ranker.version,
            explanations=explanations,
        )
        if query.user_id:
            logger.debug("user %s: %d items", query.user_id, len(ids))
        return answer

    def _rerank(
        self,
        queries: Sequence[Query],
        prepared: Sequence[_Prepared],
        found: dict[int, _Found],
        unclicked: Mapping[int, np.ndarray],
    ) -> dict[int, list[float]]:
        """Scores the candidates of the queries asking for a rerank (one ranker call per ranker)
        and cuts each to its best ``k`` by the ranker's score, in place in ``found``.

        The ranker gets each candidate's retrieval score (``found[i][1]``, what the search
        returned), the candidates in the retrieval order (DSTN's context is the top of it) and,
        when it reads them, query ``i``'s unclicked items ``unclicked[i]`` (none when absent).

        Returns:
            Per reranked query, the ranker's logits of the items kept, best first.
        """
        by_ranker: dict[str, list[int]] = {}
        for i, p in enumerate(prepared):
            if p.ranker is not None:
                by_ranker.setdefault(p.ranker.name, []).append(i)
        out: dict[int, list[float]] = {}
        for name, members in by_ranker.items():
            width = max(1, max(len(found[i][0]) for i in members))
            candidates = np.zeros((len(members), width), np.int64)  # 0 = no item
            scores = np.zeros((len(members), width), np.float32)
            for row, i in enumerate(members):
                candidates[row, : len(found[i][0])] = found[i][0]
                scores[row, : len(found[i][1])] = found[i][1]
            histories = [prepared[i].known for i in members]
            ranker = self.rankers[name]
            shown = None
            if ranker.num_unclicked:
                shown = [unclicked.get(i, np.zeros(0, np.int64)) for i in members]
            logits = ranker.score(histories, candidates, shown, retrieval_scores=scores)
            for row, i in enumerate(members):
                n = len(found[i][0])
                # Best logit first; ties keep the retrieval order (a stable sort).
                order = np.argsort(-logits[row, :n], kind="stable")[: queries[i].k]
                found[i] = tuple(a[order] for a in found[i])  # type: ignore[assignment]
                out[i] = logits[row, order].tolist()
        return out

    def _prepare(self, query: Query, dense: np.ndarray) -> _Prepared:
        """Looks ``query``'s ids up, given its history's (``dense``), once :func:`_check` passed.

        Raises:
            InvalidArgument: as :meth:`_ranker`; no known history id, or an unknown category.
        """
        ranker, depth = self._ranker(query.rerank, query.k)
        history = query.history
        # Items added after training are in the vocabulary, not in the user tower's table.
        is_known = (dense != PAD) & (dense <= self.model.tower_items)
        known = dense[is_known]
        if not len(known):
            added = int((dense != PAD).sum())
            raise InvalidArgument(
                f"none of the {len(history)} history ids is in the model's vocabulary"
                + (f" ({added} added after training, which it does not read as history)" if added else "")
            )
        # Side features come from the whole timeline (a gap is to the previous event, known or
        # not), then follow their items, exactly as in training and evaluation. A feature the
        # request does not carry is unknown (0) at every event.
        timestamps = None if query.timestamps is None else np.asarray(query.timestamps, np.int64)
        now = query.request_time or int(time.time())
        events = encode_events(self.model.side, timestamps, query.actions, request_time=now)
        features = {
            name: values[is_known] if len(values) == len(history) else np.zeros(len(known), np.int32)
            for name, values in events.items()
        }
        exclude = dense[dense != PAD]
        if query.exclude:
            excluded = self.model.vocab.lookup(list(query.exclude))
            exclude = np.concatenate([exclude, excluded[excluded != PAD]])
        allow = self._allowed(query)
        unclicked = previous = None
        if ranker is not None and ranker.num_unclicked and query.rerank is not None:
            if query.rerank.unclicked:  # the caller's impressions replace the computed ones
                shown = self.model.vocab.lookup(list(query.rerank.unclicked))
                unclicked = shown[shown != PAD][: ranker.num_unclicked].astype(np.int64)
            elif len(known) > 1:
                previous = known[:-1]
        # Max-score top-k is a prefix of top-k' (k < k'): any k share a search. The other
        # merges choose among each interest's first candidates, so their depth must match.
        fetch = query.per_interest_k
        if query.merge is not MergeStrategy.MAX_SCORE:
            fetch = max(depth, fetch)
        return _Prepared(
            known=known,
            features=features,
            exclude=np.unique(exclude),  # int64, as vocab lookups are
            allow=allow,
            search=(query.merge, query.diversity_lambda, fetch, (tuple(query.allow), query.category)),
            unknown=len(history) - len(known),
            ranker=ranker,
            depth=depth,
            unclicked=unclicked,
            previous=previous,
            num_unclicked=0 if ranker is None else ranker.num_unclicked,
            positions=np.flatnonzero(is_known) if query.explain else None,
        )

    def _allowed(self, query: Query) -> np.ndarray | None:
        """The dense ids ``query`` may return (sorted unique int64), None = every item.

        Raises:
            InvalidArgument: an unknown category.
        """
        allow = None
        if query.allow:
            allowed = self.model.vocab.lookup(list(query.allow))
            allow = np.unique(allowed[allowed != PAD]).astype(np.int64)
        members = self._category(query.category)
        if members is not None:
            allow = members if allow is None else np.intersect1d(allow, members)
        return allow

    def _category(self, category: str) -> np.ndarray | None:
        """The dense ids of the items of ``category`` (sorted int64); None for no category.

        Raises:
            InvalidArgument: an unknown category.
        """
        if not category:
            return None
        if category not in self.categories.members:
            raise InvalidArgument(f"unknown category {shorten(category)}: no item of the model has it")
        return self.categories.members.ids(category)

    def _ranker(self, rerank: Rerank | None, k: int) -> tuple[LoadedRanker | None, int]:
        """The ranker a query asks for and how many items to retrieve for it.

        Raises:
            InvalidArgument: an unknown ranker, no ranker loaded, or candidates out of range.
        """
        if rerank is None:
            return None, k
        if not self.rankers:
            raise InvalidArgument(
                "rerank asked for, but the server has no ranker (tools/serve.py --ranker DIR)"
            )
        if not rerank.ranker and len(self.rankers) > 1:
            raise InvalidArgument(f"name the ranker to rerank with, one of {sorted(self.rankers)}")
        name = rerank.ranker or next(iter(self.rankers))
        if name not in self.rankers:
            raise InvalidArgument(f"unknown ranker {shorten(name)}; the server has {sorted(self.rankers)}")
        depth = rerank.candidates or max(k, api_types.DEFAULT_RERANK_CANDIDATES)
        if not k <= depth <= api_types.MAX_K:
            raise InvalidArgument(
                f"rerank candidates must be 0 or between k ({k}) and {api_types.MAX_K}, "
                f"got {rerank.candidates}"
            )
        if len(rerank.unclicked) > api_types.MAX_FILTER_IDS:
            raise InvalidArgument(
                f"rerank unclicked has {len(rerank.unclicked)} ids, "
                f"at most {api_types.MAX_FILTER_IDS} are accepted"
            )
        return self.rankers[name], depth


def _unclicked(prepared: Sequence[_Prepared], found: dict[int, _Found]) -> dict[int, np.ndarray]:
    """The unclicked items of each rerank reading them: the request's own or, by training's rule
    (:mod:`retrieval.ranking`), its previous request's retrieved items in their order without the
    item clicked at it (the history's last event), the first ``num_unclicked``.

    Args:
        found: per row, its items; the previous requests' rows (after the queries', in the
            order of their reranks) are taken out.
    """
    unclicked = {}
    row = len(prepared)
    for i, p in enumerate(prepared):
        if p.unclicked is not None:
            unclicked[i] = p.unclicked
        elif p.previous is not None:
            shown = found.pop(row)[0]
            row += 1
            unclicked[i] = shown[(shown > 0) & (shown != p.known[-1])][: p.num_unclicked]
    return unclicked


def check_deadline(deadline: float | None, stage: str) -> None:
    """Raises :class:`DeadlineExceeded` if ``deadline`` (a :func:`time.monotonic` time) passed.

    Raises:
        DeadlineExceeded: the deadline passed; the message names the ``stage`` just done.
    """
    if deadline is not None and (late := time.monotonic() - deadline) > 0:
        raise DeadlineExceeded(f"the deadline passed {late:.3f} s ago, after {stage}; the work stopped")


def _check(query: Query) -> None:
    """Checks the ranges of ``query``'s arguments (the rerank's are :meth:`Retriever._ranker`'s).

    Raises:
        InvalidArgument: the first argument out of range (the message says which and why).
    """
    history, k = query.history, query.k
    if isinstance(k, bool) or not 1 <= k <= api_types.MAX_K:
        raise InvalidArgument(f"k must be between 1 and {api_types.MAX_K}, got {k}")
    if not history:
        raise InvalidArgument("history is empty: send at least one item id")
    if len(history) > api_types.MAX_HISTORY:
        raise InvalidArgument(f"history has {len(history)} ids, at most {api_types.MAX_HISTORY} are accepted")
    for name, values in (("timestamps", query.timestamps), ("actions", query.actions)):
        if values is not None and len(values) != len(history):
            raise InvalidArgument(f"{len(values)} {name} for a history of {len(history)} events")
    lam = query.diversity_lambda
    if not math.isfinite(lam) or lam < 0:
        raise InvalidArgument(f"diversity_lambda must be a finite number >= 0, got {lam}")
    if lam and query.merge is not MergeStrategy.DIVERSITY:
        raise InvalidArgument(f"diversity_lambda is only used by the DIVERSITY merge, not {query.merge.name}")
    if query.per_interest_k and not k <= query.per_interest_k <= api_types.MAX_PER_INTEREST_K:
        raise InvalidArgument(
            f"per_interest_k must be 0 (= k) or between k ({k}) and {api_types.MAX_PER_INTEREST_K}, "
            f"got {query.per_interest_k}"
        )
    for name, ids in (("exclude_ids", query.exclude), ("allow_ids", query.allow)):
        if len(ids) > api_types.MAX_FILTER_IDS:
            raise InvalidArgument(
                f"{name} has {len(ids)} ids, at most {api_types.MAX_FILTER_IDS} are accepted"
            )
    for name, text, limit in (
        ("user_id", query.user_id, api_types.MAX_USER_ID),
        ("category", query.category, api_types.MAX_NAME),
        ("rerank.ranker", "" if query.rerank is None else query.rerank.ranker, api_types.MAX_NAME),
    ):
        if len(text) > limit:
            raise InvalidArgument(f"{name} has {len(text)} characters, at most {limit}")
