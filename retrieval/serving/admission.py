"""Cost-based admission: which calls compute now, which wait for capacity, which are refused.

A call's cost is estimated from its requests before any work (:func:`query_cost`): the ids it
sends (history, filters, unclicked) times the depth it asks for. *Cheap* calls (an ordinary
single ``Retrieve``) are always admitted: they must keep flowing whatever else arrives. *Heavy*
calls share a budget of cost units: one runs whenever no other heavy call does, more run while
they fit the budget, up to ``max_waiting`` wait (at most ``max_wait`` seconds, or their
deadline) for it, and the others are refused at once with ``RESOURCE_EXHAUSTED`` and a retry
hint. Heavy calls are also refused while the process's resident memory is over a ceiling. A
heavy call computes in chunks and lets the cheap calls in flight finish between two chunks
(:meth:`Admission.yield_to_cheap`), so cheap calls wait for a chunk at most, not a whole batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from retrieval.api.errors import ResourceExhausted
from retrieval.api.types import Query
from retrieval.api.v1 import retrieval_pb2
from retrieval.serving.memory import resident_bytes

__all__ = ["Admission", "AdmissionLimits", "call_cost", "cost", "query_cost", "request_cost"]

ID_UNIT = 1000
"""Ids that add one unit to a query's cost."""

DEPTH_UNIT = 1000
"""Candidates per interest (or reranked) that double a query's cost."""


def cost(ids: int, depth: int, explain: bool = False) -> float:
    """Estimated cost of a query sending ``ids`` ids (history, exclude, allow and unclicked
    lists) and asking for ``depth`` candidates (the largest of ``k``, ``per_interest_k`` and
    the rerank's), in units of an ordinary query: ``(1 + ids / 1000) * (1 + depth / 1000)``,
    doubled when it asks for explanations (one more user-tower call)."""
    return (1 + ids / ID_UNIT) * (1 + depth / DEPTH_UNIT) * (2 if explain else 1)


def query_cost(query: Query) -> float:
    """:func:`cost` of a :class:`Query`."""
    unclicked = 0 if query.rerank is None else len(query.rerank.unclicked)
    ids = len(query.history) + len(query.exclude) + len(query.allow) + unclicked
    depth = max(query.k, query.per_interest_k, 0 if query.rerank is None else query.rerank.candidates)
    return cost(ids, depth, query.explain)


def request_cost(request: retrieval_pb2.RetrieveRequest) -> float:
    """:func:`cost` of a parsed request, from its fields' lengths: nothing is copied, so a call
    is admitted or refused before its ids become Python objects."""
    history = len(request.history) or len(request.events)
    ids = history + len(request.exclude_ids) + len(request.allow_ids) + len(request.rerank.unclicked)
    return cost(ids, max(request.k, request.per_interest_k, request.rerank.candidates), request.explain)


def call_cost(queries: Sequence[Query] | Sequence[retrieval_pb2.RetrieveRequest]) -> float:
    """Estimated cost of a call: the sum of its queries' (or parsed requests')."""
    return sum(query_cost(q) if isinstance(q, Query) else request_cost(q) for q in queries)


@dataclass(frozen=True)
class AdmissionLimits:
    """The bounds of :class:`Admission`.

    Attributes:
        cheap_cost: calls costing at most this are cheap: always admitted, never queued.
        cheap_bytes: requests larger than this (bytes) are not parsed while heavy calls leave
            no room to wait (parsing a few MiB holds the interpreter for tens of ms).
        max_cost: cost units heavy calls may hold at once (a lone heavy call runs whatever
            its cost).
        max_waiting: heavy calls that may wait for capacity; more are refused at once.
        max_wait: seconds a heavy call waits for capacity (less if its deadline is nearer).
        chunk_cost: cost units a heavy call computes between two yields to cheap calls.
        max_memory_bytes: resident memory above which heavy calls are refused; ``None`` = no
            ceiling.
    """

    cheap_cost: float = 16.0
    cheap_bytes: int = 256 * 1024
    max_cost: float = 128.0
    max_waiting: int = 2
    max_wait: float = 1.0
    chunk_cost: float = 64.0
    max_memory_bytes: int | None = None

    def __post_init__(self) -> None:
        if min(self.cheap_cost, self.max_cost, self.chunk_cost, self.max_wait) <= 0 or self.max_waiting < 0:
            raise ValueError(f"admission limits must be > 0 (max_waiting >= 0), got {self}")
        if self.max_memory_bytes is not None and self.max_memory_bytes <= 0:
            raise ValueError(f"max_memory_bytes must be > 0 or None, got {self.max_memory_bytes}")


