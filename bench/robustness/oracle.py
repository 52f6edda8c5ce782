"""What the documented API allows as the answer to a call, checked against what the server said;
with the model's embeddings, every score is recomputed (the oracle)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np

from bench.robustness import calls
from retrieval.api import query_from_request
from retrieval.api.v1 import retrieval_pb2
from retrieval.serving import LimitsConfig, ModelSize, call_cost


@dataclass(frozen=True)
class Served:
    """What the fuzzed server serves, to check answers against.

    Attributes:
        vocab: the model's external item ids (index ``i`` is dense id ``i + 1``).
        embeddings: float32 ``[n + 1, d]`` item embeddings, when known (enables the score oracle).
        user_vectors: the model's user tower (``{"items": int32 [B, L], ...} -> [B, K, d]``), when known.
        side_inputs: the tower's per-event inputs besides ``items`` (given as zeros to the oracle).
        attributes: external id -> the item's attributes (``category`` filters on them).
    """

    model_version: str
    num_interests: int
    dim: int
    max_len: int
    vocab: tuple[str, ...]
    max_message_bytes: int = calls.FUZZ_MAX_MESSAGE_BYTES
    embeddings: np.ndarray | None = None
    user_vectors: Callable[[dict[str, np.ndarray]], np.ndarray] | None = None
    side_inputs: tuple[str, ...] = ()
    attributes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    index: dict[str, int] = field(init=False, repr=False, compare=False)
    categories: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "index", {item: i + 1 for i, item in enumerate(self.vocab)})
        known = (a for item, values in self.attributes.items() if item in self.index for a in values)
        object.__setattr__(self, "categories", frozenset(known))

    def having(self, category: str) -> set[str]:
        """The known items with attribute ``category``."""
        return {i for i, values in self.attributes.items() if category in values and i in self.index}

    def interests(self, history: Sequence[str]) -> np.ndarray | None:
        """The oracle's ``[K, d]`` interests of a history (last ``max_len`` known ids), if it can."""
        if self.user_vectors is None:
            return None
        known = [self.index[h] for h in history if h in self.index][-self.max_len :]
        items = np.zeros((1, self.max_len), np.int32)
        items[0, self.max_len - len(known) :] = known
        inputs = {"items": items, **{name: np.zeros_like(items) for name in self.side_inputs}}
        return np.asarray(self.user_vectors(inputs), np.float32)[0]


def invalid_reason(request: retrieval_pb2.RetrieveRequest, served: Served) -> str | None:
    """Why the documented limits make ``request`` INVALID_ARGUMENT, or ``None`` when it is valid."""
    history = [e.item_id for e in request.events] if request.events else list(request.history)
    lam = request.diversity_lambda
    checks = [
        (bool(request.events) and bool(request.history), "both history and events"),
        (request.merge not in calls.MERGES, f"unknown merge {request.merge}"),
        (not 1 <= request.k <= calls.MAX_K, f"k {request.k}"),
        (not history, "empty history"),
        (len(history) > calls.MAX_HISTORY, f"history of {len(history)}"),
        (not math.isfinite(lam) or lam < 0, f"diversity_lambda {lam}"),
        (lam != 0 and request.merge != calls.DIVERSITY, "diversity_lambda without DIVERSITY"),
        (
            request.per_interest_k != 0
            and not request.k <= request.per_interest_k <= calls.MAX_PER_INTEREST_K,
            f"per_interest_k {request.per_interest_k} for k {request.k}",
        ),
        (len(request.exclude_ids) > calls.MAX_FILTER_IDS, f"{len(request.exclude_ids)} exclude_ids"),
        (len(request.allow_ids) > calls.MAX_FILTER_IDS, f"{len(request.allow_ids)} allow_ids"),
        (len(request.user_id) > calls.MAX_USER_ID, f"user_id of {len(request.user_id)} characters"),
        (bool(request.category) and request.category not in served.categories, "unknown category"),
    ]
    for failed, reason in checks:
        if failed:
            return reason
    if not any(h in served.index for h in history):
        return "no known history id"
    return None


def _response_bound(requests: Sequence[retrieval_pb2.RetrieveRequest], served: Served) -> int:
    """An upper bound on the response size in bytes."""
    longest = max((len(i.encode()) for i in served.vocab), default=0)
    per_interests = served.num_interests * (served.dim * 4 + 8)
    total = 64
    for r in requests:
        total += (
            32 + min(r.k, len(served.vocab)) * (longest + 24) + (per_interests if r.return_interests else 0)
        )
    return total


