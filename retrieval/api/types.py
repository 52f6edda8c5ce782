"""The request and response types of the retrieval API and its limits: what a client sends and gets
back, independent of gRPC (:mod:`retrieval.api.convert` maps them to the protobuf messages)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_K = 1000
"""Most items one request may ask for (the API's documented limit)."""

MAX_HISTORY = 10_000
"""Most history ids one request may send; the user tower reads only the last ``max_len``, but
every id is excluded from the results, so the whole history is looked up."""

MAX_PER_INTEREST_K = 2000
"""Most candidates one interest may fetch (``per_interest_k``): bounds the merge's work."""

MAX_FILTER_IDS = 10_000
"""Most ids one request's ``exclude`` or ``allow`` list may hold."""

MAX_BATCH = 256
"""Most requests one batch may hold."""

MAX_USER_ID = 256
"""Longest ``user_id`` (characters); it only goes to the log."""

MAX_NAME = 256
"""Longest ``category`` or ranker name (characters)."""

ID_BYTES = 64
"""Item id length (bytes) the default message limits are sized for: a request at every list
limit with ids this long fits; one with longer ids fits shorter lists."""

DEFAULT_K = 10
"""Items a query asks for when it does not say."""

DEFAULT_RERANK_CANDIDATES = 200
"""Candidates a rerank scores when the request does not say (at least ``k``)."""

EXPLAIN_TOP = 3
"""History events an explanation lists per interest (:class:`Explanations`)."""


class MergeStrategy(enum.StrEnum):
    """The merge strategies a request can ask for."""

    MAX_SCORE = "max_score"
    ROUND_ROBIN = "round_robin"
    DIVERSITY = "diversity"


class ExplanationKind(enum.StrEnum):
    """What an explanation's weights are; they depend on the model's user tower."""

    ATTENTION = "attention"
    """Attention weights (ComiRec-SA, DIN, SASRec, BERT4Rec and their NOVA variants)."""
    ROUTING = "routing"
    """Capsule routing coefficients (ComiRec-DR, MIND)."""
    NONE = "none"
    """The tower has no per-interest weights (YouTube DNN)."""
    UNAVAILABLE = "unavailable"
    """The served artifact cannot compute them (exported before explanations existed)."""


@dataclass(frozen=True)
class Explanations:
    """What made each of a user's interests: the answer to a query's ``explain``.

    Attributes:
        kind: what the weights are.
        interests: per interest (``0..K-1``, an item's ``interest`` indexes it), the history
            events with the largest weights: ``(external id, weight, position in the query's
            history)``, largest first, at most :data:`EXPLAIN_TOP`, events of weight 0 left out;
            empty unless ``kind`` is attention or routing.
    """

    kind: ExplanationKind
    interests: list[list[tuple[str, float, int]]] = field(default_factory=list)


@dataclass(frozen=True)
class Rerank:
    """Asks for the retrieved candidates to be scored by a ranker, the best ``k`` returned.

    Attributes:
        ranker: name of one of the retriever's rankers; ``""`` = its only one.
        candidates: items retrieved (with the query's merge and filters) and scored,
            ``k..MAX_K``; 0 = ``max(k, DEFAULT_RERANK_CANDIDATES)``.
        unclicked: external ids of items shown to the user and not clicked (the caller's
            impressions, at most ``MAX_FILTER_IDS``; unknown ids are ignored), for a ranker
            that reads them (DSTN); the others ignore them. The ranker reads the first
            ``num_unclicked`` known ones (as many as it was trained with). Empty = the server
            computes them as training did: the retriever's top ``num_unclicked`` for the
            history without its last event, minus that event's item
            (:meth:`Retriever.retrieve_many`).
    """

    ranker: str = ""
    candidates: int = 0
    unclicked: Sequence[str] = ()


@dataclass(frozen=True)
class Query:
    """One user's request: what :meth:`RetrievalClient.retrieve
    <retrieval.api.client.RetrievalClient.retrieve>` sends and :meth:`Retriever.retrieve
    <retrieval.serving.retriever.Retriever.retrieve>` answers (both take a ``Query``, or its
    fields by name through :func:`as_query`).

    Attributes:
        history: external item ids, oldest first (unknown ids are skipped and counted).
        k: number of items wanted, ``1..MAX_K``.
        timestamps: per history event, for models trained with side features (``gap_prev``,
            ``gap_now``); ignored by models without them.
        actions: per history event, for models trained with the ``action`` side feature;
            ignored by models without it.
        merge: how the K interests' lists become one (see ``index.merge``); may be given by
            name (``"round_robin"``), stored as a :class:`MergeStrategy`.
        diversity_lambda: ``λ >= 0`` of the DIVERSITY merge (0 = max-score); only with it.
        per_interest_k: candidates per interest, ``k..MAX_PER_INTEREST_K``; 0 = ``k``.
        exclude: external ids never to return (besides the history); unknown ids ignored.
        allow: when non-empty, the only external ids that may be returned; unknown ids ignored.
        return_interests: also return the user's ``[K, d]`` interest vectors.
        user_id: for the log only.
        category: when non-empty, only items with this attribute (e.g. a genre) are returned
            (with ``allow``: items in both).
        request_time: seconds since the epoch the items are asked for, for models with the
            ``gap_now`` feature (0 = now, by the server's clock).
        rerank: score the retrieved candidates with a ranker and return its best ``k``.
        explain: also return what made each interest (:class:`Explanations`): per interest,
            the history events with the largest weights in the user tower.

    Raises:
        ValueError: an unknown merge name.
    """

    history: Sequence[str]
    k: int = DEFAULT_K
    timestamps: Sequence[int] | None = None
    actions: Sequence[str] | None = None
    merge: MergeStrategy = MergeStrategy.MAX_SCORE
    diversity_lambda: float = 0.0
    per_interest_k: int = 0
    exclude: Sequence[str] = ()
    allow: Sequence[str] = ()
    return_interests: bool = False
    user_id: str = ""
    category: str = ""
    request_time: int = 0
    rerank: Rerank | None = None
    explain: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.merge, str):
            names = [m.value for m in MergeStrategy]
            if self.merge not in names:
                raise ValueError(f"unknown merge strategy {self.merge!r}; choose from {names}")
            object.__setattr__(self, "merge", MergeStrategy(self.merge))