class Admission:
    """Admits calls by estimated cost (see the module docstring); safe to use from many threads.

    Example:
        >>> admission = Admission(AdmissionLimits(max_cost=256))
        >>> with admission.admit(call_cost(queries), timeout=context.time_remaining()):
        ...     answer(queries)
    """

    def __init__(self, limits: AdmissionLimits, memory: Callable[[], int | None] = resident_bytes) -> None:
        self.limits = limits
        self._memory = memory
        self._lock = threading.Lock()
        self._capacity = threading.Condition(self._lock)  # a heavy call left
        self._heavy_cost = 0.0  # cost units of the heavy calls admitted
        self._heavy = 0  # heavy calls admitted
        self._waiting = 0
        self._cheap = 0  # cheap calls in flight
        self._cheap_done = threading.Condition(self._lock)
        self._seconds_per_unit = 0.001  # moving average of heavy calls' time per cost unit

    def is_cheap(self, cost: float) -> bool:
        return cost <= self.limits.cheap_cost

    @contextmanager
    def admit(self, cost: float, timeout: float | None = None) -> Iterator[None]:
        """Holds ``cost`` units while the block runs.

        Args:
            timeout: seconds the caller can wait (its deadline); ``None`` = ``max_wait``.

        Raises:
            ResourceExhausted: a heavy call that cannot be admitted, with ``retry_after``.
        """
        if self.is_cheap(cost):
            with self._lock:
                self._cheap += 1
            try:
                yield
            finally:
                with self._lock:
                    self._cheap -= 1
                    if not self._cheap:
                        self._cheap_done.notify_all()
            return
        wait = self.limits.max_wait if timeout is None else min(timeout, self.limits.max_wait)
        self._enter_heavy(cost, wait)
        started = time.monotonic()
        try:
            yield
        finally:
            self._leave_heavy(cost, time.monotonic() - started)

    def screen(self, size: int) -> None:
        """Refuses a request of ``size`` bytes before it is parsed when it is large and heavy
        calls leave no room to wait: a flood of large requests is refused at the cost of
        receiving them.

        Raises:
            ResourceExhausted: with ``retry_after``.
        """
        if size > self.limits.cheap_bytes:
            with self._lock:
                if self._heavy and self._waiting >= self.limits.max_waiting:
                    call = f"{self._waiting} calls wait: this one ({size / 2**20:.1f} MiB) was not read"
                    raise self._busy(0.0, call)

    def yield_to_cheap(self, timeout: float = 0.05) -> None:
        """Waits (at most ``timeout`` seconds) until no cheap call is in flight: a heavy call
        calls it between two chunks of its work."""
        with self._lock:
            self._cheap_done.wait_for(lambda: not self._cheap, timeout)

    def chunks(self, queries: Sequence[Query]) -> list[Sequence[Query]]:
        """``queries`` cut into consecutive runs of at most ``chunk_cost`` units (one query at
        least each): the work a heavy call does between two yields."""
        runs: list[Sequence[Query]] = []
        start, total = 0, 0.0
        for i, query in enumerate(queries):
            cost = query_cost(query)
            if i > start and total + cost > self.limits.chunk_cost:
                runs.append(queries[start:i])
                start, total = i, 0.0
            total += cost
        runs.append(queries[start:])
        return runs

    def _enter_heavy(self, cost: float, wait: float) -> None:
        ceiling = self.limits.max_memory_bytes
        memory = None if ceiling is None else self._memory()
        if memory is not None and ceiling is not None and memory > ceiling:
            raise ResourceExhausted(
                f"server memory {memory / 2**20:.0f} MiB is over its {ceiling / 2**20:.0f} MiB ceiling: "
                f"heavy calls (cost {cost:.0f}) are refused until it falls; retry later",
                retry_after=self.limits.max_wait,
            )
        deadline = time.monotonic() + max(wait, 0.0)
        with self._lock:
            if not self._fits(cost) and self._waiting >= self.limits.max_waiting:
                raise self._busy(cost, f"this call costs {cost:.0f} (no room to wait)")
            self._waiting += 1
            try:
                while not self._fits(cost):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self._busy(cost, f"this call costs {cost:.0f} (waited {wait:.2f} s)")
                    self._capacity.wait(left)
            finally:
                self._waiting -= 1
            self._heavy += 1
            self._heavy_cost += cost

    def _leave_heavy(self, cost: float, seconds: float) -> None:
        with self._lock:
            self._heavy -= 1
            self._heavy_cost -= cost
            self._seconds_per_unit = 0.8 * self._seconds_per_unit + 0.2 * seconds / cost
            self._capacity.notify_all()

    def _fits(self, cost: float) -> bool:
        return not self._heavy or self._heavy_cost + cost <= self.limits.max_cost

    def _busy(self, cost: float, call: str) -> ResourceExhausted:
        """The refusal of a call of ``cost`` (``call`` says what it is and why it is refused)."""
        retry_after = max(0.01, (self._heavy_cost + cost - self.limits.max_cost) * self._seconds_per_unit)
        return ResourceExhausted(
            f"server busy: heavy calls hold {self._heavy_cost:.0f} of {self.limits.max_cost:.0f} cost units "
            f"and {call}; retry in about {retry_after * 1000:.0f} ms",
            retry_after=retry_after,
        )