def expected_codes(call: calls.Call, served: Served) -> tuple[frozenset[grpc.StatusCode], str]:
    """The status codes the documented API allows for ``call``, and why.

    DEADLINE_EXCEEDED is always allowed (a loaded machine may miss the client's deadline).
    """
    codes = {grpc.StatusCode.DEADLINE_EXCEEDED}
    if len(call.payload) > served.max_message_bytes:
        return frozenset(codes | {grpc.StatusCode.RESOURCE_EXHAUSTED}), "request larger than the limit"
    if call.request is None:
        return frozenset(codes | {grpc.StatusCode.INVALID_ARGUMENT}), "not a valid message"
    if call.method == "GetModelInfo":
        return frozenset(codes | {grpc.StatusCode.OK}), "valid"
    if call.method == "Retrieve":
        assert isinstance(call.request, retrieval_pb2.RetrieveRequest)
        requests = [call.request]
    else:
        assert isinstance(call.request, retrieval_pb2.BatchRetrieveRequest)
        requests = list(call.request.requests)
        if not 1 <= len(requests) <= calls.MAX_BATCH:
            return frozenset(codes | {grpc.StatusCode.INVALID_ARGUMENT}), f"batch of {len(requests)}"
    reasons = [(i, invalid_reason(r, served)) for i, r in enumerate(requests)]
    bad = [(i, reason) for i, reason in reasons if reason is not None]
    if bad:
        return frozenset(codes | {grpc.StatusCode.INVALID_ARGUMENT}), f"requests[{bad[0][0]}]: {bad[0][1]}"
    codes.add(grpc.StatusCode.OK)
    size = ModelSize(served.num_interests, len(served.vocab))
    if call_cost([query_from_request(r) for r in requests], size) > LimitsConfig().cheap_cost:
        codes.add(grpc.StatusCode.RESOURCE_EXHAUSTED)  # a heavy call may be refused under load
    if _response_bound(requests, served) > served.max_message_bytes:
        codes.add(grpc.StatusCode.RESOURCE_EXHAUSTED)  # the response may exceed the limit
    return frozenset(codes), "valid"


def check_result(
    request: retrieval_pb2.RetrieveRequest, response: retrieval_pb2.RetrieveResponse, served: Served
) -> list[str]:
    """What is wrong with ``response`` as the answer to the valid ``request`` (empty = nothing):
    what the API promises of any answer, then, when ``served`` has the model, the scores."""
    history = [e.item_id for e in request.events] if request.events else list(request.history)
    candidates = _candidates(request, history, served)
    problems = _answer_problems(request, response, served, history, candidates)
    vectors = served.interests(history)
    if vectors is None or served.embeddings is None or problems:
        return problems
    return _oracle_problems(request, response, served, vectors, candidates)


def _candidates(request: retrieval_pb2.RetrieveRequest, history: Sequence[str], served: Served) -> set[str]:
    """The items ``request`` may be answered with: known, allowed, of its category, neither in the
    history nor excluded."""
    allowed = {a for a in request.allow_ids if a in served.index} if request.allow_ids else None
    if request.category:
        allowed = served.having(request.category) & (allowed if allowed is not None else set(served.vocab))
    banned = set(history) | set(request.exclude_ids)
    return (allowed if allowed is not None else set(served.vocab)) - banned


def _answer_problems(
    request: retrieval_pb2.RetrieveRequest,
    response: retrieval_pb2.RetrieveResponse,
    served: Served,
    history: Sequence[str],
    candidates: set[str],
) -> list[str]:
    """The documented properties of any answer: version, counts, ids, filters, scores, interests."""
    problems = []
    ids = [item.item_id for item in response.items]
    scores = np.array([item.score for item in response.items], np.float64)
    if response.model_version != served.model_version:
        problems.append(f"model_version {response.model_version!r}, expected {served.model_version!r}")
    unknown = sum(h not in served.index for h in history)
    if response.unknown_items != unknown:
        problems.append(f"unknown_items {response.unknown_items}, expected {unknown}")
    if len(set(ids)) != len(ids):
        problems.append("an item is returned twice")
    if any(i not in served.index for i in ids):
        problems.append(f"items not in the vocabulary: {[i for i in ids if i not in served.index][:5]}")
    banned = set(history) | set(request.exclude_ids)
    if banned & set(ids):
        problems.append(f"history or excluded items returned: {sorted(banned & set(ids))[:5]}")
    allowed = {a for a in request.allow_ids if a in served.index}
    if request.allow_ids and set(ids) - allowed:
        problems.append(f"items outside allow_ids returned: {sorted(set(ids) - allowed)[:5]}")
    outside = set(ids) - served.having(request.category) if request.category else set()
    if outside:
        problems.append(f"items without category {request.category!r} returned: {sorted(outside)[:5]}")
    if len(ids) != min(request.k, len(candidates)):
        problems.append(f"{len(ids)} items for k {request.k} with {len(candidates)} candidates")
    if not np.isfinite(scores).all():
        problems.append(f"non-finite scores {scores[~np.isfinite(scores)][:5].tolist()}")
    if any(not 0 <= item.interest < served.num_interests for item in response.items):
        problems.append(f"interest out of range 0..{served.num_interests - 1}")
    if request.merge in calls.MAX_SCORE_MERGES and np.any(np.diff(scores) > 0):
        problems.append("max-score items are not sorted best first")
    expected_interests = served.num_interests if request.return_interests else 0
    if len(response.interests) != expected_interests or any(
        len(v.values) != served.dim or not np.isfinite(v.values).all() for v in response.interests
    ):
        problems.append(f"{len(response.interests)} interests returned, expected {expected_interests} finite")
    return problems


