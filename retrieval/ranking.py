"""Pre-ranking on top of retrieval: click examples from the logs, ranker training, reranking evaluation.

The rankers of :mod:`rankers` are trained on the same logs, split the same way, as the retriever
(:func:`retrieval.data.leave_one_out` of the same data), in the retriever's dense item ids.

**Click examples.** For a user's leave-one-out training sequence ``s`` and a position ``t >= 1``,
one example is one request: the history ``s[:t]`` (the items before ``t``, nothing at or after
it; the last ``max_len`` are read) and the candidates ``s[t]`` (label 1) plus
``num_negatives`` items (label 0), in a random order, 0-padded when too few negatives exist.
Only the last ``positions_per_user`` positions of each user are used, which bounds the retrieval
work below (one search per example) and keeps the examples close to the held-out ones.

**Negatives** (``negatives``, sources joined by ``+`` share ``num_negatives`` evenly):

* ``retrieved`` (default): drawn uniformly from the top-``candidates`` items the retriever
  returns for that very history ("retrieved but not chosen"), the distribution the ranker
  reorders at serving time;
* ``uniform``: uniform over the catalogue;
* ``popularity``: proportional to the item's count in the training sequences.

With ``retrieved_positives_only`` (the default) an example is kept only when its click is among
the retriever's top ``candidates`` for that history: the lists the ranker learns from are then
the lists it reorders at serving time (where a click the retriever missed cannot be reranked).
Without it, every negative is an item the retriever likes and many positives are items it does
not, so a ranker learns to push down what the retriever ranks high.

Every negative is distinct within its example and is never the positive nor any item of the
user's training sequence (neither the history nor a later click, which would be a wrong
label); the held-out validation and test items are not looked at. Draws are seeded (``seed``).

**Validation** (early stopping) uses the same construction for the leave-one-out validation
target: history = the whole training sequence, candidates = the validation item + negatives;
the monitored metric is the validation GAUC (``patience`` epochs without improvement stop
training; the best epoch's weights are kept).

**Item vectors**: by default (``item_init="retriever"``) a ranker's item table starts from the
retrieval model's item embeddings, learnt from every training event; the ranker itself sees
only a few clicks per user.

**Item attributes**: when the retrieval model's folder has ``item_attributes.json`` (and
``attributes`` is on), each item's attributes become ids (:class:`AttributeTable`) that the
rankers read as ``history_attributes`` / ``candidate_attributes``.

**Unclicked items** (DSTN only, ``unclicked="previous"``): the logs hold clicks, not impressions,
so "shown but not clicked" is simulated as the first ``num_unclicked`` items the retriever
returned for the user's *previous* request (the history one event shorter) minus the item
clicked at that request. It is a function of the history alone (no later event), built the same
way for training, validation and test (whose previous request is the validation one).
``unclicked="none"`` feeds none. (DSTN's other auxiliary set, the request's other candidates, holds
``num_negatives`` items in training but ``candidates`` in evaluation: its un-normalised sum over
them sees longer lists at test time.)

**Evaluation** (:func:`evaluate_reranking`), the full pipeline on the leave-one-out test users:
the retriever returns its top ``candidates`` (default 200) for the test history (history
excluded, as in ``tools/evaluate.py --index``); the retriever's own order gives the
retrieval-only NDCG@10 / HR@10, and each ranker reorders the same list (ties keep the
retriever's order). A user whose target was not retrieved has no positive: NDCG and HR count 0
for them in every row, so all rows are over the same users and comparable. AUC pools every
(candidate, label) pair of all test users; GAUC is the mean of the per-user AUC weighted by the
user's number of candidates (impressions), over the users whose list holds the target and at
least one other item (``gauc_users``).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import time
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from index import VectorIndex
from rankers import Ranker, build_ranker, ranker_class, ranker_names
from retrieval.data import SequenceData, build_sequences, leave_one_out, load_interactions
from retrieval.evaluate import encode_histories
from retrieval.metrics import ranking_metrics
from retrieval.model_artifact import ModelArtifact, pad_left
from retrieval.ranker_artifact import (
    UNCLICKED_RANKERS,
    AttributeTable,
    RankerScorer,
    save_ranker,
    with_attributes,
)
from retrieval.retriever import Retriever
from retrieval.search import search_interests
from retrieval.vocab import PAD, ItemVocab

log = logging.getLogger(__name__)

NEGATIVE_SOURCES = ("retrieved", "uniform", "popularity")
UNCLICKED_MODES = ("previous", "none")
ITEM_INITS = ("retriever", "random")
KS = (10,)
"""Cut-offs of the reranking metrics."""


@dataclass(frozen=True)
class RankerConfig:
    """A ranker, its click examples and its training loop (see the module docstring).

    ``max_len`` is the history a ranker reads, the most recent events (20 by default: the cost
    of DIN's activation unit and of DIEN's per-candidate AUGRU grows with it, measured 2× and 4×
    per training step from 20 to 50, and Amazon Beauty's sequences average 8.9 events).
    ``item_init="retriever"`` starts the ranker's item table from the retrieval model's item
    embeddings (``"random"``: Keras' initialiser); ``dim`` 0 = the retrieval model's dimension
    (required by ``retriever``). ``options`` are extra constructor arguments of the ranker
    (``hidden_units``, ``activation``, ``aux_weight``...; see :mod:`rankers`). ``candidates`` is
    the retrieval depth: the pool of ``retrieved`` negatives and the list reranked in evaluation.
    ``retrieved_positives_only`` keeps only the examples whose click is among the retriever's
    top ``candidates`` for that history (training and validation).
    ``max_test_users`` > 0 evaluates a seeded sample of that many test users (0 = all).
    """

    ranker: str = "din"
    dim: int = 0
    item_init: str = "retriever"
    max_len: int = 20
    attributes: bool = True
    options: dict[str, Any] = field(default_factory=dict)
    negatives: str = "retrieved"
    num_negatives: int = 20
    retrieved_positives_only: bool = True
    positions_per_user: int = 10
    candidates: int = 200
    unclicked: str = "previous"
    num_unclicked: int = 20
    epochs: int = 10
    batch_size: int = 256
    learning_rate: float = 1e-3
    patience: int = 2
    seed: int = 42
    max_test_users: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def negative_counts(config: RankerConfig) -> dict[str, int]:
    """Negatives per source, ``num_negatives`` shared evenly (the first sources take the remainder).

    Raises:
        ValueError: an unknown or repeated source, or fewer negatives than sources.
    """
    sources = [s.strip() for s in config.negatives.split("+")]
    unknown = [s for s in sources if s not in NEGATIVE_SOURCES]
    if unknown or len(set(sources)) != len(sources):
        raise ValueError(
            f"negatives {config.negatives!r}: expected sources from {NEGATIVE_SOURCES} joined by '+'"
        )
    if config.num_negatives < len(sources):
        raise ValueError(f"num_negatives ({config.num_negatives}) must be at least one per source")
    base, extra = divmod(config.num_negatives, len(sources))
    return {s: base + (i < extra) for i, s in enumerate(sources)}


def check_config(config: RankerConfig) -> None:
    """Raises ``ValueError`` for a configuration that cannot be trained."""
    if config.ranker not in ranker_names():
        raise ValueError(f"unknown ranker {config.ranker!r}; choose one of {ranker_names()}")
    negative_counts(config)
    if config.item_init not in ITEM_INITS:
        raise ValueError(f"item_init must be one of {ITEM_INITS}, got {config.item_init!r}")
    if config.unclicked not in UNCLICKED_MODES:
        raise ValueError(f"unclicked must be one of {UNCLICKED_MODES}, got {config.unclicked!r}")
    if config.candidates < max(KS):
        raise ValueError(f"candidates must be at least {max(KS)} (NDCG@{max(KS)}), got {config.candidates}")
    for name in ("max_len", "positions_per_user", "epochs", "batch_size", "num_unclicked"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)}")
    if config.dim < 0 or config.patience < 0 or config.max_test_users < 0 or config.learning_rate <= 0:
        raise ValueError("dim, patience and max_test_users must be >= 0, learning_rate > 0")


def apply_ranker_overrides(config: RankerConfig, overrides: Iterable[str]) -> RankerConfig:
    """``field=value`` overrides (typed by the field), and ``options.NAME=JSON`` for the ranker's
    constructor arguments (a value that is not JSON is taken as text).

    Example:
        >>> apply_ranker_overrides(RankerConfig(), ["epochs=3", "options.hidden_units=[64, 32]"]).options
        {'hidden_units': [64, 32]}

    Raises:
        ValueError: not ``key=value``, an unknown field, or a value of the wrong type.
    """
    hints = typing.get_type_hints(RankerConfig)
    for item in overrides:
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key:
            raise ValueError(f"override {item!r} is not of the form field=value")
        if key.startswith("options.") and len(key) > len("options."):
            try:
                value: Any = json.loads(raw)
            except json.JSONDecodeError:
                value = raw
            config = dataclasses.replace(config, options={**config.options, key[len("options.") :]: value})
            continue
        if key not in hints or key == "options":
            fields = sorted(k for k in hints if k != "options")
            raise ValueError(f"unknown ranker setting {key!r}; choose from {fields} or options.NAME")
        kind = hints[key]
        if kind is bool:
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{key}: expected true/false, got {raw!r}")
            value = raw.lower() in ("true", "1")
        else:
            try:
                value = kind(raw)
            except ValueError:
                raise ValueError(f"{key}: expected {kind.__name__}, got {raw!r}") from None
        config = dataclasses.replace(config, **{key: value})
    return config


# --------------------------------------------------------------------------- data


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
    """

    history: np.ndarray
    candidates: np.ndarray
    labels: np.ndarray
    unclicked: np.ndarray
    users: np.ndarray
    positions: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def inputs(self, unclicked: bool) -> dict[str, np.ndarray]:
        """The ranker inputs (without attributes, added in TensorFlow)."""
        x = {"history": self.history, "candidates": self.candidates}
        if unclicked:
            x["unclicked"] = self.unclicked
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
    """

    train: ClickExamples
    valid: ClickExamples
    test: CandidateLists
    vocab: ItemVocab
    model_version: str
    attributes: AttributeTable | None
    item_embeddings: np.ndarray
    settings: dict[str, Any]


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
    model: ModelArtifact, index: VectorIndex, histories: Sequence[np.ndarray], k: int, batch_size: int = 1024
) -> tuple[np.ndarray, np.ndarray]:
    """The retriever's top-``k`` for each history, the history excluded (max-score merge over the
    interests, one index search per ``batch_size`` histories).

    Returns:
        ids int64 ``[n, k]`` (-1 = empty) and scores float32 ``[n, k]``, best first.
    """
    ids = np.full((len(histories), k), -1, np.int64)
    scores = np.full((len(histories), k), -np.inf, np.float32)
    for start in range(0, len(histories), batch_size):
        part = histories[start : start + batch_size]
        interests = encode_histories(model, part)
        found = search_interests(index, interests, k, exclude=list(part))
        ids[start : start + len(part)], scores[start : start + len(part)] = found.ids, found.scores
        done = min(start + batch_size, len(histories))
        if len(histories) > batch_size and (done == len(histories) or (start // batch_size) % 20 == 19):
            log.info("retrieved for %d / %d histories", done, len(histories))
    return ids, scores


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
    ids, scores = retrieve(model, index, requests.histories, config.candidates)
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
        return ClickExamples(
            history=pad_left([histories(u, t) for _, u, t, _ in rows], config.max_len),
            candidates=np.take_along_axis(candidates, order, axis=1).astype(np.int32),
            labels=np.take_along_axis(labels, order, axis=1),
            unclicked=np.stack([previous(u, t) for _, u, t, _ in rows]).astype(np.int32)
            if rows
            else np.zeros((0, config.num_unclicked), np.int32),
            users=np.array([u for _, u, _, _ in rows], np.int64),
            positions=np.array([t for _, _, t, _ in rows], np.int64),
        )

    train_examples = click_examples(examples, lambda u, t: train[u][:t])
    valid_examples = click_examples(valid, lambda u, t: train[u])
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
            out[start : start + _BLOCK, :n] = chosen
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


# --------------------------------------------------------------------------- metrics


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve: ``P(score of a positive > score of a negative)``, ties counting ½.

    Computed from average ranks (Mann-Whitney U), ``O(n log n)``.

    Args:
        scores: float ``[n]`` (any shape, flattened).
        labels: bool or 0/1 ``[n]``.

    Returns:
        The AUC, or NaN without positives or without negatives.
    """
    s = np.asarray(scores, np.float64).ravel()
    y = np.asarray(labels).ravel().astype(bool)
    positives = int(y.sum())
    negatives = len(y) - positives
    if not positives or not negatives:
        return float("nan")
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = (ends - (counts - 1) / 2.0)[inverse]  # 1-based average rank of each score
    return float((ranks[y].sum() - positives * (positives + 1) / 2.0) / (positives * negatives))


def per_user_auc(
    scores: np.ndarray, labels: np.ndarray, valid: np.ndarray | None = None, cells: int = 2_000_000
) -> np.ndarray:
    """Each row's AUC over its valid entries, float64 ``[U]`` (NaN without a positive or a negative).

    Args:
        scores: float ``[U, N]``; labels: bool ``[U, N]``; valid: bool ``[U, N]`` (default all).
        cells: pairwise comparisons made at once (memory bound).
    """
    s = np.asarray(scores, np.float64)
    y = np.asarray(labels).astype(bool)
    ok = np.ones(s.shape, bool) if valid is None else np.asarray(valid, bool)
    s = np.where(ok, s, 0.0)  # -inf in invalid slots would make NaN in comparisons
    pos, neg = y & ok, ~y & ok
    out = np.full(len(s), np.nan)
    n_pos, n_neg = pos.sum(axis=1), neg.sum(axis=1)
    # One positive (a click list): count the negatives below it, O(N) per row.
    single = np.flatnonzero((n_pos == 1) & (n_neg > 0))
    if len(single):
        target = s[single, np.argmax(pos[single], axis=1)][:, None]
        below = ((s[single] < target) & neg[single]).sum(axis=1)
        ties = ((s[single] == target) & neg[single]).sum(axis=1)
        out[single] = (below + 0.5 * ties) / n_neg[single]
    # Several positives: every (positive, negative) pair, a few rows at a time.
    several = np.flatnonzero((n_pos > 1) & (n_neg > 0))
    step = max(1, cells // max(s.shape[1] ** 2, 1))
    for start in range(0, len(several), step):
        rows = several[start : start + step]
        a, b = s[rows, :, None], s[rows, None, :]  # positive i against negative j
        pairs = pos[rows, :, None] & neg[rows, None, :]
        wins = ((a > b) + 0.5 * (a == b)) * pairs
        out[rows] = wins.sum(axis=(1, 2)) / pairs.sum(axis=(1, 2))
    return out


def gauc(scores: np.ndarray, labels: np.ndarray, valid: np.ndarray | None = None) -> tuple[float, int]:
    """Group AUC: the per-user AUC averaged with the user's number of valid candidates
    (impressions) as weight, over the users with at least one positive and one negative.

    Returns:
        (GAUC, users counted); NaN and 0 when no user counts.
    """
    per_user = per_user_auc(scores, labels, valid)
    weights = (np.ones(np.shape(scores), bool) if valid is None else np.asarray(valid, bool)).sum(axis=1)
    counted = ~np.isnan(per_user)
    if not counted.any():
        return float("nan"), 0
    return float(np.average(per_user[counted], weights=weights[counted])), int(counted.sum())


ScoreFn = Callable[[Sequence[np.ndarray], np.ndarray, Sequence[np.ndarray] | None], np.ndarray]
"""``(histories, candidates [U, N] (0 = none), unclicked) -> float [U, N]``, e.g.
:meth:`~retrieval.ranker_artifact.RankerScorer.score`."""


def list_metrics(
    candidates: np.ndarray, scores: np.ndarray, targets: np.ndarray, ks: Sequence[int] = KS
) -> dict[str, float]:
    """NDCG@k, HR@k (:func:`~retrieval.metrics.ranking_metrics`) of the lists ordered by ``scores``
    (a stable sort: ties keep the given order), AUC and GAUC of the scores.

    Args:
        candidates: int ``[U, N]``, ``<= 0`` = empty slot (never ranked, not an impression).
        scores: float ``[U, N]``.
        targets: int ``[U]``; a user whose target is not in its list scores 0 in NDCG and HR.
    """
    present = candidates > 0
    masked = np.where(present, np.asarray(scores, np.float64), -np.inf)
    order = np.argsort(-masked, axis=1, kind="stable")
    ranked = np.where(
        np.take_along_axis(present, order, axis=1), np.take_along_axis(candidates, order, axis=1), -1
    )
    labels = present & (candidates == np.asarray(targets)[:, None])
    found = ranking_metrics(ranked, targets, ks)
    out = {name: found[name] for k in ks for name in (f"ndcg@{k}", f"hr@{k}")}
    group, users = gauc(masked, labels, present)
    out.update(auc=auc(masked[present], labels[present]), gauc=group, gauc_users=users)
    return out


def evaluate_reranking(
    lists: CandidateLists, scorers: Mapping[str, ScoreFn], ks: Sequence[int] = KS
) -> dict[str, Any]:
    """Retrieval-only metrics of the lists and, per scorer, the metrics after reranking them.

    Returns:
        ``{"users", "candidates", "candidate_recall" (share of users whose target was retrieved),
        "retrieval": {ndcg@k, hr@k, auc, gauc, gauc_users}, "rerankers": {name: {..., "score_seconds"}}}``.
    """
    present = lists.candidates > 0
    hit = (present & (lists.candidates == lists.targets[:, None])).any(axis=1)
    out: dict[str, Any] = {
        "users": len(lists.targets),
        "candidates": int(lists.candidates.shape[1]),
        "candidate_recall": float(hit.mean()) if len(hit) else 0.0,
        "retrieval": list_metrics(lists.candidates, lists.scores, lists.targets, ks),
        "rerankers": {},
    }
    for name, score in scorers.items():
        started = time.perf_counter()
        values = score(lists.histories, np.where(present, lists.candidates, PAD), lists.unclicked)
        seconds = time.perf_counter() - started
        out["rerankers"][name] = {
            **list_metrics(lists.candidates, values, lists.targets, ks),
            "score_seconds": round(seconds, 3),
        }
    return out


# --------------------------------------------------------------------------- training


class _Validation(keras.callbacks.Callback):
    """Validation AUC / GAUC after every epoch, the best weights kept, early stopping on GAUC."""

    def __init__(
        self, dataset: tf.data.Dataset | None, examples: ClickExamples, patience: int, name: str
    ) -> None:
        super().__init__()
        self.dataset, self.examples, self.patience, self.name = dataset, examples, patience, name
        self.history: list[dict[str, Any]] = []
        self.best: float = -np.inf
        self.best_epoch = 0
        self.best_weights: list[np.ndarray] | None = None
        self.wait = 0
        self.started = time.perf_counter()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        record: dict[str, Any] = {"epoch": epoch + 1, "loss": float((logs or {}).get("loss", np.nan))}
        if self.dataset is not None:
            scores = self.model.predict(self.dataset, verbose=0)
            valid = self.examples.candidates > 0
            labels = self.examples.labels > 0
            group, _ = gauc(scores, labels, valid)
            record.update(val_auc=auc(scores[valid], labels[valid]), val_gauc=group)
        record["seconds"] = round(time.perf_counter() - self.started, 1)
        self.history.append(record)
        monitored = record.get("val_gauc", -record["loss"])
        better = bool(monitored > self.best)
        if better:
            self.best, self.best_epoch, self.wait = monitored, epoch + 1, 0
            self.best_weights = [np.array(w) for w in self.model.get_weights()]
        else:
            self.wait += 1
        shown = ", ".join(f"{k} {v:.4f}" for k, v in record.items() if k.startswith(("loss", "val_")))
        log.info(
            "%s epoch %d: %s [%.1f s]%s",
            self.name,
            epoch + 1,
            shown,
            record["seconds"],
            " (best)" if better else "",
        )
        if self.patience and self.wait >= self.patience:
            log.info("%s: no better validation GAUC for %d epochs, stopping", self.name, self.patience)
            self.model.stop_training = True


@dataclass
class TrainedRanker:
    """A trained ranker with its scorer and its metrics (:func:`train_ranker`)."""

    name: str
    model: Ranker
    kwargs: dict[str, Any]
    scorer: RankerScorer
    metrics: dict[str, Any]


def ranker_kwargs(
    config: RankerConfig, num_items: int, attributes: AttributeTable | None, retriever_dim: int
) -> dict[str, Any]:
    """Constructor arguments of the configured ranker (seeded when it takes a ``seed``).

    Raises:
        ValueError: ``item_init="retriever"`` with a ``dim`` other than the retriever's.
    """
    dim = config.dim or retriever_dim
    if config.item_init == "retriever" and dim != retriever_dim:
        raise ValueError(
            f"item_init=retriever copies the retriever's {retriever_dim}-d item embeddings: "
            f"dim must be {retriever_dim} (or 0), not {dim}"
        )
    kwargs: dict[str, Any] = {
        "num_items": num_items,
        "dim": dim,
        "max_len": config.max_len,
        "num_attributes": 0 if attributes is None else attributes.num_attributes,
        **config.options,
    }
    if "seed" in inspect.signature(ranker_class(config.ranker)).parameters:
        kwargs.setdefault("seed", config.seed)
    return kwargs


def _dataset(
    examples: ClickExamples, table: tf.Tensor | None, unclicked: bool, batch_size: int, seed: int | None
) -> tf.data.Dataset:
    """Batches of ``(inputs, labels)`` (shuffled with ``seed``; in order when ``None``), attributes added."""
    dataset = tf.data.Dataset.from_tensor_slices((examples.inputs(unclicked), examples.labels))
    if seed is not None:
        dataset = dataset.shuffle(len(examples), seed=seed, reshuffle_each_iteration=True)

    @tf.autograph.experimental.do_not_convert
    def add_attributes(x: dict[str, tf.Tensor], y: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        return with_attributes(x, table), y

    dataset = dataset.batch(batch_size).map(add_attributes, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)


def train_ranker(
    config: RankerConfig,
    data: RankingData,
    out: Path | None = None,
    *,
    overwrite: bool = False,
    verbose: int | str = 2,
) -> TrainedRanker:
    """Trains ``config.ranker`` on ``data``'s click examples, evaluates it by reranking the test
    candidates and (with ``out``) writes its artifact (:mod:`retrieval.ranker_artifact`).

    The run is seeded (weights, example order, the rankers' own sampling); progress goes to the
    log (one line per epoch) and to Keras' progress output (``verbose``).

    Returns:
        The ranker, its scorer and the metrics written to ``out/metrics.json``: ``retrieval`` vs
        ``reranked`` (NDCG@10, HR@10, AUC, GAUC), validation per epoch, training time.

    Raises:
        ValueError: an invalid configuration or no training examples.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
    """
    check_config(config)
    if out is not None and Path(out).exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass overwrite to replace it)")
    if not len(data.train):
        raise ValueError("no training examples: every user needs at least 2 training events")
    keras.utils.set_random_seed(config.seed)
    attributes = data.attributes if config.attributes else None
    kwargs = ranker_kwargs(config, len(data.vocab), attributes, int(data.item_embeddings.shape[1]))
    model: Ranker = build_ranker(config.ranker, **kwargs)
    model.build()
    if config.item_init == "retriever":
        # The retriever learnt its item vectors from every training event; the ranker, trained on
        # a few clicks per user, starts from them instead of from noise (row 0, padding, is 0).
        model.item_tower.embedding.embeddings.assign(np.asarray(data.item_embeddings, np.float32))
    uses_unclicked = config.ranker in UNCLICKED_RANKERS and config.unclicked != "none"
    table = None if attributes is None else tf.constant(attributes.table, tf.int32)
    train_set = _dataset(data.train, table, uses_unclicked, config.batch_size, config.seed)
    valid_set = (
        _dataset(data.valid, table, uses_unclicked, 4 * config.batch_size, None) if len(data.valid) else None
    )
    model.compile(optimizer=keras.optimizers.Adam(config.learning_rate), jit_compile=False)
    validation = _Validation(valid_set, data.valid, config.patience, config.ranker)
    log.info(
        "training %s: %d examples of %d candidates, %d validation, %d attributes",
        config.ranker, len(data.train), data.train.candidates.shape[1], len(data.valid),
        kwargs["num_attributes"],
    )  # fmt: skip
    started = time.perf_counter()
    model.fit(train_set, epochs=config.epochs, callbacks=[validation], verbose=verbose, shuffle=False)
    seconds = time.perf_counter() - started
    if validation.best_weights is not None:
        model.set_weights(validation.best_weights)

    scorer = RankerScorer(model, attributes, uses_unclicked)
    found = evaluate_reranking(data.test, {config.ranker: scorer.score})
    best = next((h for h in validation.history if h["epoch"] == validation.best_epoch), {})
    metrics = {
        "ranker": config.ranker,
        "model_version": data.model_version,
        "users": found["users"],
        "candidates": found["candidates"],
        "candidate_recall": found["candidate_recall"],
        "retrieval": found["retrieval"],
        "reranked": found["rerankers"][config.ranker],
        "validation": {k: v for k, v in best.items() if k.startswith("val_")},
        "validation_per_epoch": validation.history,
        "best_epoch": validation.best_epoch,
        "epochs_trained": len(validation.history),
        "train_seconds": round(seconds, 1),
        **data.settings,
    }
    if out is not None:
        save_ranker(
            Path(out), model, config.ranker, kwargs, data.vocab, data.model_version,
            attributes=attributes, config=config.to_dict(), metrics=metrics, overwrite=overwrite,
        )  # fmt: skip
    return TrainedRanker(config.ranker, model, kwargs, scorer, metrics)


def load_retrieval(model_dir: Path, index_dir: Path) -> Retriever:
    """The retriever of a model folder and its index folder (versions checked)."""
    return Retriever.from_dirs(Path(model_dir), Path(index_dir))


def train_ranker_from_dirs(
    config: RankerConfig,
    model_dir: Path,
    index_dir: Path,
    data_path: str | Path,
    out: Path,
    *,
    data_format: str | None = None,
    overwrite: bool = False,
    verbose: int | str = 2,
) -> dict[str, Any]:
    """The whole pipeline from folders: load the retriever, build the examples from the data,
    train, evaluate, write the ranker artifact ``out`` (see :func:`train_ranker`).

    Raises:
        ValueError, FileExistsError: as :func:`train_ranker`; ``DataError`` for unreadable data.
        retrieval.artifacts.ArtifactError: a missing or mismatched model or index folder.
    """
    check_config(config)
    if Path(out).exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass --overwrite to replace it)")
    retriever = load_retrieval(model_dir, index_dir)
    if retriever.model.side.event_features:
        log.warning(
            "%s reads per-event side features %s: retrieval for the ranking examples gives it item "
            "ids only (unknown events)", model_dir, list(retriever.model.side.event_features),
        )  # fmt: skip
    sequences = build_sequences(load_interactions(data_path, data_format))
    data = build_ranking_data(retriever.model, retriever.index, sequences, config)
    return train_ranker(config, data, out, overwrite=overwrite, verbose=verbose).metrics
