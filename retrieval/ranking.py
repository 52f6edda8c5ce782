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
target: history = the whole training sequence, candidates = the validation item + negatives
(the validation click examples), and also the validation request's whole retrieved list
(``valid_lists``, reranked like the test lists). With the default ``retrieval_fit="lists"``
the blend of the ranker's own part with the retrieval score is fitted on those lists after
every epoch and the monitored metric is their listwise loss; otherwise the validation clicks'
GAUC (``patience`` epochs without improvement stop training; the best epoch's weights are
kept). It is measured before the first epoch too (epoch 0): a ranker that reads the retrieval
scores then orders about as the retriever does, and keeps that when no epoch does better.

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
way for training, validation and test (whose previous request is the validation one), and by
the server (:meth:`retrieval.retriever.Retriever.retrieve_many`, when a request brings no
impressions of its own). ``unclicked="none"`` feeds none.

**Retrieval scores**: every candidate of an example carries the retriever's score for that
request (``retrieval_scores``): the max over the request's interests of the inner product with
the retriever's item embedding (:func:`interest_scores`), which for a retrieved item is the score
its search returned and for a uniform or popularity negative (not retrieved) is computed the
same way. Rankers built with ``retrieval_score`` (:class:`rankers.Ranker`) compute
``g · own + w · s + b``; evaluation feeds the search's own scores. Where ``g``, ``w``, ``b`` are
learned is ``retrieval_fit`` (:class:`RankerConfig`): by default on held-out validation lists,
since the retriever's scores of its own training clicks are in-sample.

**Context** (DSTN, ``context_size`` N): the request's top N + 1 retrieved items, in the
retriever's order (``context``); DSTN reads the first N of them that are not the candidate. In
evaluation and serving the scorer takes them from the head of the retrieved list being
reranked, so the context has N items in training, validation, test and serving alike (before,
it was the request's other candidates: 20 in training, 199 at test time, and DSTN's
un-normalised attention sum saw ten times longer lists at test time).

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
    DEFAULT_NUM_UNCLICKED,
    DEFAULT_UNCLICKED,
    UNCLICKED_RANKERS,
    AttributeTable,
    RankerScorer,
    context_of,
    save_ranker,
    with_attributes,
)
from retrieval.retriever import Retriever
from retrieval.search import search_interests
from retrieval.vocab import PAD, ItemVocab

log = logging.getLogger(__name__)

NEGATIVE_SOURCES = ("retrieved", "uniform", "popularity")
RETRIEVAL_FITS = ("lists", "clicks", "joint")
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
    top ``candidates`` for that history (training and validation). ``context_size`` is DSTN's
    context (its ``context_size`` argument: the request's top retrieved items other than the
    candidate; 0 = every other candidate) and sets the width of the examples' ``context``.
    ``retrieval_fit`` says where a ranker reading the retrieval scores learns ``g``, ``w``, ``b``
    (:class:`rankers.Ranker`). ``"lists"`` (default) and ``"clicks"`` train the ranker's own part
    alone (``g = 1``, ``w = b = 0`` frozen) and fit the blend after each epoch on held-out data
    (stacking): ``"lists"`` on the validation users' whole retrieved lists, reranked as the test
    lists are, with the listwise softmax loss of the validation click (:func:`fit_list_blend`;
    ``b`` then calibrates the logits on the validation clicks), the monitored metric being that
    loss; ``"clicks"`` on the validation click examples (logistic, :func:`fit_blend`), monitoring
    their GAUC. ``"joint"`` trains ``g``, ``w``, ``b`` with the ranker on the training clicks
    (from ``g = 0`` and ``w``, ``b`` the logistic fit of the training clicks on the score).
    The retriever was trained on the training clicks, so its scores of them are in-sample: on
    Amazon Beauty the retrieval score alone has GAUC 0.823 on the training clicks and 0.753 on
    the held-out validation clicks. Trained jointly, a ranker leans on a score that is better
    in training than at test time (its validation GAUC fell below the retriever's from the first
    epoch on, for AFM); the validation clicks are held out from both the retriever and the
    ranker's own part, and three parameters cannot overfit them. Fitted on click examples (21
    candidates drawn from the top 200), the blend ranks those well but weighs the ranker's part
    for the whole list, not for its head, where NDCG@10 is decided (AFM on 3,000 Beauty test
    users: GAUC 0.735 -> 0.750 but NDCG@10 0.0498 -> 0.0448): ``"lists"`` fits it on the task.
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
    unclicked: str = DEFAULT_UNCLICKED
    num_unclicked: int = DEFAULT_NUM_UNCLICKED
    context_size: int = 20
    retrieval_fit: str = "lists"
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
    if config.retrieval_fit not in RETRIEVAL_FITS:
        raise ValueError(f"retrieval_fit must be one of {RETRIEVAL_FITS}, got {config.retrieval_fit!r}")
    if config.context_size < 0:
        raise ValueError(f"context_size must be >= 0, got {config.context_size}")
    if "context_size" in config.options:
        raise ValueError(
            "set DSTN's context with context_size=N, not options.context_size (it sizes the examples)"
        )


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
    product with the candidate's item embedding, as :func:`retrieval.search.search_interests`
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


