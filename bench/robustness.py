"""Robustness benchmark: property-based fuzzing of every RPC against a real server, and a soak.

    python -m bench.robustness --fuzz 10000                 # synthetic model, server in a child process
    python -m bench.robustness --fuzz 1000 --model MODEL_DIR --index INDEX_DIR --max-message-mb 4
    python -m bench.robustness --soak 600                   # 10 min at 80% of max QPS, a reload halfway

Requests come from one Hypothesis generator (:func:`calls`, shared with
``tests/test_fuzz_rpc.py``): ``Retrieve``, ``BatchRetrieve`` and ``GetModelInfo`` with random,
huge and out-of-range numbers, empty and huge lists, unknown and duplicate ids, NaN/inf
``diversity_lambda``, odd unicode, known and unknown ``category``, oversized messages, hand-made
wire bytes (a negative varint for ``k``, unknown fields) and, unless ``--no-undecodable``, bytes
that are not a valid message (invalid UTF-8 in a string field, truncated or random bytes).

Every answer must be what the API documents (:func:`check_call`): a valid result (at most ``k``
distinct known items, none from the history or ``exclude_ids``, only ``allow_ids`` when given,
``k`` of them whenever ``k`` items pass, finite scores, best first for max-score) or
``INVALID_ARGUMENT`` / ``RESOURCE_EXHAUSTED`` / ``DEADLINE_EXCEEDED`` with a message, as the
documented limits predict; never ``INTERNAL`` or ``UNKNOWN``. The server runs in its own process:
a good request is checked every 100 calls and at the end, and the process must still be alive.
Prints the counts per method and status code, the violations by kind (one example of each in
full; ``--violations FILE`` keeps all, with their request bytes), the time and the rate; exits 1
on any violation.

``--soak SECONDS`` (:func:`run_soak`) trains two versions of a model (``--soak-tower``, one epoch on
ML-100K by default, seeds 1 and 2; cached in ``--out``/soak-versions) with a Flat index each,
publishes the first to a deployment root and serves it with ``tools/serve.py --watch ROOT`` in a
child process. It measures the server's max QPS (32 calls in flight for ``--probe-seconds``), then
sends 80% of it (``--load-fraction``) on a fixed schedule for SECONDS, the requests being the
data's users' histories; halfway, ``tools/deploy.py`` publishes the second version, which the
server must swap in without a failed call. Prints one row per tenth of the run (requests, errors,
p50/p99/max latency, send lag, which versions answered, the server's RSS from
``/proc/PID/status``), the totals, and the checks: no errors, the new version answering after the
swap and only the old one before, RSS growth under 5%, and the rate held (95% of the scheduled
calls answered within the run: on a shared machine the capacity measured by the probe may not
last); writes ``soak-<SECONDS>s.json`` and ``.md`` to ``--out`` (default
``runs/bench-robustness``). Exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from subprocess import PIPE
from typing import Any

if not __package__:  # run as ``python bench/robustness.py``: make the repository importable
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import grpc
import numpy as np
from google.protobuf.message import DecodeError, Message
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from proto import retrieval_pb2

log = logging.getLogger("bench.robustness")

FUZZ_MAX_MESSAGE_BYTES = 1 << 20
"""Request and response limit of the fuzzed server: small, so oversized requests are cheap to make."""

MAX_K, MAX_HISTORY, MAX_PER_INTEREST_K, MAX_FILTER_IDS, MAX_BATCH, MAX_USER_ID = (
    1000, 10_000, 2000, 10_000, 256, 256,
)  # fmt: skip
"""The documented limits (README, API): the generator aims at both sides of each."""

MERGES = (0, 1, 2, 3)  # MERGE_STRATEGY_UNSPECIFIED, MAX_SCORE, ROUND_ROBIN, DIVERSITY
DIVERSITY = 3
SERVICE = "/retrieval.v1.RetrievalService/"
REQUEST_TYPES: dict[str, type[Message]] = {
    "Retrieve": retrieval_pb2.RetrieveRequest,
    "BatchRetrieve": retrieval_pb2.BatchRetrieveRequest,
    "GetModelInfo": retrieval_pb2.GetModelInfoRequest,
}
RESPONSE_TYPES: dict[str, type[Message]] = {
    "Retrieve": retrieval_pb2.RetrieveResponse,
    "BatchRetrieve": retrieval_pb2.BatchRetrieveResponse,
    "GetModelInfo": retrieval_pb2.ModelInfo,
}
DOCUMENTED_ERRORS = frozenset(
    {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED}
)

# --------------------------------------------------------------------------------- the generator


@dataclass(frozen=True)
class Call:
    """One generated RPC.

    Attributes:
        method: ``Retrieve``, ``BatchRetrieve`` or ``GetModelInfo``.
        payload: the request's wire bytes, exactly as sent.
        request: ``payload`` parsed, ``None`` when it is not a valid message.
        kind: which branch of the generator made it (``typed``, ``wire``, ``undecodable``).
    """

    method: str
    payload: bytes
    request: Message | None
    kind: str

    def describe(self, limit: int = 300) -> str:
        """A short, readable description (long fields are summarised)."""
        if self.request is None:
            return f"{self.method} undecodable payload {self.payload[:limit]!r} ({len(self.payload)} bytes)"
        return f"{self.method}({_summary(self.request, limit)}) [{len(self.payload)} bytes, {self.kind}]"


def _summary(message: Message, limit: int) -> str:
    parts = []
    for descriptor, value in message.ListFields():
        if descriptor.is_repeated:
            values = list(value)
            shown = ", ".join(_summary(v, 80) if isinstance(v, Message) else repr(v)[:40] for v in values[:4])
            parts.append(
                f"{descriptor.name}=[{shown}{', ...' if len(values) > 4 else ''}] (len {len(values)})"
            )
        elif isinstance(value, Message):
            parts.append(f"{descriptor.name}={_summary(value, 80)}")
        else:
            parts.append(f"{descriptor.name}={repr(value)[:60]}")
    text = ", ".join(parts)
    return text if len(text) <= limit else text[:limit] + "..."


ODD_IDS = (
    "", " ", "item01 ", "ITEM01", "item1", "item01\x00", "\u200bitem01", "item01\n", "🙂", "é" * 200,
    "\U0010ffff", "../../etc/passwd", "%s%n", "null", "-1", "0", "1e308", "NaN", "\ufeff", "ア" * 9,
)  # fmt: skip

UINT32 = 2**32 - 1
INT64 = 2**63
LAMBDA_SPECIALS = (0.0, -0.0, math.nan, math.inf, -math.inf, 1e-45, 3.4028234663852886e38, -1.0, 1e-30)
USER_ID_LIMITS = ("u" * MAX_USER_ID, "u" * (MAX_USER_ID + 1), "é" * MAX_USER_ID, "🙂" * (MAX_USER_ID + 1))


_DEFINED = max(f.number for m in REQUEST_TYPES.values() for f in m.DESCRIPTOR.fields)
UNKNOWN_FIELD_NUMBERS = st.one_of(st.integers(max(_DEFINED, 15) + 1, 18_999), st.integers(20_000, 2**29 - 1))
"""Field numbers no request message defines (nor keeps for later: 12-15), outside the range
protobuf reserves (19000-19999): parsers skip them."""


def _huge_list(known: Sequence[str], n: int, mode: str) -> list[str]:
    """``n`` ids built without drawing each one (cheap to generate at 10,000)."""
    if mode == "known":
        return [known[i % len(known)] for i in range(n)]
    if mode == "unknown":
        return [f"unknown-{i}" for i in range(n)]
    return [known[i % len(known)] if i % 3 == 0 else f"u{i}" for i in range(n)]


def _huge_events(ids: list[str], newest: int) -> list[retrieval_pb2.Event]:
    return [retrieval_pb2.Event(item_id=item, timestamp=newest - n, action="1") for n, item in enumerate(ids)]


def _varint(value: int) -> bytes:
    """Protobuf base-128 varint of ``value`` (negative numbers as their 64-bit two's complement)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    """One wire-format field: varint (type 0, ``payload`` already a varint) or length-delimited (2)."""
    key = _varint(number << 3 | wire_type)
    return key + (_varint(len(payload)) + payload if wire_type == 2 else payload)


class RequestStrategies:
    """The generator's strategies, built once for a set of known ids (building them per draw is slow).

    Each request is drawn either *in range* (every field within the documented limits, edges
    included: ``k`` 1 and 1000, histories of 10,000 ids, ``per_interest_k`` 2000, user ids of 256
    characters) or *wild* (anything the wire type holds: ``k`` up to 2^32 - 1, unknown merge
    numbers, NaN/inf/negative ``diversity_lambda``, lists over the limits, both history and
    events or neither, oversized messages), so both the answers and the refusals are exercised.
    """

    def __init__(
        self,
        known: Sequence[str],
        categories: Sequence[str] = (),
        max_message_bytes: int = FUZZ_MAX_MESSAGE_BYTES,
    ) -> None:
        known = list(known)
        self.known = known
        self.max_message_bytes = max_message_bytes
        sampled = st.sampled_from(known)
        some_category = st.sampled_from(sorted(categories)) if categories else st.just("")
        self.category = {
            "in range": st.one_of(st.just(""), st.just(""), st.just(""), some_category),
            "wild": st.one_of(st.just(""), some_category, st.sampled_from(ODD_IDS), st.text(max_size=12)),
        }
        self.item_id = st.one_of(sampled, sampled, st.sampled_from(ODD_IDS), st.text(max_size=24))
        small = st.lists(self.item_id, max_size=12)
        duplicates = st.builds(lambda item, n: [item] * n, sampled, st.integers(2, 60))

        def huge(sizes: list[int]) -> st.SearchStrategy[list[str]]:
            modes = st.sampled_from(["known", "unknown", "mixed"])
            return st.builds(lambda n, mode: _huge_list(known, n, mode), st.sampled_from(sizes), modes)

        self.lists = {
            "in range": st.one_of(
                small, small, small, small, small, duplicates, huge([MAX_HISTORY - 1, MAX_HISTORY])
            ),
            "wild": st.one_of(small, small, duplicates, huge([MAX_HISTORY, MAX_HISTORY + 1, 12_000])),
        }
        self.filters = {
            "in range": st.one_of(
                st.just([]),
                st.just([]),
                st.just([]),
                st.lists(self.item_id, max_size=6),
                st.lists(sampled, max_size=60),
                huge([MAX_FILTER_IDS]),
            ),
            "wild": st.one_of(st.just([]), st.just([]), small, huge([MAX_FILTER_IDS + 1])),
        }
        self.k = {
            "in range": st.one_of(st.integers(1, 70), st.integers(1, 70), st.sampled_from([1, 999, MAX_K])),
            "wild": st.one_of(
                st.sampled_from([0, MAX_K + 1, 2**31 - 1, 2**31, UINT32]),
                st.integers(0, UINT32),
                st.integers(1, 70),
            ),
        }
        self.per_interest_k_wild = st.one_of(
            st.just(0),
            st.integers(0, 120),
            st.sampled_from([MAX_PER_INTEREST_K, MAX_PER_INTEREST_K + 1, UINT32]),
            st.integers(0, UINT32),
        )
        self.merge = {
            "in range": st.sampled_from(MERGES),
            "wild": st.one_of(st.sampled_from(MERGES), st.integers(-(2**31), 2**31 - 1)),
        }
        self.diversity_lambda = {
            "in range": st.one_of(st.just(0.0), st.floats(0, 10, width=32), st.sampled_from([1e-45, 3.4e38])),
            "wild": st.one_of(st.floats(width=32), st.sampled_from(LAMBDA_SPECIALS)),
        }
        self.user_id = {
            "in range": st.one_of(st.just(""), st.text(max_size=40), st.sampled_from(USER_ID_LIMITS[::2])),
            "wild": st.one_of(st.just(""), st.text(max_size=300), st.sampled_from(USER_ID_LIMITS)),
        }
        timestamps = st.one_of(st.integers(0, 2_000_000_000), st.integers(-INT64, INT64 - 1))
        actions = st.one_of(st.sampled_from(["", "1", "2", "3", "click", "buy"]), st.text(max_size=8))
        event = st.builds(retrieval_pb2.Event, item_id=self.item_id, timestamp=timestamps, action=actions)
        small_events = st.lists(event, max_size=12)
        huge_events = st.builds(
            _huge_events,
            huge([MAX_HISTORY - 1, MAX_HISTORY, MAX_HISTORY + 1]),
            st.integers(-INT64 + 20_000, INT64 - 1),
        )
        self.events = st.one_of(small_events, small_events, small_events, small_events, huge_events)
        self.small_events = st.lists(st.builds(retrieval_pb2.Event, item_id=self.item_id), max_size=6)
        self.small_lists = st.lists(self.item_id, max_size=6)
        self.retrieve = self._retrieve()
        self.small_retrieve = self._retrieve(small=True)
        self.good_retrieve = st.builds(
            retrieval_pb2.RetrieveRequest,
            history=st.lists(st.one_of(sampled, sampled, sampled, self.item_id), min_size=1, max_size=12),
            k=self.k["in range"],
            exclude_ids=st.lists(sampled, max_size=4),
            return_interests=st.booleans(),
        ).filter(lambda r: any(h in known for h in r.history))
        self.batch = self._batch()

    def _retrieve(self, small: bool = False) -> st.SearchStrategy[retrieval_pb2.RetrieveRequest]:
        @st.composite
        def draw_request(draw: st.DrawFn) -> retrieval_pb2.RetrieveRequest:
            mode = draw(st.sampled_from(["in range", "in range", "wild"]))
            shapes = ["history", "history", "events"] + (["both", "neither"] if mode == "wild" else [])
            shape = draw(st.sampled_from(shapes))
            k = draw(self.k[mode])
            merge = draw(self.merge[mode])
            if mode == "in range":
                per_interest_k = draw(
                    st.one_of(st.just(0), st.integers(min(k, MAX_PER_INTEREST_K), MAX_PER_INTEREST_K))
                )
            else:
                per_interest_k = draw(self.per_interest_k_wild)
            request = retrieval_pb2.RetrieveRequest(
                k=k,
                merge=merge,  # type: ignore[arg-type]  # any int32: unknown values are the point
                per_interest_k=per_interest_k,
                exclude_ids=draw(self.small_lists if small else self.filters[mode]),
                allow_ids=draw(st.just([]) | self.small_lists if small else self.filters[mode]),
                return_interests=draw(st.booleans()),
                user_id=draw(self.user_id[mode]),
                category=draw(self.category[mode]),
            )
            # Only DIVERSITY takes a lambda; elsewhere only a wild request sends one.
            if merge == DIVERSITY or mode == "wild":
                request.diversity_lambda = draw(self.diversity_lambda[mode])
            if shape in ("history", "both"):
                request.history.extend(draw(self.small_lists if small else self.lists[mode]))
            if shape in ("events", "both"):
                request.events.extend(draw(self.small_events if small else self.events))
            if mode == "wild" and not small and draw(st.integers(0, 15)) == 0:
                oversized = self.max_message_bytes + draw(st.integers(1, 5000))
                request.user_id = "x" * oversized
            return request

        return draw_request()

    def _batch(self) -> st.SearchStrategy[retrieval_pb2.BatchRetrieveRequest]:
        @st.composite
        def draw_batch(draw: st.DrawFn) -> retrieval_pb2.BatchRetrieveRequest:
            if draw(st.integers(0, 4)) == 0:  # many copies of a small request, around the 256 limit
                one = draw(self.small_retrieve)
                n = draw(st.sampled_from([0, 1, MAX_BATCH - 1, MAX_BATCH, MAX_BATCH + 1, 300]))
                return retrieval_pb2.BatchRetrieveRequest(requests=[one] * n)
            if draw(st.booleans()):  # valid requests only, so that batches are answered too
                return retrieval_pb2.BatchRetrieveRequest(
                    requests=draw(st.lists(self.good_retrieve, min_size=1, max_size=8))
                )
            mixed = st.lists(st.one_of(self.small_retrieve, self.small_retrieve, self.retrieve), max_size=6)
            return retrieval_pb2.BatchRetrieveRequest(requests=draw(mixed))

        return draw_batch()

    def wire(self) -> st.SearchStrategy[tuple[str, bytes]]:
        """Hand-made wire bytes that parse: a negative varint in ``k``/``merge``/``per_interest_k``
        (read back truncated to 32 bits), unknown fields (skipped by the parser)."""

        @st.composite
        def draw_wire(draw: st.DrawFn) -> tuple[str, bytes]:
            history = _field(1, 2, draw(st.sampled_from(self.known)).encode())
            field_number = draw(st.sampled_from([2, 4, 6]))
            negative = _field(field_number, 0, _varint(draw(st.integers(-(2**63), -1))))
            unknown = _field(draw(UNKNOWN_FIELD_NUMBERS), 2, draw(st.binary(max_size=16)))
            if draw(st.integers(0, 3)) == 0:
                number = draw(st.integers(-(2**63), 2**64 - 1))
                return "GetModelInfo", unknown + _field(1, 0, _varint(number))
            k = _field(2, 0, _varint(draw(st.integers(1, 20))))
            payloads = [history + negative, history + k + unknown, history + negative + unknown]
            return "Retrieve", draw(st.sampled_from(payloads))

        return draw_wire()

    def undecodable(self) -> st.SearchStrategy[tuple[str, bytes]]:
        """Bytes that are not a valid request: invalid UTF-8 in a string field, a truncated
        message, random bytes (those the parser happens to accept are checked as valid requests)."""

        @st.composite
        def draw_undecodable(draw: st.DrawFn) -> tuple[str, bytes]:
            method = draw(st.sampled_from(["Retrieve", "BatchRetrieve", "GetModelInfo"]))
            choice = draw(st.sampled_from(["utf8", "truncated", "random"]))
            if choice == "utf8":
                bad = draw(
                    st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"item\x80", b"\xf4\x90\x80\x80"])
                )
                field_number = draw(st.sampled_from([1, 7, 8, 10]))  # history, exclude, allow, user_id
                payload = _field(field_number, 2, bad) + _field(2, 0, _varint(5))
                if method == "BatchRetrieve":
                    payload = _field(1, 2, payload)
                elif method == "GetModelInfo":  # it has no string field: a field cut short instead
                    payload = b"\x0a\x05\xff"
                return method, payload
            if choice == "truncated":
                good = retrieval_pb2.RetrieveRequest(
                    history=[draw(st.sampled_from(self.known))], k=5, user_id="u"
                )
                whole = good.SerializeToString()
                if method == "BatchRetrieve":
                    whole = retrieval_pb2.BatchRetrieveRequest(requests=[good]).SerializeToString()
                return method, whole[: draw(st.integers(1, len(whole) - 1))]
            return method, draw(st.binary(min_size=1, max_size=64))

        return draw_undecodable()

    def calls(self, undecodable: bool = False) -> st.SearchStrategy[Call]:
        """Every RPC: typed requests (Retrieve thrice as often as the others), hand-made wire
        bytes and, with ``undecodable``, bytes that are not a valid message."""
        typed = st.one_of(
            self.retrieve.map(lambda r: ("Retrieve", r)),
            self.retrieve.map(lambda r: ("Retrieve", r)),
            self.retrieve.map(lambda r: ("Retrieve", r)),
            self.batch.map(lambda r: ("BatchRetrieve", r)),
            st.just(("GetModelInfo", retrieval_pb2.GetModelInfoRequest())),
        )
        strategies: list[st.SearchStrategy[Call]] = [
            typed.map(lambda mr: _call(mr[0], mr[1].SerializeToString(), "typed")),
            typed.map(lambda mr: _call(mr[0], mr[1].SerializeToString(), "typed")),
            typed.map(lambda mr: _call(mr[0], mr[1].SerializeToString(), "typed")),
            self.wire().map(lambda mp: _call(mp[0], mp[1], "wire")),
        ]
        if undecodable:
            strategies.append(self.undecodable().map(lambda mp: _call(mp[0], mp[1], "undecodable")))
        return st.one_of(*strategies)