def as_query(history: Query | Sequence[str], k: int | None = None, **fields: Any) -> Query:
    """The query a ``retrieve`` call asks for: a :class:`Query` given whole, or built from a
    history, ``k`` (default :data:`DEFAULT_K`) and any other of its fields by name.

    Example:
        >>> as_query(["B0001", "B0042"], 5, merge="round_robin").merge
        <MergeStrategy.ROUND_ROBIN: 'round_robin'>
        >>> as_query(Query(["B0001"], k=3)).k
        3

    Raises:
        TypeError: a :class:`Query` with more fields beside it, or a field :class:`Query` does
            not have.
        ValueError: an unknown merge name.
    """
    if isinstance(history, Query):
        if k is not None or fields:
            raise TypeError("give a Query alone, or a history with k and the other fields by name")
        return history
    return Query(history, DEFAULT_K if k is None else k, **fields)


@dataclass(frozen=True)
class ModelInfo:
    """What a retriever serves (``GetModelInfo``).

    Attributes:
        index: the index's ``describe()`` (factory, search_params, is_exact, ...) plus, when its
            manifest has a measurement, ``recall`` and ``recall_k`` (recall@k against exact).
        start_time: when the retriever was created, seconds since the Unix epoch.
        reload_refusals: deployment versions the server refused (failed to load, warm up or
            answer) since it started.
        last_refusal: why the latest one was refused, one line, at most 300 characters.
        access_file_error: why the access file's last change was not applied (unparsable,
            deleted, unreadable) while the identities read before stay in force; ``""`` when
            they are the file's, or the server has none.
    """

    model_version: str
    tower: str
    num_interests: int
    dim: int
    max_len: int
    num_items: int
    index: dict[str, Any]
    side_features: tuple[str, ...]
    start_time: float
    rankers: tuple[str, ...] = ()
    reload_refusals: int = 0
    last_refusal: str = ""
    access_file_error: str = ""


@dataclass(frozen=True)
class Retrieved:
    """Answer to one request.

    Attributes:
        items: ``(external id, score, interest)`` in the merge's order (best first for max-score),
            never an item of the history or of the request's ``exclude`` list; after a rerank,
            in the ranker's order (``score`` stays the retrieval score).
        unknown_items: history ids the user tower does not read (skipped): missing from the
            vocabulary, or added to it after training.
        model_version: version of the model (and of the index built from it) that answered.
        interests: float32 ``[K, d]``, the user's interest vectors, when the request asked for them.
        rank_scores: after a rerank, the ranker's click logit of each item (best first).
        ranker_version: after a rerank, the version of the ranker artifact that scored.
        explanations: what made each interest, when the request asked (``explain``).
    """

    items: list[tuple[str, float, int]]
    unknown_items: int
    model_version: str
    interests: np.ndarray | None = field(default=None, compare=False)
    rank_scores: list[float] | None = None
    ranker_version: str = ""
    explanations: Explanations | None = None