ScoreFn = Callable[[Sequence[np.ndarray], np.ndarray, Sequence[np.ndarray] | None, np.ndarray], np.ndarray]
"""``(histories, candidates [U, N] (0 = none, retrieval order), unclicked, retrieval scores
[U, N]) -> float [U, N]``, e.g. :meth:`~retrieval.ranker_artifact.RankerScorer.score`."""


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
        values = score(
            lists.histories, np.where(present, lists.candidates, PAD), lists.unclicked, lists.scores
        )
        seconds = time.perf_counter() - started
        out["rerankers"][name] = {
            **list_metrics(lists.candidates, values, lists.targets, ks),
            "score_seconds": round(seconds, 3),
        }
    return out


# --------------------------------------------------------------------------- training


def fit_blend(
    own: np.ndarray, scores: np.ndarray, labels: np.ndarray, valid: np.ndarray, l2: float = 1e-4
) -> tuple[float, float, float]:
    """``(g, w, b)`` of the logistic regression ``σ(g · own + w · scores + b)`` of the clicks, by
    Newton's method (a small L2 keeps it finite when the clicks are separable).

    Args:
        own: float ``[E, C]`` a ranker's own logits; scores: float ``[E, C]`` the retrieval scores;
        labels: ``[E, C]`` 1 = clicked; valid: bool ``[E, C]`` the real candidates.
    """
    x = np.stack([own[valid], scores[valid], np.ones(int(valid.sum()))], axis=1).astype(np.float64)
    y = np.asarray(labels, np.float64)[valid]
    beta = np.zeros(3)
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ beta, -50, 50)))
        gradient = x.T @ (p - y) / len(y) + l2 * beta
        hessian = (x * (p * (1 - p))[:, None]).T @ x / len(y) + l2 * np.eye(3)
        step = np.linalg.solve(hessian, gradient)
        beta -= step
        if np.abs(step).max() < 1e-8:
            break
    return float(beta[0]), float(beta[1]), float(beta[2])


def list_loss(logits: np.ndarray, targets: np.ndarray, present: np.ndarray) -> float:
    """Mean listwise softmax loss ``logsumexp(z) − z_target`` over the lists holding their target.

    Args:
        logits: float ``[n, C]``; targets: bool ``[n, C]`` the target's slot; present: bool ``[n, C]``.
    """
    rows = (targets & present).any(axis=1)
    z = np.where(present[rows], np.asarray(logits, np.float64)[rows], -np.inf)
    top = z.max(axis=1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(z - top).sum(axis=1))
    return float(np.mean(lse - z[targets[rows]])) if rows.any() else float("nan")


def fit_list_blend(
    own: np.ndarray, scores: np.ndarray, targets: np.ndarray, present: np.ndarray, l2: float = 1e-4
) -> tuple[float, float]:
    """``(g, w)`` minimising the listwise softmax loss of ``g · own + w · scores`` (a bias does not
    change an order), by damped Newton steps; over the lists holding their target.

    Args:
        own: float ``[n, C]`` a ranker's own logits; scores: float ``[n, C]`` the retrieval scores;
        targets: bool ``[n, C]`` the target's slot; present: bool ``[n, C]`` the real candidates.
    """
    rows = (targets & present).any(axis=1)
    if not rows.any():
        return 0.0, 1.0
    m, y = present[rows], targets[rows]
    x = np.stack([np.where(m, own[rows], 0.0), np.where(m, scores[rows], 0.0)], axis=-1).astype(np.float64)

    def loss(beta: np.ndarray) -> float:
        return list_loss(x @ beta, y, m) + 0.5 * l2 * float(beta @ beta)

    beta = np.zeros(2)
    current = loss(beta)
    for _ in range(50):
        z = np.where(m, x @ beta, -np.inf)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)  # [n, C]
        mean = np.einsum("nc,nci->ni", p, x)
        gradient = (mean - x[y]).mean(axis=0) + l2 * beta
        covariance = np.einsum("nc,nci,ncj->nij", p, x, x) - np.einsum("ni,nj->nij", mean, mean)
        step = np.linalg.solve(covariance.mean(axis=0) + l2 * np.eye(2), gradient)
        for _ in range(30):  # halve the step until the loss does not rise
            trial = beta - step
            if (value := loss(trial)) <= current:
                break
            step /= 2
        else:
            break
        beta, done, current = trial, current - value < 1e-10, value
        if done:
            break
    return float(beta[0]), float(beta[1])


