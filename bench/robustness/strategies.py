"""The Hypothesis generator of requests: typed messages in and out of the documented limits,
hand-made wire bytes and bytes that are not a valid message."""

from __future__ import annotations

import math
from collections.abc import Sequence

from hypothesis import strategies as st

from bench.robustness.calls import (
    DIVERSITY,
    FUZZ_MAX_MESSAGE_BYTES,
    MAX_BATCH,
    MAX_FILTER_IDS,
    MAX_HISTORY,
    MAX_K,
    MAX_PER_INTEREST_K,
    MAX_USER_ID,
    MERGES,
    REQUEST_TYPES,
    Call,
    make_call,
)
from retrieval.api.v1 import retrieval_pb2

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
    """One event per id, newest first going back one second each."""
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
        known = self.known = list(known)
        self.max_message_bytes = max_message_bytes
        self._ids(st.sampled_from(known), categories)
        self._numbers()
        self._events()
        self.small_lists = st.lists(self.item_id, max_size=6)
        self.retrieve = self._retrieve()
        self.small_retrieve = self._retrieve(small=True)
        sampled = st.sampled_from(known)
        self.good_retrieve = st.builds(
            retrieval_pb2.RetrieveRequest,
            history=st.lists(st.one_of(sampled, sampled, sampled, self.item_id), min_size=1, max_size=12),
            k=self.k["in range"],
            exclude_ids=st.lists(sampled, max_size=4),
            return_interests=st.booleans(),
        ).filter(lambda r: any(h in known for h in r.history))
        self.batch = self._batch()

    def _huge(self, sizes: list[int]) -> st.SearchStrategy[list[str]]:
        """Lists of one of ``sizes`` ids, known, unknown or mixed (:func:`_huge_list`)."""
        known = self.known
        modes = st.sampled_from(["known", "unknown", "mixed"])
        return st.builds(lambda n, mode: _huge_list(known, n, mode), st.sampled_from(sizes), modes)

    def _ids(self, sampled: st.SearchStrategy[str], categories: Sequence[str]) -> None:
        """Item ids (known, odd, any text), the id lists of histories and filters, categories."""
        some_category = st.sampled_from(sorted(categories)) if categories else st.just("")
        self.category = {
            "in range": st.one_of(st.just(""), st.just(""), st.just(""), some_category),
            "wild": st.one_of(st.just(""), some_category, st.sampled_from(ODD_IDS), st.text(max_size=12)),
        }
        self.item_id = st.one_of(sampled, sampled, st.sampled_from(ODD_IDS), st.text(max_size=24))
        small = st.lists(self.item_id, max_size=12)
        duplicates = st.builds(lambda item, n: [item] * n, sampled, st.integers(2, 60))
        huge = self._huge
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

    def _numbers(self) -> None:
        """``k``, ``per_interest_k``, ``merge``, ``diversity_lambda`` and ``user_id``, per mode."""
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

    def _events(self) -> None:
        """Events with any timestamp and action, up to and over the history limit."""
        timestamps = st.one_of(st.integers(0, 2_000_000_000), st.integers(-INT64, INT64 - 1))
        actions = st.one_of(st.sampled_from(["", "1", "2", "3", "click", "buy"]), st.text(max_size=8))
        event = st.builds(retrieval_pb2.Event, item_id=self.item_id, timestamp=timestamps, action=actions)
        small_events = st.lists(event, max_size=12)
        huge_events = st.builds(
            _huge_events,
            self._huge([MAX_HISTORY - 1, MAX_HISTORY, MAX_HISTORY + 1]),
            st.integers(-INT64 + 20_000, INT64 - 1),
        )
        self.events = st.one_of(small_events, small_events, small_events, small_events, huge_events)
        self.small_events = st.lists(st.builds(retrieval_pb2.Event, item_id=self.item_id), max_size=6)

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
            typed.map(lambda mr: make_call(mr[0], mr[1].SerializeToString(), "typed")),
            typed.map(lambda mr: make_call(mr[0], mr[1].SerializeToString(), "typed")),
            typed.map(lambda mr: make_call(mr[0], mr[1].SerializeToString(), "typed")),
            self.wire().map(lambda mp: make_call(mp[0], mp[1], "wire")),
        ]
        if undecodable:
            strategies.append(self.undecodable().map(lambda mp: make_call(mp[0], mp[1], "undecodable")))
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
