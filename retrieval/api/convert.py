"""Conversion between the API's Python types (:mod:`retrieval.api.types`) and the protobuf messages
of ``proto/retrieval.proto``."""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
from google.protobuf import timestamp_pb2
from google.protobuf.message import DecodeError, Message

from retrieval.api.errors import InvalidArgument
from retrieval.api.types import (
    EXPLAIN_TOP,
    ID_BYTES,
    MAX_BATCH,
    MAX_FILTER_IDS,
    MAX_HISTORY,
    MAX_K,
    MAX_NAME,
    MAX_USER_ID,
    ExplanationKind,
    Explanations,
    MergeStrategy,
    ModelInfo,
    Query,
    Rerank,
    Retrieved,
)
from retrieval.api.v1 import retrieval_pb2

M = TypeVar("M", bound=Message)

SERVICE_NAME: str = retrieval_pb2.DESCRIPTOR.services_by_name["RetrievalService"].full_name


def parse(request: M | bytes, message: type[M]) -> M:
    """``request`` itself, or parsed from the bytes the server received.

    The servicer is registered with raw-bytes handlers (:func:`add_servicer`) so that a request
    that does not parse (truncated, invalid UTF-8 in a string) is answered INVALID_ARGUMENT;
    grpcio's own deserializer would answer INTERNAL.

    Raises:
        InvalidArgument: the bytes are not a valid ``message``.
    """
    if not isinstance(request, bytes):
        return request
    try:
        return message.FromString(request)
    except DecodeError as e:
        raise InvalidArgument(f"the request is not a valid {message.DESCRIPTOR.full_name}: {e}") from None


_MERGE_FROM_PROTO: dict[int, MergeStrategy] = {
    retrieval_pb2.MERGE_STRATEGY_UNSPECIFIED: MergeStrategy.MAX_SCORE,
    retrieval_pb2.MAX_SCORE: MergeStrategy.MAX_SCORE,
    retrieval_pb2.ROUND_ROBIN: MergeStrategy.ROUND_ROBIN,
    retrieval_pb2.DIVERSITY: MergeStrategy.DIVERSITY,
}


_MERGE_TO_PROTO: dict[MergeStrategy, str] = {m: m.name for m in MergeStrategy}
"""Enum value names: the same in the proto and in :class:`MergeStrategy`."""

_KIND_TO_PROTO: dict[ExplanationKind, int] = {
    kind: retrieval_pb2.ExplanationKind.Value(f"EXPLANATION_KIND_{kind.name}") for kind in ExplanationKind
}
_KIND_FROM_PROTO: dict[int, ExplanationKind] = {number: kind for kind, number in _KIND_TO_PROTO.items()}


def query_from_request(request: retrieval_pb2.RetrieveRequest) -> Query:
    """A ``RetrieveRequest`` as a :class:`Query` (the Retriever validates the values).

    Lists and strings over the API's limits are refused here, before any is copied into
    Python objects: a refused request costs no more memory than its message.

    Raises:
        InvalidArgument: a list or string over its limit, both history and events sent, or an
            unknown merge strategy number.
    """
    check_sizes(request)
    if request.events and request.history:
        raise InvalidArgument("send the history either as history or as events, not both")
    if request.merge not in _MERGE_FROM_PROTO:
        raise InvalidArgument(f"unknown merge strategy {request.merge}; use one of {list(_MERGE_FROM_PROTO)}")
    if request.events:
        history: list[str] = [e.item_id for e in request.events]
        timestamps: list[int] | None = [e.timestamp for e in request.events]
        actions: list[str] | None = [e.action for e in request.events]
    else:
        history, timestamps, actions = list(request.history), None, None
    return Query(
        history=history,
        k=request.k,
        timestamps=timestamps,
        actions=actions,
        merge=_MERGE_FROM_PROTO[request.merge],
        diversity_lambda=request.diversity_lambda,
        per_interest_k=request.per_interest_k,
        exclude=list(request.exclude_ids),
        allow=list(request.allow_ids),
        return_interests=request.return_interests,
        user_id=request.user_id,
        category=request.category,
        request_time=request.request_time,
        rerank=Rerank(request.rerank.ranker, request.rerank.candidates, list(request.rerank.unclicked))
        if request.HasField("rerank")
        else None,
        explain=request.explain,
    )