def calls(
    known: Sequence[str],
    categories: Sequence[str] = (),
    undecodable: bool = False,
    max_message_bytes: int = FUZZ_MAX_MESSAGE_BYTES,
) -> st.SearchStrategy[Call]:
    """Generated RPCs over ``known`` item ids and ``categories`` for a server whose message limit
    is ``max_message_bytes`` (see :class:`RequestStrategies`)."""
    return RequestStrategies(known, categories, max_message_bytes).calls(undecodable)


def _call(method: str, payload: bytes, kind: str) -> Call:
    try:
        request: Message | None = REQUEST_TYPES[method].FromString(payload)
    except DecodeError:
        request = None
    return Call(method, payload, request, "undecodable" if request is None else kind)


# ------------------------------------------------------------------------------ the expectations


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
    max_message_bytes: int = FUZZ_MAX_MESSAGE_BYTES
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
        (request.merge not in MERGES, f"unknown merge {request.merge}"),
        (not 1 <= request.k <= MAX_K, f"k {request.k}"),
        (not history, "empty history"),
        (len(history) > MAX_HISTORY, f"history of {len(history)}"),
        (not math.isfinite(lam) or lam < 0, f"diversity_lambda {lam}"),
        (lam != 0 and request.merge != DIVERSITY, "diversity_lambda without DIVERSITY"),
        (
            request.per_interest_k != 0 and not request.k <= request.per_interest_k <= MAX_PER_INTEREST_K,
            f"per_interest_k {request.per_interest_k} for k {request.k}",
        ),
        (len(request.exclude_ids) > MAX_FILTER_IDS, f"{len(request.exclude_ids)} exclude_ids"),
        (len(request.allow_ids) > MAX_FILTER_IDS, f"{len(request.allow_ids)} allow_ids"),
        (len(request.user_id) > MAX_USER_ID, f"user_id of {len(request.user_id)} characters"),
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


