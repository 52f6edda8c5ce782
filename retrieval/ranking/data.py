"""Click examples for ranker training and the candidate lists it is evaluated on, built from the
retriever's own candidates (the construction is described in :mod:`retrieval.ranking`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from index import VectorIndex
from index.multi_interest import search_interests
from retrieval.artifacts.model import ModelArtifact, encode_histories, pad_left
from retrieval.artifacts.ranker import (
    AttributeTable,
    context_of,
)
from retrieval.data.interactions import SequenceData
from retrieval.data.splits import leave_one_out
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


@dataclass(frozen=True)
class _Requests:
    """Histories to retrieve for, with what each one's request clicked (0 = nothing known)."""

    users: list[int] = field(default_factory=list)
    histories: list[np.ndarray] = field(default_factory=list)
    clicked: list[int] = field(default_factory=list)

    def add(self, user: int, history: np.ndarray, clicked: int) -> int:
        self.users.append(user)
        self.histories.append(history)
        self.clicked.append(clicked)
        return len(self.users) - 1


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
    rng = np.random.default_rng(config.seed)
    to_model = np.concatenate([[PAD], model.vocab.lookup(list(data.vocab.ids))])
    split = leave_one_out(data)
    num_items = len(model.vocab)

    def known(ids: np.ndarray) -> np.ndarray:
        mapped = to_model[ids]
        return mapped[mapped != PAD]

    train = [known(s) for s in split.train]
    user_items = [np.unique(s) for s in train]
    unclicked_on = config.unclicked == "previous"

    # Every history retrieved for, keyed by (user, history length): the history is a prefix of
    # the user's sequence, so the key names it and a request's previous one is (user, length - 1).
    requests = _Requests()
    keys: dict[tuple[int, int], int] = {}

    def request(user: int, history: np.ndarray, clicked: int) -> int:
        key = (user, len(history))
        if key not in keys:
            keys[key] = requests.add(user, history, clicked)
        return keys[key]

    examples: list[tuple[int, int, int, int]] = []  # (request, user, position, positive)
    for user, s in enumerate(train):
        first = max(1, len(s) - config.positions_per_user)
        if unclicked_on and first > 1:
            request(user, s[: first - 1], int(s[first - 1]))  # only the previous request of `first`
        for t in range(first, len(s)):
            examples.append((request(user, s[:t], int(s[t])), user, t, int(s[t])))
    valid: list[tuple[int, int, int, int]] = []
    for user, target in zip(split.valid_users.tolist(), to_model[split.valid_targets].tolist(), strict=True):
        if target != PAD and len(train[user]):
            valid.append((request(user, train[user], target), user, len(train[user]), target))
    test_rows = np.arange(len(split.test_users))
    if config.max_test_users and config.max_test_users < len(test_rows):
        sample = np.random.default_rng([config.seed, 1]).choice(
            test_rows, config.max_test_users, replace=False
        )
        test_rows = np.sort(sample)
    test: list[tuple[int, int, np.ndarray, int]] = []  # (request, user, history, target)
    for row in test_rows.tolist():
        user, history = int(split.test_users[row]), known(split.test_histories[row])
        if len(history):
            test.append((request(user, history, 0), user, history, int(to_model[split.test_targets[row]])))

    log.info(
        "retrieving top %d for %d histories (%d training and %d validation examples, %d test users)",
        config.candidates, len(requests.users), len(examples), len(valid), len(test),
    )  # fmt: skip
    interests = encode_histories(model, requests.histories)  # [R, K, d], also for the scores
    ids, scores = retrieve(model, index, requests.histories, config.candidates, interests=interests)
    if config.retrieved_positives_only:
        before = len(examples), len(valid)
        examples, valid = _retrieved_only(examples, ids), _retrieved_only(valid, ids)
        log.info(
            "kept the clicks the retriever found: %d of %d training, %d of %d validation",
            len(examples), before[0], len(valid), before[1],
        )  # fmt: skip

    shown = np.zeros((len(requests.users), config.num_unclicked), np.int64)
    if unclicked_on:
        for r, clicked in enumerate(requests.clicked):
            row = ids[r][(ids[r] > 0) & (ids[r] != clicked)][: config.num_unclicked]
            shown[r, config.num_unclicked - len(row) :] = row

    def previous(user: int, length: int) -> np.ndarray:
        r = keys.get((user, length - 1))
        return shown[r] if r is not None and unclicked_on else np.zeros(config.num_unclicked, np.int64)

    popularity = np.bincount(np.concatenate([*train, [0]]).astype(np.int64), minlength=num_items + 1)
    popularity[0] = 0

    def click_examples(
        rows: list[tuple[int, int, int, int]], histories: Callable[[int, int], np.ndarray]
    ) -> ClickExamples:
        negatives = _negatives(rows, ids, user_items, counts, popularity, num_items, rng)
        candidates = np.concatenate(
            [np.array([r[3] for r in rows], np.int64).reshape(-1, 1), negatives], axis=1
        )
        labels = np.zeros(candidates.shape, np.float32)
        labels[:, 0] = 1.0
        # A random order of the real candidates, padding last.
        keys_ = rng.random(candidates.shape)
        keys_[candidates == PAD] = 2.0
        order = np.argsort(keys_, axis=1, kind="stable")
        candidates = np.take_along_axis(candidates, order, axis=1)
        request_rows = np.array([r for r, *_ in rows], np.int64)
        return ClickExamples(
            history=pad_left([histories(u, t) for _, u, t, _ in rows], config.max_len),
            candidates=candidates.astype(np.int32),
            labels=np.take_along_axis(labels, order, axis=1),
            unclicked=np.stack([previous(u, t) for _, u, t, _ in rows]).astype(np.int32)
            if rows
            else np.zeros((0, config.num_unclicked), np.int32),
            users=np.array([u for _, u, _, _ in rows], np.int64),
            positions=np.array([t for _, _, t, _ in rows], np.int64),
            retrieval_scores=interest_scores(interests[request_rows], model.item_embeddings, candidates),
            context=context_of(ids[request_rows], config.context_size + 1),
        )

    train_examples = click_examples(examples, lambda u, t: train[u][:t])
    valid_examples = click_examples(valid, lambda u, t: train[u])
    valid_requests = np.array([r for r, *_ in valid], np.int64)
    valid_lists = CandidateLists(
        histories=tuple(train[u] for _, u, _, _ in valid),
        candidates=ids[valid_requests],
        scores=scores[valid_requests],
        targets=np.array([t for *_, t in valid], np.int64),
        unclicked=tuple(_nonzero(previous(u, t)) for _, u, t, _ in valid),
        users=np.array([u for _, u, _, _ in valid], np.int64),
    )
    test_requests = np.array([r for r, *_ in test], np.int64)
    lists = CandidateLists(
        histories=tuple(h for _, _, h, _ in test),
        candidates=ids[test_requests],
        scores=scores[test_requests],
        targets=np.array([t for *_, t in test], np.int64),
        unclicked=tuple(_nonzero(previous(u, len(h))) for _, u, h, _ in test),
        users=np.array([u for _, u, _, _ in test], np.int64),
    )
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
        train_examples,
        valid_examples,
        lists,
        model.vocab,
        model.version,
        attributes,
        model.item_embeddings,
        settings,
        valid_lists,
    )