def check_sizes(request: retrieval_pb2.RetrieveRequest) -> None:
    """Refuses lists and strings over the API's limits (``len`` of a parsed message's fields
    copies nothing). Strings are named, never echoed, so an error message stays short.

    Raises:
        InvalidArgument: the first field over its limit.
    """
    lists = (
        ("history", len(request.history) or len(request.events), MAX_HISTORY),
        ("exclude_ids", len(request.exclude_ids), MAX_FILTER_IDS),
        ("allow_ids", len(request.allow_ids), MAX_FILTER_IDS),
        ("rerank.unclicked", len(request.rerank.unclicked), MAX_FILTER_IDS),
    )
    for name, size, limit in lists:
        if size > limit:
            raise InvalidArgument(f"{name} has {size} ids, at most {limit} are accepted")
    strings = (
        ("user_id", request.user_id, MAX_USER_ID),
        ("category", request.category, MAX_NAME),
        ("rerank.ranker", request.rerank.ranker, MAX_NAME),
    )
    for name, text, limit in strings:
        if len(text) > limit:
            raise InvalidArgument(f"{name} has {len(text)} characters, at most {limit}")


def request_from_query(query: Query) -> retrieval_pb2.RetrieveRequest:
    """The inverse of :func:`query_from_request`: with timestamps or actions, the history goes
    as events (a missing timestamp is 0, a missing action "").

    Raises:
        ValueError: timestamps or actions not one per history event.
    """
    for name, values in (("timestamps", query.timestamps), ("actions", query.actions)):
        if values is not None and len(values) != len(query.history):
            raise ValueError(f"{len(values)} {name} for a history of {len(query.history)} events")
    request = retrieval_pb2.RetrieveRequest(
        k=query.k,
        merge=_MERGE_TO_PROTO[query.merge],
        diversity_lambda=query.diversity_lambda,
        per_interest_k=query.per_interest_k,
        exclude_ids=query.exclude,
        allow_ids=query.allow,
        return_interests=query.return_interests,
        user_id=query.user_id,
        category=query.category,
        request_time=query.request_time,
        explain=query.explain,
    )
    if query.rerank is not None:
        request.rerank.ranker = query.rerank.ranker
        request.rerank.candidates = query.rerank.candidates
        request.rerank.unclicked.extend(query.rerank.unclicked)
        request.rerank.SetInParent()  # present even with default values
    if query.timestamps is None and query.actions is None:
        request.history.extend(query.history)
    else:
        request.events.extend(
            retrieval_pb2.Event(
                item_id=item,
                timestamp=0 if query.timestamps is None else int(query.timestamps[i]),
                action="" if query.actions is None else str(query.actions[i]),
            )
            for i, item in enumerate(query.history)
        )
    return request


def response_from_result(result: Retrieved) -> retrieval_pb2.RetrieveResponse:
    """A :class:`Retrieved` as a ``RetrieveResponse``."""
    response = retrieval_pb2.RetrieveResponse(
        model_version=result.model_version,
        unknown_items=result.unknown_items,
        ranker_version=result.ranker_version,
        interests=[]
        if result.interests is None
        else [retrieval_pb2.Interest(values=row.tolist()) for row in result.interests],
    )
    # One add() per item, without a rank_score it does not have: cheaper than building
    # ScoredItem objects and handing them to the constructor (bench.floor's response stage).
    add = response.items.add
    if result.rank_scores is None:
        for item, score, interest in result.items:
            add(item_id=item, score=score, interest=interest)
    else:
        for (item, score, interest), rank in zip(result.items, result.rank_scores, strict=True):
            add(item_id=item, score=score, interest=interest, rank_score=rank)
    if result.explanations is not None:
        response.explanations.CopyFrom(_explanations_message(result.explanations))
    return response


def _explanations_message(explanations: Explanations) -> retrieval_pb2.Explanations:
    """:class:`Explanations` as the ``Explanations`` message."""
    return retrieval_pb2.Explanations(
        kind=_KIND_TO_PROTO[explanations.kind],  # type: ignore[arg-type]
        interests=[
            retrieval_pb2.InterestExplanation(
                events=[
                    retrieval_pb2.WeightedEvent(item_id=item, weight=weight, position=position)
                    for item, weight, position in events
                ]
            )
            for events in explanations.interests
        ],
    )


def _explanations_from_message(message: retrieval_pb2.Explanations) -> Explanations:
    """The inverse of :func:`_explanations_message`; a kind this client does not know (from a
    newer server) reads as unavailable."""
    return Explanations(
        _KIND_FROM_PROTO.get(message.kind, ExplanationKind.UNAVAILABLE),
        [[(e.item_id, e.weight, e.position) for e in interest.events] for interest in message.interests],
    )


def result_from_response(response: retrieval_pb2.RetrieveResponse) -> Retrieved:
    """The inverse of :func:`response_from_result` (``interests`` float32 ``[K, d]`` or ``None``)."""
    interests = (
        np.array([list(i.values) for i in response.interests], np.float32) if response.interests else None
    )
    return Retrieved(
        items=[(item.item_id, item.score, item.interest) for item in response.items],
        unknown_items=response.unknown_items,
        model_version=response.model_version,
        interests=interests,
        rank_scores=[item.rank_score for item in response.items] if response.ranker_version else None,
        ranker_version=response.ranker_version,
        explanations=_explanations_from_message(response.explanations)
        if response.HasField("explanations")
        else None,
    )