def expected_codes(call: Call, served: Served) -> tuple[frozenset[grpc.StatusCode], str]:
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
        if not 1 <= len(requests) <= MAX_BATCH:
            return frozenset(codes | {grpc.StatusCode.INVALID_ARGUMENT}), f"batch of {len(requests)}"
    reasons = [(i, invalid_reason(r, served)) for i, r in enumerate(requests)]
    bad = [(i, reason) for i, reason in reasons if reason is not None]
    if bad:
        return frozenset(codes | {grpc.StatusCode.INVALID_ARGUMENT}), f"requests[{bad[0][0]}]: {bad[0][1]}"
    codes.add(grpc.StatusCode.OK)
    if _response_bound(requests, served) > served.max_message_bytes:
        codes.add(grpc.StatusCode.RESOURCE_EXHAUSTED)  # the response may exceed the limit
    return frozenset(codes), "valid"


def check_result(
    request: retrieval_pb2.RetrieveRequest, response: retrieval_pb2.RetrieveResponse, served: Served
) -> list[str]:
    """What is wrong with ``response`` as the answer to the valid ``request`` (empty = nothing)."""
    problems = []
    history = [e.item_id for e in request.events] if request.events else list(request.history)
    items = [(item.item_id, item.score, item.interest) for item in response.items]
    ids = [item for item, _, _ in items]
    scores = np.array([s for _, s, _ in items], np.float64)
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
    allowed = {a for a in request.allow_ids if a in served.index} if request.allow_ids else None
    if allowed is not None and set(ids) - allowed:
        problems.append(f"items outside allow_ids returned: {sorted(set(ids) - allowed)[:5]}")
    if request.category:
        outside = set(ids) - served.having(request.category)
        if outside:
            problems.append(f"items without category {request.category!r} returned: {sorted(outside)[:5]}")
        allowed = served.having(request.category) & (allowed if allowed is not None else set(served.vocab))
    candidates = (allowed if allowed is not None else set(served.vocab)) - banned
    if len(ids) != min(request.k, len(candidates)):
        problems.append(f"{len(ids)} items for k {request.k} with {len(candidates)} candidates")
    if not np.isfinite(scores).all():
        problems.append(f"non-finite scores {scores[~np.isfinite(scores)][:5].tolist()}")
    if any(not 0 <= n < served.num_interests for _, _, n in items):
        problems.append(f"interest out of range 0..{served.num_interests - 1}")
    max_score = request.merge in (0, 1)
    if max_score and np.any(np.diff(scores) > 0):
        problems.append("max-score items are not sorted best first")
    expected_interests = served.num_interests if request.return_interests else 0
    if len(response.interests) != expected_interests or any(
        len(v.values) != served.dim or not np.isfinite(v.values).all() for v in response.interests
    ):
        problems.append(f"{len(response.interests)} interests returned, expected {expected_interests} finite")
    vectors = served.interests(history)
    if vectors is None or served.embeddings is None or problems:
        return problems
    # The oracle: every score is the item's inner product with the interest it names; max-score
    # and diversity report each item's best interest; max-score's items are the best candidates.
    dense = np.array([served.index[i] for i in ids], np.int64)
    all_scores = vectors @ served.embeddings.T  # [K, n + 1]
    named = all_scores[[n for _, _, n in items], dense] if len(ids) else np.zeros(0)
    if not np.allclose(scores, named, rtol=1e-4, atol=1e-4):
        problems.append("a score differs from the inner product with its interest")
    best = all_scores.max(axis=0)
    if request.merge != 2 and not np.allclose(scores, best[dense], rtol=1e-4, atol=1e-4):
        problems.append("an item is not reported with its best interest")
    if max_score and len(ids) and len(candidates) > len(ids):
        rest = np.array([served.index[c] for c in candidates - set(ids)], np.int64)
        if best[rest].max() > scores.min() + 1e-4 * max(1.0, abs(scores.min())):
            problems.append("a better candidate than the returned ones was left out")
    if request.return_interests:
        got = np.array([list(v.values) for v in response.interests], np.float32)
        if not np.allclose(got, vectors, rtol=1e-4, atol=1e-5):
            problems.append("returned interests differ from the model's")
    return problems