def fit_bias(offset: np.ndarray, labels: np.ndarray, valid: np.ndarray) -> float:
    """``b`` of the logistic regression ``σ(offset + b)`` of the clicks (Newton's method)."""
    z, y = np.asarray(offset, np.float64)[valid], np.asarray(labels, np.float64)[valid]
    rate = float(np.clip(y.mean(), 1e-6, 1 - 1e-6)) if len(y) else 0.5
    b = float(np.log(rate / (1 - rate)) - np.median(z)) if len(y) else 0.0  # near the answer
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-np.clip(z + b, -50, 50)))
        # Newton's step, clipped: where σ saturates its curvature vanishes and the step explodes.
        step = float(np.clip((p - y).sum() / max(float((p * (1 - p)).sum()), 1e-12), -1.0, 1.0))
        b -= step
        if abs(step) < 1e-10:
            break
    return b


class _Validation(keras.callbacks.Callback):
    """Validation AUC / GAUC before training (epoch 0) and after every epoch, the best weights
    kept, early stopping on GAUC.

    Epoch 0 makes the untrained ranker a candidate too: with ``retrieval_score`` it orders as the
    retriever does, so a training run that never improves on that order on the validation
    clicks keeps it instead of a worse one.
    """

    def __init__(
        self,
        dataset: tf.data.Dataset | None,
        examples: ClickExamples,
        patience: int,
        name: str,
        blend: str | None = None,
        lists: CandidateLists | None = None,
        score_lists: ScoreFn | None = None,
    ) -> None:
        super().__init__()
        self.dataset, self.examples, self.patience, self.name = dataset, examples, patience, name
        # retrieval_fit "lists" / "clicks": fit (g, w, b) on the validation lists or clicks.
        self.blend, self.lists, self.score_lists = blend, lists, score_lists
        self.best_blend: tuple[float, float, float] | None = None
        self.history: list[dict[str, Any]] = []
        self.best: float = -np.inf
        self.best_epoch = 0
        self.best_weights: list[np.ndarray] | None = None
        self.wait = 0
        self.started = time.perf_counter()

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.dataset is not None:
            self.started = time.perf_counter()
            self.record(0, {"epoch": 0})

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.record(epoch + 1, {"epoch": epoch + 1, "loss": float((logs or {}).get("loss", np.nan))})
        if self.patience and self.wait >= self.patience:
            log.info("%s: no better validation for %d epochs, stopping", self.name, self.patience)
            self.model.stop_training = True

    def record(self, epoch: int, record: dict[str, Any]) -> None:
        """Validates, logs and keeps the weights when they are the best so far."""
        if self.dataset is not None:
            scores = self.model.predict(self.dataset, verbose=0)
            valid = self.examples.candidates > 0
            labels = self.examples.labels > 0
            retrieval = self.examples.retrieval_scores
            # With a blend the model's logits are its own part alone (g = 1, w = b = 0).
            if self.blend == "clicks":
                g, w, b = fit_blend(scores, retrieval, labels, valid)
            elif self.blend == "lists" and self.lists is not None and self.score_lists is not None:
                lists = self.lists
                present = lists.candidates > 0
                own = self.score_lists(
                    lists.histories, np.where(present, lists.candidates, PAD), lists.unclicked, lists.scores
                )
                targets = present & (lists.candidates == lists.targets[:, None])
                g, w = fit_list_blend(own, lists.scores, targets, present)
                b = fit_bias(g * scores + w * retrieval, labels, valid)
                blended = np.where(present, g * own + w * np.where(present, lists.scores, 0.0) + b, -np.inf)
                found = list_metrics(lists.candidates, blended, lists.targets)
                record.update(
                    val_list_loss=list_loss(blended, targets, present), val_list_ndcg=found["ndcg@10"]
                )
            if self.blend:
                scores = g * scores + w * retrieval + b
                record["blend"] = [round(v, 4) for v in (g, w, b)]
            group, _ = gauc(scores, labels, valid)
            record.update(val_auc=auc(scores[valid], labels[valid]), val_gauc=group)
        record["seconds"] = round(time.perf_counter() - self.started, 1)
        self.history.append(record)
        if "val_list_loss" in record:
            monitored = -record["val_list_loss"]
        else:
            monitored = record.get("val_gauc", -record.get("loss", np.inf))
        better = bool(monitored > self.best)
        if better:
            self.best, self.best_epoch, self.wait = monitored, epoch, 0
            self.best_weights = [np.array(w) for w in self.model.get_weights()]
            self.best_blend = tuple(record["blend"]) if "blend" in record else None
        elif epoch:
            self.wait += 1
        shown = ", ".join(f"{k} {v:.4f}" for k, v in record.items() if k.startswith(("loss", "val_")))
        if "blend" in record:
            shown += f", blend (g, w, b) {record['blend']}"
        log.info(
            "%s epoch %d: %s [%.1f s]%s",
            self.name,
            epoch,
            shown,
            record["seconds"],
            " (best)" if better else "",
        )


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
    parameters = inspect.signature(ranker_class(config.ranker)).parameters
    if "seed" in parameters:
        kwargs.setdefault("seed", config.seed)
    if "context_size" in parameters:
        kwargs["context_size"] = config.context_size
    return kwargs