_BLOCK = 8192
"""Rows of retrieved candidates handled at once when drawing negatives."""


def _retrieved_only(
    rows: list[tuple[int, int, int, int]], ids: np.ndarray
) -> list[tuple[int, int, int, int]]:
    """The ``(request, user, position, positive)`` rows whose positive the request retrieved."""
    if not rows:
        return rows
    requests = np.array([r[0] for r in rows], np.int64)
    positives = np.array([r[3] for r in rows], np.int64)
    hit = (ids[requests] == positives[:, None]).any(axis=1)
    return [row for row, keep in zip(rows, hit.tolist(), strict=True) if keep]


def _nonzero(ids: np.ndarray) -> np.ndarray:
    return ids[ids != PAD]


def _negatives(
    rows: Sequence[tuple[int, int, int, int]],
    retrieved: np.ndarray,
    user_items: Sequence[np.ndarray],
    counts: Mapping[str, int],
    popularity: np.ndarray,
    num_items: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Negatives ``[E, Σ counts]`` (0 = none left) for ``(request, user, position, positive)`` rows:
    never the positive, never one of the user's items, distinct within a row."""
    total = sum(counts.values())
    out = np.zeros((len(rows), total), np.int64)
    if not rows:
        return out
    excluded = [np.union1d(user_items[u], [positive]) for _, u, _, positive in rows]
    column = 0
    n = counts.get("retrieved", 0)
    if n:
        requests = np.array([r for r, *_ in rows], np.int64)
        for start in range(0, len(rows), _BLOCK):  # blocks of rows bound the [rows, K] temporaries
            pool = retrieved[requests[start : start + _BLOCK]]  # [b, K]
            bad = pool <= 0
            for row, banned in enumerate(excluded[start : start + _BLOCK]):
                bad[row] |= np.isin(pool[row], banned)
            keys = rng.random(pool.shape)
            keys[bad] = 2.0
            order = np.argsort(keys, axis=1, kind="stable")[:, :n]
            chosen = np.take_along_axis(pool, order, axis=1)
            chosen[np.take_along_axis(keys, order, axis=1) >= 2.0] = PAD
            out[start : start + _BLOCK, : chosen.shape[1]] = chosen  # fewer when the pool is smaller
        column = n
    for source in ("uniform", "popularity"):
        n = counts.get(source, 0)
        if not n:
            continue
        weights = None if source == "uniform" else popularity.astype(np.float64)
        for row, banned in enumerate(excluded):
            taken = out[row, :column]
            out[row, column : column + n] = _sample_items(
                rng, n, np.union1d(banned, taken[taken != PAD]), num_items, weights
            )
        column += n
    return out


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