def check_call(
    call: Call, code: grpc.StatusCode, details: str, response: bytes | None, served: Served
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
    parsed = RESPONSE_TYPES[call.method].FromString(response)
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


# ---------------------------------------------------------------------------------- calling it


class FuzzClient:
    """Sends raw request bytes to every RPC of a server (so undecodable payloads can be sent too)."""

    def __init__(self, address: str, timeout: float = 30.0) -> None:
        size = 64 << 20  # the client never limits: the server's limit is what is tested
        options = [("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", size)]
        self.channel = grpc.insecure_channel(address, options=options)
        self.timeout = timeout
        self._methods = {m: self.channel.unary_unary(SERVICE + m, None, None) for m in REQUEST_TYPES}

    def wait_ready(self, timeout: float = 30.0) -> None:
        grpc.channel_ready_future(self.channel).result(timeout=timeout)

    def send(self, call: Call) -> tuple[grpc.StatusCode, str, bytes | None]:
        """``(status code, details, response bytes or None)`` of one call."""
        try:
            response = self._methods[call.method](call.payload, timeout=self.timeout)
        except grpc.RpcError as error:
            return error.code(), error.details() or "", None
        return grpc.StatusCode.OK, "", response

    def good_request_works(self, served: Served) -> bool:
        """A plain valid request gets a full, correct answer."""
        request = retrieval_pb2.RetrieveRequest(history=list(served.vocab[:2]), k=3)
        call = _call("Retrieve", request.SerializeToString(), "probe")
        code, details, response = self.send(call)
        return code is grpc.StatusCode.OK and not check_call(call, code, details, response, served)

    def close(self) -> None:
        self.channel.close()


# ------------------------------------------------------------------------- the synthetic server


SYNTHETIC_ITEMS = tuple(f"item{i:02d}" for i in range(64))
SYNTHETIC_VERSION = "fuzz-model-v1"


def synthetic_model() -> Any:
    """A model without TensorFlow (like ``tests/test_server.make_model``), with side features.

    64 items, d = 16, K = 3, ``max_len`` 8; interests are K fixed projections of the mean
    embedding of the last ``max_len`` items. The tower takes ``action`` and ``gap_prev`` inputs
    (and ignores them) so requests' events go through the side-feature encoding.
    """
    from retrieval.artifacts import ModelArtifact
    from retrieval.data import ItemVocab, SideVocab

    dim, k, max_len = 16, 3, 8
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(len(SYNTHETIC_ITEMS) + 1, dim)).astype(np.float32)
    embeddings[0] = 0
    projections = (rng.normal(size=(k, dim, dim)) / np.sqrt(dim)).astype(np.float32)

    def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:  # int32 [B, L] -> float32 [B, K, d]
        items = inputs["items"]
        assert set(inputs) == {"items", "action", "gap_prev"}, sorted(inputs)
        real = (items > 0)[..., None]
        mean = (embeddings[items] * real).sum(axis=1) / np.maximum(real.sum(axis=1), 1)
        return np.einsum("bd,kde->bke", mean, projections).astype(np.float32)

    manifest = {
        "kind": "model",
        "version": SYNTHETIC_VERSION,
        "max_len": max_len,
        "num_interests": k,
        "dim": dim,
    }
    side = SideVocab(("action", "gap_prev"), actions=("1", "2", "3", "click"))
    return ModelArtifact(None, manifest, ItemVocab.from_ids(SYNTHETIC_ITEMS), embeddings, user_vectors, side)


