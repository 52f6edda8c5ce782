"""Click examples for ranker training and the candidate lists it is evaluated on, built from the
retriever's own candidates (the construction is described in :mod:`retrieval.ranking`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from index import VectorIndex
from index.multi_interest import search_interests
from retrieval.artifacts.model import ModelArtifact, encode_histories, pad_left
from retrieval.artifacts.ranker_inputs import AttributeTable, context_of
from retrieval.data.interactions import SequenceData
from retrieval.data.splits import LeaveOneOut, leave_one_out
from retrieval.data.vocab import PAD, ItemVocab
from retrieval.ranking.config import RankerConfig, check_config, negative_counts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClickExamples:
    """Requests with one clicked candidate each.

    Attributes:
        history: int32 ``[E, max_len]`` left-padded dense ids (the items before the click).
        candidates: int32 ``[E, 1 + num_negatives]``, 0 = padding (always last).
        labels: float32 ``[E, 1 + num_negatives]``, 1 for the clicked item.
        unclicked: int32 ``[E, num_unclicked]`` left-padded (all 0 without unclicked items).
        users: int64 ``[E]`` user positions in :attr:`SequenceData.users`.
        positions: int64 ``[E]`` the click's position ``t`` in the user's sequence.
        retrieval_scores: float32 ``[E, 1 + num_negatives]`` the retriever's score of each
            candidate for the request (0 for padding).
        context: int32 ``[E, context_size + 1]`` the request's top retrieved items, best first
            (0-padded).
    """

    history: np.ndarray
    candidates: np.ndarray
    labels: np.ndarray
    unclicked: np.ndarray
    users: np.ndarray
    positions: np.ndarray
    retrieval_scores: np.ndarray
    context: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def inputs(self, unclicked: bool, scores: bool = True, context: bool = False) -> dict[str, np.ndarray]:
        """The ranker inputs (without attributes, added in TensorFlow): ``unclicked``,
        ``retrieval_scores`` and ``context`` only when asked for."""
        x = {"history": self.history, "candidates": self.candidates}
        if unclicked:
            x["unclicked"] = self.unclicked
        if scores:
            x["retrieval_scores"] = self.retrieval_scores
        if context:
            x["context"] = self.context
        return x


@dataclass(frozen=True)
class CandidateLists:
    """The retriever's answer for each test user, to be reranked.

    Attributes:
        histories: per user, dense ids (the whole test history, oldest first).
        candidates: int64 ``[U, N]`` in the retriever's order; -1 = empty slot.
        scores: float32 ``[U, N]`` the retriever's scores (-inf in empty slots).
        targets: int64 ``[U]`` the held-out items (0 = unknown to the model: a miss).
        unclicked: per user, dense ids (see the module docstring).
        users: int64 ``[U]`` user positions.
    """

    histories: tuple[np.ndarray, ...]
    candidates: np.ndarray
    scores: np.ndarray
    targets: np.ndarray
    unclicked: tuple[np.ndarray, ...]
    users: np.ndarray


@dataclass(frozen=True)
class RankingData:
    """Everything a ranker trains and is evaluated on (:func:`build_ranking_data`).

    Attributes:
        item_embeddings: float32 ``[num_items + 1, d]``, the retrieval model's (``item_init``).
        settings: what the examples were built with, and their counts.
        valid_lists: the validation requests' whole retrieved lists (the rows of ``valid``, in
            order), reranked like the test lists to fit the blend with the retrieval score.
    """

    train: ClickExamples
    valid: ClickExamples
    test: CandidateLists
    vocab: ItemVocab
    model_version: str
    attributes: AttributeTable | None
    item_embeddings: np.ndarray
    settings: dict[str, Any]
    valid_lists: CandidateLists | None = None


def retrieve(
    model: ModelArtifact,
    index: VectorIndex,
    histories: Sequence[np.ndarray],
    k: int,
    batch_size: int = 1024,
    interests: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The retriever's top-``k`` for each history, the history excluded (max-score merge over the
    interests, one index search per ``batch_size`` histories).

    Args:
        interests: float32 ``[n, K, d]`` the histories' interests when already encoded.

    Returns:
        ids int64 ``[n, k]`` (-1 = empty) and scores float32 ``[n, k]``, best first.
    """
    ids = np.full((len(histories), k), -1, np.int64)
    scores = np.full((len(histories), k), -np.inf, np.float32)
    for start in range(0, len(histories), batch_size):
        part = histories[start : start + batch_size]
        vectors = (
            encode_histories(model, part) if interests is None else interests[start : start + batch_size]
        )
        found = search_interests(index, vectors, k, exclude=list(part))
        ids[start : start + len(part)], scores[start : start + len(part)] = found.ids, found.scores
        done = min(start + batch_size, len(histories))
        if len(histories) > batch_size and (done == len(histories) or (start // batch_size) % 20 == 19):
            log.info("retrieved for %d / %d histories", done, len(histories))
    return ids, scores


def interest_scores(
    interests: np.ndarray, item_embeddings: np.ndarray, candidates: np.ndarray, block: int = 4096
) -> np.ndarray:
    """The retriever's score of each candidate: the max over the request's interests of the inner
    product with the candidate's item embedding, as :func:`index.multi_interest.search_interests`
    scores (all-zero interests, which the search skips, are skipped here too).

    Args:
        interests: float32 ``[n, K, d]``.
        item_embeddings: float32 ``[num_items + 1, d]``, the vectors the index holds.
        candidates: int ``[n, C]``; ``<= 0`` = padding (score 0).

    Returns:
        float32 ``[n, C]``; 0 for padding and for a request without a non-zero interest.
    """
    out = np.zeros(candidates.shape, np.float32)
    for start in range(0, len(candidates), block):
        ids = candidates[start : start + block]
        queries = interests[start : start + block]  # [b, K, d]
        vectors = item_embeddings[np.maximum(ids, 0)]  # [b, C, d]
        per_interest = np.einsum("bkd,bcd->bck", queries, vectors)  # [b, C, K]
        active = np.any(queries != 0, axis=2)[:, None, :]  # [b, 1, K]
        best = np.max(np.where(active, per_interest, -np.inf), axis=2)
        out[start : start + block] = np.where((ids > 0) & np.isfinite(best), best, 0.0)
    return out


class _Click(NamedTuple):
    """A click to make an example of."""

    request: int  # the row of its history in :class:`_Requests`
    user: int  # position in :attr:`SequenceData.users`
    position: int  # t: the history is the training sequence before t (all of it for validation)
    positive: int  # the dense id clicked


class _ListRequest(NamedTuple):
    """A request whose whole retrieved list is reranked (a test user, or a validation list)."""

    request: int  # the row of its history in :class:`_Requests`
    user: int
    history: np.ndarray  # dense ids, oldest first
    target: int  # the held-out item (0 = unknown to the model)


@dataclass(frozen=True)
class _Requests:
    """Every history retrieved for, once, with what its request clicked (0 = nothing known).

    Keyed by (user, history length): the history is a prefix of the user's sequence, so the key
    names it and a request's previous one is (user, length - 1).
    """

    users: list[int] = field(default_factory=list)
    histories: list[np.ndarray] = field(default_factory=list)
    clicked: list[int] = field(default_factory=list)
    keys: dict[tuple[int, int], int] = field(default_factory=dict)

    def add(self, user: int, history: np.ndarray, clicked: int) -> int:
        """The row of the user's request after ``history`` (added unless already there)."""
        key = (user, len(history))
        if key not in self.keys:
            self.keys[key] = len(self.users)
            self.users.append(user)
            self.histories.append(history)
            self.clicked.append(clicked)
        return self.keys[key]


@dataclass(frozen=True)
class _Logs:
    """The interactions in the model's dense ids, split leave-one-out.

    Attributes:
        to_model: int ``[data items + 1]`` the data's dense id -> the model's (PAD = unknown).
        train: per user, the training sequence's items the model knows.
    """

    to_model: np.ndarray
    split: LeaveOneOut
    train: list[np.ndarray]

    @classmethod
    def of(cls, model: ModelArtifact, data: SequenceData) -> _Logs:
        to_model = np.concatenate([[PAD], model.vocab.lookup(list(data.vocab.ids))])
        split = leave_one_out(data)
        mapped = [to_model[s] for s in split.train]
        return cls(to_model, split, [m[m != PAD] for m in mapped])

    def known(self, ids: np.ndarray) -> np.ndarray:
        """The data's dense ``ids`` in the model's, those it does not know dropped."""
        mapped = self.to_model[ids]
        return mapped[mapped != PAD]


@dataclass(frozen=True)
class _Retrieved:
    """The retriever's answer to every request (the rows of :class:`_Requests`).

    Attributes:
        interests: float32 ``[R, K, d]``; item_embeddings: float32 ``[num_items + 1, d]``.
        ids: int64 ``[R, candidates]`` (-1 = empty); scores: float32 ``[R, candidates]``.
        shown: int64 ``[R, num_unclicked]`` left-padded, what each request shows its next one as
            unclicked (all 0 without unclicked items).
        keys: the requests' rows by (user, history length).
    """

    interests: np.ndarray
    item_embeddings: np.ndarray
    ids: np.ndarray
    scores: np.ndarray
    shown: np.ndarray
    keys: Mapping[tuple[int, int], int]

    def unclicked(self, user: int, length: int) -> np.ndarray:
        """int64 ``[num_unclicked]`` the unclicked items of the request after ``length`` events."""
        r = self.keys.get((user, length - 1))
        return self.shown[r] if r is not None else np.zeros(self.shown.shape[1], np.int64)


def build_ranking_data(
    model: ModelArtifact, index: VectorIndex, data: SequenceData, config: RankerConfig
) -> RankingData:
    """Click examples (training, validation) and test candidate lists from the logs and a retriever.

    Args:
        model: the retrieval model (its vocabulary gives the dense ids; items of ``data`` it does
            not know are dropped from histories, examples with an unknown positive skipped).
        index: the model's index, searched for ``retrieved`` negatives, unclicked items and the
            test candidates.
        data: the interactions (the same the retriever was trained on).
        config: see :class:`RankerConfig`.
    """
    check_config(config)
    counts = negative_counts(config)
    logs = _Logs.of(model, data)
    requests = _Requests()
    clicks = _train_clicks(logs.train, requests, config)
    valid = _valid_clicks(logs, requests)
    test = _test_requests(logs, requests, config)
    log.info(
        "retrieving top %d for %d histories (%d training and %d validation examples, %d test users)",
        config.candidates, len(requests.users), len(clicks), len(valid), len(test),
    )  # fmt: skip
    found = _retrieve_requests(model, index, requests, config)
    if config.retrieved_positives_only:
        clicks, valid = _keep_retrieved(clicks, valid, found.ids)
    # One generator for every draw: the training examples', then the validation ones'.
    sampler = _Sampler.of(logs.train, counts, len(model.vocab), config.seed)
    train_examples = _click_examples(clicks, logs.train, found, sampler, config)
    valid_examples = _click_examples(valid, logs.train, found, sampler, config)
    valid_lists = [_ListRequest(c.request, c.user, logs.train[c.user], c.positive) for c in valid]
    lists = _candidate_lists(test, found)
    attributes = AttributeTable.from_model(model) if config.attributes else None
    settings = {
        "negatives": counts,
        "train_examples": len(train_examples),
        "valid_examples": len(valid_examples),
        "test_users": len(lists.targets),
        "candidates": config.candidates,
        "unclicked": config.unclicked,
        "context_size": config.context_size,
        "retrieved_positives_only": config.retrieved_positives_only,
        "num_attributes": 0 if attributes is None else attributes.num_attributes,
    }
    return RankingData(
        train_examples, valid_examples, lists, model.vocab, model.version, attributes,
        model.item_embeddings, settings, _candidate_lists(valid_lists, found),
    )  # fmt: skip


def _train_clicks(train: Sequence[np.ndarray], requests: _Requests, config: RankerConfig) -> list[_Click]:
    """The last ``positions_per_user`` clicks of every training sequence, their histories added
    to ``requests`` (with, for unclicked items, the request before the first of them)."""
    clicks = []
    for user, s in enumerate(train):
        first = max(1, len(s) - config.positions_per_user)
        if config.unclicked == "previous" and first > 1:
            requests.add(user, s[: first - 1], int(s[first - 1]))  # only the previous request of `first`
        for t in range(first, len(s)):
            clicks.append(_Click(requests.add(user, s[:t], int(s[t])), user, t, int(s[t])))
    return clicks


def _valid_clicks(logs: _Logs, requests: _Requests) -> list[_Click]:
    """The validation clicks the model knows (history: the whole training sequence, not empty)."""
    split, clicks = logs.split, []
    for user, target in zip(
        split.valid_users.tolist(), logs.to_model[split.valid_targets].tolist(), strict=True
    ):
        history = logs.train[user]
        if target != PAD and len(history):
            clicks.append(_Click(requests.add(user, history, target), user, len(history), target))
    return clicks


def _test_requests(logs: _Logs, requests: _Requests, config: RankerConfig) -> list[_ListRequest]:
    """The test users with a known history (a seeded sample of ``max_test_users`` when set)."""
    split = logs.split
    rows = np.arange(len(split.test_users))
    if config.max_test_users and config.max_test_users < len(rows):
        sample = np.random.default_rng([config.seed, 1]).choice(rows, config.max_test_users, replace=False)
        rows = np.sort(sample)
    test = []
    for row in rows.tolist():
        user, history = int(split.test_users[row]), logs.known(split.test_histories[row])
        if len(history):
            target = int(logs.to_model[split.test_targets[row]])
            test.append(_ListRequest(requests.add(user, history, 0), user, history, target))
    return test


def _retrieve_requests(
    model: ModelArtifact, index: VectorIndex, requests: _Requests, config: RankerConfig
) -> _Retrieved:
    """The top ``candidates`` of every request and, with ``unclicked="previous"``, the first
    ``num_unclicked`` of them other than the item clicked at it (what its next request was shown)."""
    interests = encode_histories(model, requests.histories)  # [R, K, d], also for the scores
    ids, scores = retrieve(model, index, requests.histories, config.candidates, interests=interests)
    n = config.num_unclicked
    shown = np.zeros((len(requests.users), n), np.int64)
    if config.unclicked == "previous":
        for r, clicked in enumerate(requests.clicked):
            row = ids[r][(ids[r] > 0) & (ids[r] != clicked)][:n]
            shown[r, n - len(row) :] = row
    return _Retrieved(interests, model.item_embeddings, ids, scores, shown, requests.keys)


def _keep_retrieved(
    clicks: list[_Click], valid: list[_Click], ids: np.ndarray
) -> tuple[list[_Click], list[_Click]]:
    """The training and validation clicks whose positive their request retrieved."""
    kept = _retrieved_only(clicks, ids), _retrieved_only(valid, ids)
    log.info(
        "kept the clicks the retriever found: %d of %d training, %d of %d validation",
        len(kept[0]), len(clicks), len(kept[1]), len(valid),
    )  # fmt: skip
    return kept


def _retrieved_only(clicks: list[_Click], ids: np.ndarray) -> list[_Click]:
    """The clicks whose positive their request retrieved."""
    if not clicks:
        return clicks
    requests = np.array([c.request for c in clicks], np.int64)
    positives = np.array([c.positive for c in clicks], np.int64)
    hit = (ids[requests] == positives[:, None]).any(axis=1)
    return [click for click, keep in zip(clicks, hit.tolist(), strict=True) if keep]


def _click_examples(
    clicks: list[_Click],
    train: Sequence[np.ndarray],
    found: _Retrieved,
    sampler: _Sampler,
    config: RankerConfig,
) -> ClickExamples:
    """The examples of ``clicks``: the history before the click, the click and its negatives in a
    random order (padding last), the retriever's scores and context (:class:`ClickExamples`)."""
    negatives = sampler.negatives(clicks, found.ids)
    positives = np.array([c.positive for c in clicks], np.int64).reshape(-1, 1)
    candidates = np.concatenate([positives, negatives], axis=1)
    labels = np.zeros(candidates.shape, np.float32)
    labels[:, 0] = 1.0
    order = sampler.order(candidates)
    candidates = np.take_along_axis(candidates, order, axis=1)
    rows = np.array([c.request for c in clicks], np.int64)
    unclicked = np.zeros((0, config.num_unclicked), np.int32)
    if clicks:
        unclicked = np.stack([found.unclicked(c.user, c.position) for c in clicks]).astype(np.int32)
    return ClickExamples(
        history=pad_left([train[c.user][: c.position] for c in clicks], config.max_len),
        candidates=candidates.astype(np.int32),
        labels=np.take_along_axis(labels, order, axis=1),
        unclicked=unclicked,
        users=np.array([c.user for c in clicks], np.int64),
        positions=np.array([c.position for c in clicks], np.int64),
        retrieval_scores=interest_scores(found.interests[rows], found.item_embeddings, candidates),
        context=context_of(found.ids[rows], config.context_size + 1),
    )


def _candidate_lists(rows: Sequence[_ListRequest], found: _Retrieved) -> CandidateLists:
    """The retrieved lists of ``rows``, to rerank (:class:`CandidateLists`)."""
    requests = np.array([r.request for r in rows], np.int64)
    return CandidateLists(
        histories=tuple(r.history for r in rows),
        candidates=found.ids[requests],
        scores=found.scores[requests],
        targets=np.array([r.target for r in rows], np.int64),
        unclicked=tuple(_nonzero(found.unclicked(r.user, len(r.history))) for r in rows),
        users=np.array([r.user for r in rows], np.int64),
    )


def _nonzero(ids: np.ndarray) -> np.ndarray:
    return ids[ids != PAD]


_BLOCK = 8192
"""Rows of retrieved candidates handled at once when drawing negatives."""


@dataclass(frozen=True)
class _Sampler:
    """The seeded draws of the click examples: their negatives and their candidates' order.

    Attributes:
        user_items: per user, the items of the training sequence (never a negative).
        counts: negatives per source (:func:`~retrieval.ranking.config.negative_counts`).
        popularity: int64 ``[num_items + 1]`` events per item in the training sequences.
        rng: every draw, in the order the examples are built.
    """

    user_items: list[np.ndarray]
    counts: Mapping[str, int]
    popularity: np.ndarray
    num_items: int
    rng: np.random.Generator

    @classmethod
    def of(
        cls, train: Sequence[np.ndarray], counts: Mapping[str, int], num_items: int, seed: int
    ) -> _Sampler:
        popularity = np.bincount(np.concatenate([*train, [0]]).astype(np.int64), minlength=num_items + 1)
        popularity[0] = 0
        return cls([np.unique(s) for s in train], counts, popularity, num_items, np.random.default_rng(seed))

    def order(self, candidates: np.ndarray) -> np.ndarray:
        """int ``[E, C]``: a random order of each row's real candidates, padding (0) last."""
        keys = self.rng.random(candidates.shape)
        keys[candidates == PAD] = 2.0
        return np.argsort(keys, axis=1, kind="stable")

    def negatives(self, clicks: Sequence[_Click], retrieved: np.ndarray) -> np.ndarray:
        """Negatives ``[E, Σ counts]`` (0 = none left), the ``retrieved`` ones first: never the
        positive, never one of the user's items, distinct within a row.

        Args:
            retrieved: int64 ``[R, candidates]`` each request's retrieved items (-1 = empty).
        """
        out = np.zeros((len(clicks), sum(self.counts.values())), np.int64)
        if not clicks:
            return out
        excluded = [np.union1d(self.user_items[c.user], [c.positive]) for c in clicks]
        column = self.counts.get("retrieved", 0)
        if column:
            requests = np.array([c.request for c in clicks], np.int64)
            self._from_retrieved(out[:, :column], retrieved, requests, excluded)
        for source in ("uniform", "popularity"):
            n = self.counts.get(source, 0)
            if n:
                weights = None if source == "uniform" else self.popularity.astype(np.float64)
                for row, banned in enumerate(excluded):
                    taken = out[row, :column]
                    avoid = np.union1d(banned, taken[taken != PAD])
                    out[row, column : column + n] = _sample_items(self.rng, n, avoid, self.num_items, weights)
                column += n
        return out

    def _from_retrieved(
        self, out: np.ndarray, retrieved: np.ndarray, requests: np.ndarray, excluded: Sequence[np.ndarray]
    ) -> None:
        """Fills ``out`` ``[E, n]`` with distinct items drawn uniformly from each request's
        retrieved ones, none ``excluded`` (0 when the pool runs out)."""
        n = out.shape[1]
        for start in range(0, len(out), _BLOCK):  # blocks of rows bound the [rows, K] temporaries
            pool = retrieved[requests[start : start + _BLOCK]]  # [b, K]
            bad = pool <= 0
            for row, banned in enumerate(excluded[start : start + _BLOCK]):
                bad[row] |= np.isin(pool[row], banned)
            keys = self.rng.random(pool.shape)
            keys[bad] = 2.0
            order = np.argsort(keys, axis=1, kind="stable")[:, :n]
            chosen = np.take_along_axis(pool, order, axis=1)
            chosen[np.take_along_axis(keys, order, axis=1) >= 2.0] = PAD
            out[start : start + _BLOCK, : chosen.shape[1]] = chosen  # fewer when the pool is smaller


def _sample_items(
    rng: np.random.Generator, n: int, banned: np.ndarray, num_items: int, weights: np.ndarray | None
) -> np.ndarray:
    """``n`` distinct ids in ``1..num_items`` not in ``banned`` (sorted), drawn uniformly or
    proportionally to ``weights`` ``[num_items + 1]``; 0-padded when fewer are allowed.

    Rejection sampling against the whole catalogue (cheap when the user holds few items); rows it
    cannot fill in a few rounds are completed uniformly from the items left (with a non-zero weight).
    """
    chosen: list[int] = []
    seen = set(banned.tolist())
    cdf = None
    if weights is not None:
        cdf = np.cumsum(weights[1:]) / max(weights[1:].sum(), 1e-12)
    for _ in range(4):
        draws = (
            rng.integers(1, num_items + 1, 2 * n)
            if cdf is None
            else np.minimum(np.searchsorted(cdf, rng.random(2 * n), side="right"), num_items - 1) + 1
        )
        for item in draws.tolist():
            if item not in seen:
                seen.add(item)
                chosen.append(item)
                if len(chosen) == n:
                    return np.array(chosen, np.int64)
    left = np.setdiff1d(np.arange(1, num_items + 1), np.fromiter(seen, np.int64, len(seen)))
    if weights is not None:
        left = left[weights[left] > 0]  # never an item the popularity sampler cannot draw
    chosen += rng.permutation(left)[: n - len(chosen)].tolist()
    return np.pad(np.array(chosen, np.int64), (0, n - len(chosen)))