def _dataset(
    examples: ClickExamples,
    table: tf.Tensor | None,
    keys: dict[str, bool],
    batch_size: int,
    seed: int | None,
) -> tf.data.Dataset:
    """Batches of ``(inputs, labels)`` (shuffled with ``seed``; in order when ``None``), attributes
    added; ``keys`` says which optional inputs to feed (:meth:`ClickExamples.inputs`)."""
    dataset = tf.data.Dataset.from_tensor_slices((examples.inputs(**keys), examples.labels))
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
    if model.context_size and data.train.context.shape[1] < model.context_size + 1:
        raise ValueError(
            f"the examples hold {data.train.context.shape[1]} context items, the ranker reads "
            f"{model.context_size + 1}: build the data with context_size={model.context_size}"
        )
    keys = {"unclicked": uses_unclicked, "scores": model.retrieval_score, "context": model.context_size > 0}
    table = None if attributes is None else tf.constant(attributes.table, tf.int32)
    train_set = _dataset(data.train, table, keys, config.batch_size, config.seed)
    valid_set = _dataset(data.valid, table, keys, 4 * config.batch_size, None) if len(data.valid) else None
    blend = None
    if model.retrieval_score and config.retrieval_fit != "joint" and valid_set is not None:
        blend = "lists" if config.retrieval_fit == "lists" and data.valid_lists is not None else "clicks"
    if blend:  # the ranker's own part alone; g, w, b are fitted on held-out data
        model.set_blend(1.0, 0.0, 0.0)
        for variable in model.blend_variables:
            variable.trainable = False
    elif model.retrieval_score:
        # w = 1, b = 0 orders as the retriever but is badly calibrated (raw inner products far
        # from click log-odds): the first epoch would spend itself on w and b at the learning
        # rate's pace, the ranker's own part compensating meanwhile. Start from the logistic fit
        # of the training clicks on the retrieval score instead: the same order (w > 0), calibrated.
        train = data.train
        _, w, b = fit_blend(
            np.zeros_like(train.retrieval_scores),
            train.retrieval_scores,
            train.labels > 0,
            train.candidates > 0,
        )
        if w > 0:
            model.retrieval_weight.assign(w)
            model.retrieval_bias.assign(b)
    model.compile(optimizer=keras.optimizers.Adam(config.learning_rate), jit_compile=False)
    # Scores lists with the model's current weights (the scorer's graph reads its variables).
    list_scorer = RankerScorer(model, attributes, uses_unclicked) if blend == "lists" else None
    validation = _Validation(
        valid_set, data.valid, config.patience, config.ranker, blend, data.valid_lists,
        None if list_scorer is None else list_scorer.score,
    )  # fmt: skip
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
    if validation.best_blend is not None:
        model.set_blend(*validation.best_blend)

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
        "epochs_trained": sum(1 for h in validation.history if h["epoch"] > 0),
        "train_seconds": round(seconds, 1),
        **_retrieval_term(model),
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


def _retrieval_term(model: Ranker) -> dict[str, Any]:
    """The learned ``g``, ``w``, ``b`` of a ranker reading the retrieval scores (else nothing)."""
    if not model.retrieval_score:
        return {}
    names = ("ranker_scale", "retrieval_weight", "retrieval_bias")
    values = (float(np.asarray(v)) for v in model.blend_variables)
    return {"retrieval_term": dict(zip(names, values, strict=True))}


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