def synthetic_retriever() -> Any:
    """:func:`synthetic_model` over a Flat index, items in 5 categories (some without one)."""
    from retrieval.artifacts import build_index_from_model
    from retrieval.serving import Retriever

    model = synthetic_model()
    return Retriever(model, build_index_from_model(model, "Flat"), item_attributes=SYNTHETIC_ATTRIBUTES)


SYNTHETIC_ATTRIBUTES = {
    item: [f"cat{i % 5}", f"brand{i % 3}"] if i % 2 else [f"cat{i % 5}"]
    for i, item in enumerate(SYNTHETIC_ITEMS)
    if i % 7
}
"""Items' attributes: a category (5 of them; every 7th item has none) and, for odd items, a brand."""


def served_by(
    retriever: Any,
    attributes: dict[str, list[str]],
    max_message_bytes: int = FUZZ_MAX_MESSAGE_BYTES,
    oracle: bool = True,
) -> Served:
    """The :class:`Served` description of a retriever built with item ``attributes`` (with the
    score oracle when ``oracle``)."""
    model = retriever.model
    return Served(
        model.version,
        model.num_interests,
        model.dim,
        model.max_len,
        tuple(model.vocab.ids),
        max_message_bytes,
        model.item_embeddings if oracle else None,
        model.user_vectors if oracle else None,
        tuple(model.side.event_features),
        {item: tuple(values) for item, values in attributes.items()},
    )


def _serve(model_dir: str | None, index_dir: str | None, max_message_bytes: int, ports: Any) -> None:
    """Child process: loads or builds the retriever, serves on a free port, sends the port back."""
    from retrieval.serving import Retriever, create_server

    if model_dir and index_dir:
        retriever = Retriever.from_dirs(Path(model_dir), Path(index_dir))
    else:
        retriever = synthetic_retriever()
    server, port = create_server(retriever, port=0, max_message_bytes=max_message_bytes)
    ports.put(port)
    server.wait_for_termination()


def _served_from_dirs(model_dir: Path, max_message_bytes: int) -> Served:
    """A real model folder's vocabulary and shape, read without TensorFlow (no score oracle)."""
    from retrieval.data import ItemVocab
    from retrieval.storage import read_manifest

    manifest = read_manifest(model_dir, "model", verify=False)
    vocab = ItemVocab.load(model_dir / "vocab.json")
    attributes_file = model_dir / "item_attributes.json"
    attributes = json.loads(attributes_file.read_text()) if attributes_file.is_file() else {}
    return Served(
        str(manifest["version"]),
        int(manifest["num_interests"]),
        int(manifest["dim"]),
        int(manifest["max_len"]),
        tuple(vocab.ids),
        max_message_bytes,
        attributes={item: tuple(values) for item, values in attributes.items()},
    )


@dataclass
class FuzzReport:
    """What a fuzzing run saw.

    Attributes:
        counts: calls per ``(method, status code name)``.
        violations: ``"<call> => <what is wrong>"`` per call answered against the API.
        payloads: the request bytes of each violation (to replay it).
        probe_failures: good requests (sent every 100 calls) that failed.
    """

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    probe_failures: int = 0


def run_fuzz(
    client: FuzzClient,
    served: Served,
    n: int,
    seed_value: int = 0,
    undecodable: bool = True,
    on_progress: Callable[[int], None] | None = None,
) -> FuzzReport:
    """Sends ``n`` generated calls and checks every answer; every 100 calls it also checks that a
    good request still works."""
    report = FuzzReport()
    known = served.vocab[: min(len(served.vocab), 64)]

    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @seed(seed_value)
    @given(calls(known, sorted(served.categories)[:64], undecodable, served.max_message_bytes))
    def fuzz_one(call: Call) -> None:
        code, details, response = client.send(call)
        report.counts[(call.method, code.name)] += 1
        problems = check_call(call, code, details, response, served)
        if problems:
            report.violations.append(f"{call.describe()} => {'; '.join(problems)}")
            report.payloads.append(call.payload)
        done = sum(report.counts.values())
        if done % 100 == 0:
            report.probe_failures += not client.good_request_works(served)
            if on_progress is not None:
                on_progress(done)

    fuzz_one()
    return report


def _violation_kind(violation: str) -> str:
    """``INTERNAL on undecodable requests``, ``INTERNAL``, ... or the first wrong property."""
    description, _, problems = violation.partition(" => ")
    if problems.startswith("status "):
        code = problems.split()[1]
        return f"{code} on undecodable requests" if "undecodable" in description else code
    return problems.split(";")[0].split(",")[0][:80]


# --------------------------------------------------------------------------------------- the soak


REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "runs" / "bench-robustness"
DEFAULT_SOAK_DATA = REPO.parent / "shared" / "data" / "ml-100k"
RSS_GROWTH_LIMIT = 0.05
"""The issue's bound on the server's resident memory growth over a soak (end against start)."""


@dataclass(frozen=True)
class Version:
    """A model artifact, the index built from it, and the model's version."""

    model: Path
    index: Path
    version: str


def _tool_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}


def run_tool_process(name: str, *args: str) -> str:
    """Runs ``tools/<name>.py ARGS`` in a child process, as users run it; returns its stdout.

    Raises:
        RuntimeError: the tool failed (the end of its stderr is in the message).
    """
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / f"{name}.py"), *args],
        cwd=REPO,
        env=_tool_env(),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"tools/{name}.py {' '.join(args)} failed ({done.returncode}): {done.stderr[-3000:]}"
        )
    return done.stdout