def model_info_message(info: ModelInfo) -> retrieval_pb2.ModelInfo:
    """A :class:`ModelInfo` as the ``ModelInfo`` message."""
    start = timestamp_pb2.Timestamp()
    start.FromNanoseconds(int(info.start_time * 1e9))
    index = info.index
    return retrieval_pb2.ModelInfo(
        model_version=info.model_version,
        tower=info.tower,
        num_interests=info.num_interests,
        dim=info.dim,
        max_len=info.max_len,
        num_items=info.num_items,
        index=retrieval_pb2.IndexInfo(
            backend=str(index.get("backend", "")),
            factory=str(index.get("factory", "")),
            search_params=str(index.get("search_params", "")),
            is_exact=bool(index.get("is_exact", False)),
            recall=float(index.get("recall", 0.0)),
            recall_k=int(index.get("recall_k", 0)),
            count=int(index.get("count", 0)),
        ),
        side_features=list(info.side_features),
        start_time=start,
        rankers=list(info.rankers),
        reload_refusals=info.reload_refusals,
        last_refusal=info.last_refusal,
        access_file_error=info.access_file_error,
    )


def model_info_from_message(message: retrieval_pb2.ModelInfo) -> ModelInfo:
    """The inverse of :func:`model_info_message`: ``index`` holds the ``IndexInfo`` fields,
    ``recall`` and ``recall_k`` only when the index was measured (``recall_k`` > 0)."""
    index = message.index
    described: dict[str, Any] = {
        "backend": index.backend,
        "factory": index.factory,
        "search_params": index.search_params,
        "is_exact": index.is_exact,
        "count": index.count,
    }
    if index.recall_k:
        described.update(recall=index.recall, recall_k=index.recall_k)
    return ModelInfo(
        model_version=message.model_version,
        tower=message.tower,
        num_interests=message.num_interests,
        dim=message.dim,
        max_len=message.max_len,
        num_items=message.num_items,
        index=described,
        side_features=tuple(message.side_features),
        start_time=message.start_time.ToNanoseconds() / 1e9,
        rankers=tuple(message.rankers),
        reload_refusals=message.reload_refusals,
        last_refusal=message.last_refusal,
        access_file_error=message.access_file_error,
    )


def _string_bytes(length: int) -> int:
    """Wire bytes of a string (or message) field of ``length`` bytes: tag, length varint, bytes."""
    return 1 + max(1, (length.bit_length() + 6) // 7) + length


def largest_request_bytes(id_bytes: int = ID_BYTES) -> int:
    """Wire size of the largest valid ``RetrieveRequest`` whose ids and actions have
    ``id_bytes`` bytes: every list at its limit, the history as events, every string at its
    longest (:mod:`retrieval.api.types`)."""
    event = _string_bytes(id_bytes) + 11 + _string_bytes(id_bytes)  # item, int64 timestamp, action
    filters = 3 * MAX_FILTER_IDS * _string_bytes(id_bytes)  # exclude, allow, rerank.unclicked
    names = _string_bytes(MAX_USER_ID) + 2 * _string_bytes(MAX_NAME)  # user, category, ranker
    return MAX_HISTORY * _string_bytes(event) + filters + names + 64  # + the numbers


def largest_response_bytes(id_bytes: int = ID_BYTES, num_interests: int = 8, dim: int = 256) -> int:
    """Wire size of the largest ``BatchRetrieveResponse``: ``MAX_BATCH`` answers of ``MAX_K``
    items with ids of ``id_bytes`` bytes, each with ``num_interests`` vectors of ``dim`` floats
    and explanations of ``EXPLAIN_TOP`` events per interest."""
    item = 2 + _string_bytes(id_bytes) + 5 + 3 + 5  # framing, id, score, interest, rank score
    interests = num_interests * (4 + 4 * dim)
    event = 2 + _string_bytes(id_bytes) + 5 + 3  # framing, id, weight, position
    explanations = 8 + num_interests * (2 + EXPLAIN_TOP * event)
    return MAX_BATCH * (8 + MAX_K * item + interests + explanations + 3 * _string_bytes(MAX_NAME))


def _whole_mib(size: float) -> int:
    return int(-(-size // 2**20)) * 2**20


DEFAULT_MAX_REQUEST_BYTES: int = _whole_mib(1.25 * largest_request_bytes())
"""The server's default receive limit: the largest valid request (ids of ``ID_BYTES``) with 25%
headroom, in whole MiB. A ``BatchRetrieve`` shares it: its requests together must fit. Anything
larger is refused by gRPC before it is parsed, so an abusive request costs little memory."""

DEFAULT_MAX_RESPONSE_BYTES: int = _whole_mib(1.25 * largest_response_bytes())
"""The default send limit of the server and receive limit of the client: the largest
``BatchRetrieve`` answer with 25% headroom, in whole MiB."""