def _oracle_problems(
    request: retrieval_pb2.RetrieveRequest,
    response: retrieval_pb2.RetrieveResponse,
    served: Served,
    vectors: np.ndarray,
    candidates: set[str],
) -> list[str]:
    """The oracle, given the model's ``[K, d]`` interests: every score is the item's inner product
    with the interest it names; max-score and diversity report each item's best interest;
    max-score's items are the best candidates; returned interests are the model's."""
    problems = []
    assert served.embeddings is not None
    ids = [item.item_id for item in response.items]
    scores = np.array([item.score for item in response.items], np.float64)
    dense = np.array([served.index[i] for i in ids], np.int64)
    all_scores = vectors @ served.embeddings.T  # [K, n + 1]
    named = all_scores[[item.interest for item in response.items], dense] if len(ids) else np.zeros(0)
    if not np.allclose(scores, named, rtol=1e-4, atol=1e-4):
        problems.append("a score differs from the inner product with its interest")
    best = all_scores.max(axis=0)
    if request.merge != calls.ROUND_ROBIN and not np.allclose(scores, best[dense], rtol=1e-4, atol=1e-4):
        problems.append("an item is not reported with its best interest")
    if request.merge in calls.MAX_SCORE_MERGES and len(ids) and len(candidates) > len(ids):
        rest = np.array([served.index[c] for c in candidates - set(ids)], np.int64)
        if best[rest].max() > scores.min() + 1e-4 * max(1.0, abs(scores.min())):
            problems.append("a better candidate than the returned ones was left out")
    if request.return_interests:
        got = np.array([list(v.values) for v in response.interests], np.float32)
        if not np.allclose(got, vectors, rtol=1e-4, atol=1e-5):
            problems.append("returned interests differ from the model's")
    return problems


def check_call(
    call: calls.Call, code: grpc.StatusCode, details: str, response: bytes | None, served: Served
) -> list[str]:
    """What is wrong with the server's answer to ``call`` (empty = a documented, correct answer).

    Args:
        code: the status of the call.
        details: its message.
        response: the response bytes (OK calls only).
    """
    allowed, why = expected_codes(call, served)
    if code not in allowed:
        return [
            f"status {code.name} ({details!r}) where the API allows {sorted(c.name for c in allowed)} ({why})"
        ]
    if code is not grpc.StatusCode.OK:
        return [] if details.strip() else [f"status {code.name} without a message"]
    assert response is not None and call.request is not None
    parsed = calls.RESPONSE_TYPES[call.method].FromString(response)
    if isinstance(parsed, retrieval_pb2.RetrieveResponse):
        assert isinstance(call.request, retrieval_pb2.RetrieveRequest)
        return check_result(call.request, parsed, served)
    if isinstance(parsed, retrieval_pb2.BatchRetrieveResponse):
        assert isinstance(call.request, retrieval_pb2.BatchRetrieveRequest)
        if len(parsed.responses) != len(call.request.requests):
            return [f"{len(parsed.responses)} responses for {len(call.request.requests)} requests"]
        return [
            f"responses[{i}]: {p}"
            for i, (r, a) in enumerate(zip(call.request.requests, parsed.responses, strict=True))
            for p in check_result(r, a, served)
        ]
    assert isinstance(parsed, retrieval_pb2.ModelInfo)
    got = (parsed.model_version, parsed.num_interests, parsed.dim, parsed.max_len, parsed.num_items)
    expected = (served.model_version, served.num_interests, served.dim, served.max_len, len(served.vocab))
    return [] if got == expected else [f"model info {got}, expected {expected}"]