def build_versions(
    out: Path, data: Path, train_args: Sequence[str], seeds: Sequence[int] = (1, 2)
) -> list[Version]:
    """One model per seed (``tools/train.py --data DATA TRAIN_ARGS --seed S``) and its Flat index
    (``tools/build_index.py``), built in child processes under ``out`` once, then reused."""
    from retrieval.storage import read_manifest

    name = "-".join([data.stem, *(a.lstrip("-") for a in train_args)])
    built = []
    for seed_value in seeds:
        folder = out / name / f"seed{seed_value}"
        model_dir, index_dir = folder / "model", folder / "index"
        if not (model_dir / "manifest.json").is_file():
            log.info("training %s (seed %d)", model_dir, seed_value)
            run_tool_process(
                "train", "--data", str(data), "--out", str(model_dir), "--seed", str(seed_value),
                "--overwrite", "--quiet", *train_args,
            )  # fmt: skip
        if not (index_dir / "manifest.json").is_file():
            run_tool_process("build_index", "--model", str(model_dir), "--out", str(index_dir), "--overwrite")
        built.append(
            Version(model_dir, index_dir, str(read_manifest(model_dir, "model", verify=False)["version"]))
        )
    if len({v.version for v in built}) != len(built):
        raise RuntimeError(f"the models under {out / name} share a version: a reload would change nothing")
    return built


def rss_kb(pid: int) -> int:
    """The resident set size of process ``pid`` in KiB (``VmRSS`` of ``/proc/PID/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def model_version_of(address: str, timeout: float = 5.0) -> str:
    """The ``model_version`` a server reports (``GetModelInfo``)."""
    with grpc.insecure_channel(address) as channel:
        info = channel.unary_unary(
            SERVICE + "GetModelInfo",
            retrieval_pb2.GetModelInfoRequest.SerializeToString,
            retrieval_pb2.ModelInfo.FromString,
        )(retrieval_pb2.GetModelInfoRequest(), timeout=timeout)
    return str(info.model_version)


def start_watching_server(
    root: Path, log_file: Path, interval: float, startup_seconds: float = 300.0
) -> tuple[subprocess.Popen[bytes], str]:
    """Starts ``tools/serve.py --watch ROOT`` on a free port (its log to ``log_file``) and waits
    until it answers; returns the process and its address."""
    from bench.serving import free_port

    port = free_port()
    command = [
        sys.executable, str(REPO / "tools" / "serve.py"), "--watch", str(root),
        "--watch-interval", str(interval), "--port", str(port),
    ]  # fmt: skip
    with open(log_file, "wb") as log_handle:
        process = subprocess.Popen(
            command, cwd=REPO, env=_tool_env(), stdout=log_handle, stderr=subprocess.STDOUT
        )
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + startup_seconds
    while True:
        try:
            model_version_of(address)
            return process, address
        except grpc.RpcError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise RuntimeError(
                    f"the server did not start (exit code {process.poll()}); log: {log_file}"
                ) from None
            time.sleep(0.3)


@dataclass
class SoakTrace:
    """What a paced run saw.

    Attributes:
        calls: one ``(due, sent, latency, status name, model version)`` per request; times in
            seconds from the start of the run, ``due`` when the schedule wanted it sent.
        rss: ``(seconds, KiB)`` samples of the server's resident memory.
        deploy: the reload's start and end times, exit code and output.
        seconds: the run's length.
    """

    calls: list[tuple[float, float, float, str, str]] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)
    deploy: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


async def hold_rate(
    address: str,
    batch: Sequence[retrieval_pb2.RetrieveRequest],
    rate: float,
    seconds: float,
    pid: int,
    reload_at: float | None = None,
    reload_command: Sequence[str] = (),
    workers: int = 64,
    timeout: float = 10.0,
    rss_every: float = 1.0,
) -> SoakTrace:
    """Sends ``rate`` Retrieve calls per second for ``seconds`` on a fixed schedule (call ``i`` is
    due at ``i / rate``), runs ``reload_command`` at ``reload_at`` seconds, and samples the
    resident memory of process ``pid`` every ``rss_every`` seconds.

    At most ``workers`` calls are in flight; a call that cannot be sent when due is sent as soon
    as a worker is free, so a server that falls behind shows as send lag, not as a lower rate.
    """
    trace = SoakTrace(seconds=seconds)
    counter = iter(range(1 << 62))
    async with grpc.aio.insecure_channel(address) as channel:
        retrieve = channel.unary_unary(
            SERVICE + "Retrieve",
            retrieval_pb2.RetrieveRequest.SerializeToString,
            retrieval_pb2.RetrieveResponse.FromString,
        )
        start = time.perf_counter()

        async def worker() -> None:
            while True:
                i = next(counter)
                due = i / rate
                if due >= seconds:
                    return
                delay = start + due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                sent = time.perf_counter()
                try:
                    response = await retrieve(batch[i % len(batch)], timeout=timeout)
                    code, version = "OK", str(response.model_version)
                except grpc.aio.AioRpcError as error:
                    code, version = error.code().name, ""
                done = time.perf_counter()
                trace.calls.append((due, sent - start, done - sent, code, version))

        async def sample_rss() -> None:
            while (now := time.perf_counter() - start) < seconds:
                trace.rss.append((now, rss_kb(pid)))
                await asyncio.sleep(rss_every)
            trace.rss.append((time.perf_counter() - start, rss_kb(pid)))

        async def reload() -> None:
            if reload_at is None:
                return
            await asyncio.sleep(max(0.0, start + reload_at - time.perf_counter()))
            began = time.perf_counter() - start
            process = await asyncio.create_subprocess_exec(
                *reload_command, cwd=REPO, env=_tool_env(), stdout=PIPE, stderr=PIPE
            )
            stdout, stderr = await process.communicate()
            trace.deploy = {
                "start_s": round(began, 3),
                "end_s": round(time.perf_counter() - start, 3),
                "returncode": process.returncode,
                "stdout": stdout.decode().strip(),
                "stderr": stderr.decode()[-2000:],
            }

        await asyncio.gather(*(worker() for _ in range(workers)), sample_rss(), reload())
    return trace


def _ms(values: np.ndarray, q: float) -> float:
    return round(float(np.percentile(values, q)) * 1000, 2) if len(values) else float("nan")


def summarise_soak(
    trace: SoakTrace, old: str, new: str, windows: int, rss_limit: float = RSS_GROWTH_LIMIT
) -> dict[str, Any]:
    """Per-window and whole-run figures of a soak, and its checks.

    Windows split the run by when calls were due; a window's RSS is the last sample in it.
    The swap is the first call answered by ``new``. The rate is held when the calls answered
    within the run are at least 95% of those it scheduled (a server that cannot keep up makes
    the send lag grow instead).
    """
    due = np.array([c[0] for c in trace.calls])
    sent = np.array([c[1] for c in trace.calls])
    latency = np.array([c[2] for c in trace.calls])
    codes = [c[3] for c in trace.calls]
    versions = [c[4] for c in trace.calls]
    lag = sent - due
    width = trace.seconds / windows
    rows: list[dict[str, Any]] = []
    for w in range(windows):
        inside = np.flatnonzero((due >= w * width) & (due < (w + 1) * width))
        rss_in = [kb for t, kb in trace.rss if t < (w + 1) * width]
        rows.append(
            {
                "from_s": round(w * width, 1),
                "to_s": round((w + 1) * width, 1),
                "requests": len(inside),
                "errors": int(sum(codes[i] != "OK" for i in inside)),
                "p50_ms": _ms(latency[inside], 50),
                "p99_ms": _ms(latency[inside], 99),
                "max_ms": round(float(latency[inside].max()) * 1000, 2) if len(inside) else float("nan"),
                "send_lag_p99_ms": _ms(lag[inside], 99),
                "versions": dict(Counter(versions[i] for i in inside if codes[i] == "OK")),
                "rss_mb": round(rss_in[-1] / 1024, 1) if rss_in else None,
            }
        )
    answered_new = sent[[v == new for v in versions]]
    swap_s = float(answered_new.min()) if len(answered_new) else None
    before = Counter(
        v
        for s, v, c in zip(sent, versions, codes, strict=True)
        if c == "OK" and (swap_s is None or s < swap_s)
    )
    after = Counter(
        v
        for s, v, c in zip(sent, versions, codes, strict=True)
        if c == "OK" and swap_s is not None and s >= swap_s
    )
    last_old = max((float(s) for s, v in zip(sent, versions, strict=True) if v == old), default=None)
    rss_start, rss_end = trace.rss[0][1], trace.rss[-1][1]
    errors = Counter(c for c in codes if c != "OK")
    growth = rss_end / rss_start - 1
    summary = {
        "requests": len(trace.calls),
        "errors": sum(errors.values()),
        "errors_by_status": dict(errors),
        "scheduled_qps": round(len(trace.calls) / trace.seconds, 1),
        "qps": round(float(np.sum(sent + latency < trace.seconds)) / trace.seconds, 1),
        "p50_ms": _ms(latency, 50),
        "p99_ms": _ms(latency, 99),
        "max_ms": round(float(latency.max()) * 1000, 2) if len(latency) else float("nan"),
        "send_lag_p99_ms": _ms(lag, 99),
        "send_lag_max_ms": round(float(lag.max()) * 1000, 2) if len(lag) else float("nan"),
        "old_version": old,
        "new_version": new,
        "swap_at_s": None if swap_s is None else round(swap_s, 3),
        "last_old_answer_at_s": None if last_old is None else round(last_old, 3),
        "versions_before_swap": dict(before),
        "versions_after_swap": dict(after),
        "rss_start_mb": round(rss_start / 1024, 1),
        "rss_end_mb": round(rss_end / 1024, 1),
        "rss_max_mb": round(max(kb for _, kb in trace.rss) / 1024, 1),
        "rss_growth": round(growth, 4),
        "windows": rows,
    }
    deploy = trace.deploy
    summary["checks"] = {
        "no_errors": not errors,
        "deploy_ok": deploy.get("returncode") == 0,
        "swapped": swap_s is not None and set(rows[-1]["versions"]) == {new},
        "only_old_before_swap": set(before) <= {old},
        "rss_growth_ok": growth < rss_limit,
        "rate_held": float(np.sum(sent + latency < trace.seconds)) >= 0.95 * len(trace.calls),
    }
    return summary


def run_soak(
    versions: Sequence[Version],
    batch: Sequence[retrieval_pb2.RetrieveRequest],
    seconds: float,
    out: Path,
    load_fraction: float = 0.8,
    probe_seconds: float = 4.0,
    probe_concurrency: int = 32,
    windows: int = 10,
    watch_interval: float = 1.0,
    rss_limit: float = RSS_GROWTH_LIMIT,
    reload_at: float = 0.5,
) -> dict[str, Any]:
    """Serves ``versions[0]`` from a fresh deployment root under ``out`` with ``tools/serve.py
    --watch`` in a child process, measures its max QPS (``probe_concurrency`` calls in flight
    for ``probe_seconds``, after a 1 s warm-up), then holds ``load_fraction`` of it for
    ``seconds`` while ``tools/deploy.py`` publishes ``versions[1]`` at ``reload_at`` of the run
    (halfway by default; short runs publish earlier, so that the swap finishes within the run
    even on a busy machine).

    Returns:
        The run's settings, the probe, :func:`summarise_soak`'s figures and checks, and the
        server's reload log lines.
    """
    from bench.serving import load

    old, new = versions[0], versions[1]
    out.mkdir(parents=True, exist_ok=True)
    root = out / "soak-root"
    shutil.rmtree(root, ignore_errors=True)
    run_tool_process("deploy", "--model", str(old.model), "--index", str(old.index), "--root", str(root))
    server_log = out / "soak-server.log"
    server, address = start_watching_server(root, server_log, watch_interval)
    try:
        rss_loaded = rss_kb(server.pid)
        probe = asyncio.run(load(address, batch, probe_concurrency, probe_seconds, 10**7))
        rate = load_fraction * probe["qps"]
        log.info("max QPS %.0f at concurrency %d: holding %.0f QPS for %.0f s", probe["qps"],
                 probe_concurrency, rate, seconds)  # fmt: skip
        deploy = [
            sys.executable, str(REPO / "tools" / "deploy.py"), "--model", str(new.model), "--index",
            str(new.index), "--root", str(root),
        ]  # fmt: skip
        trace = asyncio.run(hold_rate(address, batch, rate, seconds, server.pid, seconds * reload_at, deploy))
        alive = server.poll() is None
        final_version = model_version_of(address, timeout=30) if alive else None
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    summary = summarise_soak(trace, old.version, new.version, windows, rss_limit)
    summary["checks"]["server_alive"] = alive
    summary["checks"]["serves_new_at_end"] = final_version == new.version
    reloads = [
        line
        for line in server_log.read_text(errors="replace").splitlines()
        if "serving model" in line or "refused" in line
    ]
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": seconds,
        "load_fraction": load_fraction,
        "probe": probe,
        "target_qps": round(rate, 1),
        "requests_per_call": {"k": batch[0].k, "distinct_histories": len(batch)},
        "rss_after_load_mb": round(rss_loaded / 1024, 1),
        "server_exit_code": server.returncode,
        "deploy": trace.deploy,
        "server_reload_log": reloads,
        "rss_samples_mb": [[round(t, 1), round(kb / 1024, 1)] for t, kb in trace.rss],
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        **summary,
    }


def soak_table(result: dict[str, Any]) -> str:
    """The soak's result as Markdown: one row per window, then the totals and checks."""
    lines = [
        f"soak {result['seconds']:.0f} s at {result['target_qps']:.0f} QPS "
        f"({result['load_fraction']:.0%} of the {result['probe']['qps']:.0f} QPS measured at concurrency "
        f"{result['probe']['concurrency']}, p99 {result['probe']['p99_ms']} ms); reload at "
        f"{result['deploy'].get('start_s')} s, first answer of the new version at {result['swap_at_s']} s; "
        f"{result['date']}, load average {', '.join(f'{x:.1f}' for x in result['load_average'])}",
        "",
        "| window s | requests | errors | p50 ms | p99 ms | max ms | send lag p99 ms | versions | RSS MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    short = {result["old_version"]: "old", result["new_version"]: "new"}
    for r in result["windows"]:
        versions = ", ".join(
            f"{short.get(v, v)} {n}"
            for v, n in sorted(r["versions"].items(), key=lambda x: short.get(x[0], x[0]), reverse=True)
        )
        lines.append(
            f"| {r['from_s']:g}-{r['to_s']:g} | {r['requests']} | {r['errors']} | {r['p50_ms']} | "
            f"{r['p99_ms']} | {r['max_ms']} | {r['send_lag_p99_ms']} | {versions} | {r['rss_mb']} |"
        )
    checks = result["checks"]
    lines += [
        "",
        f"requests {result['requests']:,} ({result['scheduled_qps']:.0f}/s scheduled, "
        f"{result['qps']:.0f}/s answered within the run), errors {result['errors']} "
        f"{result['errors_by_status'] or ''}; p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, "
        f"max {result['max_ms']} ms; send lag p99 {result['send_lag_p99_ms']} ms, max "
        f"{result['send_lag_max_ms']} ms",
        f"versions before the swap {result['versions_before_swap']}, after {result['versions_after_swap']} "
        f"(old {result['old_version']}, new {result['new_version']}; last old answer at "
        f"{result['last_old_answer_at_s']} s)",
        f"server RSS {result['rss_start_mb']} MB at start, {result['rss_end_mb']} MB at end "
        f"({result['rss_growth']:+.2%}), max {result['rss_max_mb']} MB",
        "checks: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in checks.items()),
    ]
    return "\n".join(lines)


def soak_main(args: argparse.Namespace) -> int:
    """``--soak``: builds (or reuses) two versions, runs :func:`run_soak`, prints and saves it."""
    from bench.serving import requests

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    train_args = ["--model", args.soak_tower, "--epochs", str(args.soak_epochs)]
    versions = build_versions(args.out / "soak-versions", args.soak_data, train_args)
    batch = requests(args.soak_data, args.k)
    result = run_soak(
        versions, batch, args.soak, args.out, args.load_fraction, args.probe_seconds, args.probe_concurrency
    )
    result["command"] = "python -m bench.robustness " + " ".join(sys.argv[1:])
    result["data"] = str(args.soak_data)
    result["train_args"] = train_args
    text = soak_table(result)
    stem = f"soak-{args.soak:g}s"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    (args.out / f"{stem}.md").write_text(text + "\n")
    print(text)
    print(f"written to {args.out / stem}.json and .md")
    return 0 if all(result["checks"].values()) else 1


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fuzz", type=int, default=10_000, help="generated requests to send")
    p.add_argument("--seed", type=int, default=0, help="the generator's seed")
    p.add_argument("--model", type=Path, help="model artifact folder (default: a synthetic model)")
    p.add_argument("--index", type=Path, help="index artifact folder built from --model")
    p.add_argument(
        "--max-message-mb", type=float, default=FUZZ_MAX_MESSAGE_BYTES / 2**20, help="server message limit"
    )
    p.add_argument(
        "--no-undecodable", action="store_true", help="send only bytes that parse as the request message"
    )
    p.add_argument(
        "--violations", type=Path, help="write every violation and its request bytes (hex) to this file"
    )
    soak = p.add_argument_group("soak (instead of fuzzing)")
    soak.add_argument(
        "--soak",
        type=float,
        nargs="?",
        const=20.0,
        metavar="SECONDS",
        help="hold 80%% of the max QPS for SECONDS (20 if no value) with a hot reload halfway",
    )
    soak.add_argument(
        "--soak-data", type=Path, default=DEFAULT_SOAK_DATA, help="training data of both models"
    )
    soak.add_argument("--soak-tower", default="sa", help="user tower of both models (default %(default)s)")
    soak.add_argument("--soak-epochs", type=int, default=1, help="training epochs (default %(default)s)")
    soak.add_argument("--k", type=int, default=50, help="items per request (default %(default)s)")
    soak.add_argument("--load-fraction", type=float, default=0.8, help="of the max QPS (default %(default)s)")
    soak.add_argument(
        "--probe-seconds", type=float, default=4.0, help="max-QPS measurement (default %(default)s)"
    )
    soak.add_argument("--probe-concurrency", type=int, default=32, help="calls in flight while measuring it")
    soak.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="results and cached models (default %(default)s)"
    )
    args = p.parse_args(argv)
    if args.soak is not None:
        if args.soak <= 0 or not 0 < args.load_fraction <= 1 or args.probe_seconds <= 0 or args.k < 1:
            p.error("need --soak > 0, 0 < --load-fraction <= 1, --probe-seconds > 0 and --k >= 1")
        return args
    if (args.model is None) != (args.index is None):
        p.error("--model and --index go together")
    if args.fuzz < 1:
        p.error("--fuzz must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.soak is not None:
        return soak_main(args)
    max_bytes = int(args.max_message_mb * 2**20)
    context = multiprocessing.get_context("spawn")
    ports = context.Queue()
    model_dir, index_dir = (str(args.model), str(args.index)) if args.model else (None, None)
    server = context.Process(target=_serve, args=(model_dir, index_dir, max_bytes, ports), daemon=True)
    server.start()
    try:
        port = ports.get(timeout=300)
        if args.model:
            served = _served_from_dirs(args.model, max_bytes)
        else:
            served = served_by(synthetic_retriever(), SYNTHETIC_ATTRIBUTES, max_bytes)
        client = FuzzClient(f"127.0.0.1:{port}")
        client.wait_ready()
        print(
            f"fuzzing {SERVICE}* on 127.0.0.1:{port} (server pid {server.pid}) with {args.fuzz} requests, "
            f"seed {args.seed}, message limit {max_bytes} bytes",
            flush=True,
        )
        started = time.perf_counter()

        def progress(done: int) -> None:
            if done % 1000 == 0:
                rate = done / (time.perf_counter() - started)
                print(f"  {done} requests, {rate:.0f}/s", flush=True)

        report = run_fuzz(client, served, args.fuzz, args.seed, not args.no_undecodable, progress)
        counts, violations, probe_failures = report.counts, report.violations, report.probe_failures
        seconds = time.perf_counter() - started
        final_ok = client.good_request_works(served)
        client.close()
        alive = server.is_alive()
    finally:
        if server.is_alive():
            server.terminate()
        server.join(10)
    total = sum(counts.values())
    print(f"\n{total} requests in {seconds:.1f} s ({total / seconds:.0f}/s)")
    print(f"{'method':<14} {'status':<20} {'count':>7}")
    for (method, code), count in sorted(counts.items()):
        print(f"{method:<14} {code:<20} {count:>7}")
    by_code: Counter[str] = Counter()
    for (_, code), count in counts.items():
        by_code[code] += count
    print("per status: " + ", ".join(f"{code} {count}" for code, count in sorted(by_code.items())))
    print(
        f"violations: {len(violations)}; good-request probes failed: {probe_failures}; good request "
        f"after the run: {'ok' if final_ok else 'FAILED'}; server process alive: {alive}"
    )
    kinds: Counter[str] = Counter(_violation_kind(v) for v in violations)
    if kinds:
        print("violations by kind: " + "; ".join(f"{k}: {c}" for k, c in kinds.most_common()))
    shown: set[str] = set()
    for violation in violations:  # one example of each kind, in full
        if _violation_kind(violation) not in shown:
            shown.add(_violation_kind(violation))
            print(f"  {violation[:2000]}")
    if args.violations is not None:
        lines = [f"{v} | payload hex {p.hex()}" for v, p in zip(violations, report.payloads, strict=True)]
        args.violations.write_text("".join(line + "\n" for line in lines))
        print(f"all violations written to {args.violations}")
    return 0 if not violations and not probe_failures and final_ok and alive else 1


if __name__ == "__main__":
    sys.exit(main())
