"""Cost-based admission: which calls compute now, which wait for capacity, which are refused.

A call's cost is estimated before any work, from its requests' lengths and the served model's
shape (:func:`cost`, in *units*: one unit is about one ordinary query's share of a micro-batch,
0.4 ms of CPU on the reference machine). *Cheap* calls (an ordinary ``Retrieve``) are always
admitted and micro-batched, a batch holding as many as fit its cost (the bounds are a server's
:class:`~retrieval.serving.config.LimitsConfig`, ``batch_cost``). *Heavy* calls are never
batched with them and share a budget of cost units: one runs whenever no other heavy call does,
more run while they fit the budget, up to ``max_waiting`` wait (at most ``heavy_wait`` seconds,
or their deadline) for it, and the others are
refused at once with ``RESOURCE_EXHAUSTED`` and a retry hint. Heavy calls are also refused while
the process's resident memory is over a ceiling. A heavy call computes in chunks and lets the
cheap calls in flight finish between two chunks (:meth:`Admission.yield_to_cheap`), so cheap
calls wait for a chunk at most, not a whole batch.

Before any of that, when a call arrives, :class:`CallLimit` bounds the calls a server holds
(``--max-queued``). Every refusal here is an :class:`Overloaded`, which names its reason.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from retrieval.api.errors import ResourceExhausted
from retrieval.api.types import DEFAULT_RERANK_CANDIDATES, MergeStrategy, Query
from retrieval.api.v1 import retrieval_pb2
from retrieval.serving.config import LimitsConfig
from retrieval.serving.memory import resident_bytes

if TYPE_CHECKING:
    from retrieval.serving.retriever import Retriever

__all__ = [
    "Admission",
    "CallLimit",
    "ModelSize",
    "Overloaded",
    "call_cost",
    "cost",
    "query_cost",
    "request_cost",
]

ID_UNIT = 1000
"""Ids looked up (history, exclude, allow, unclicked) that cost one unit."""

CANDIDATE_UNIT = 1000
"""Candidates searched and merged (interests × each one's search depth) that cost one unit."""

DIVERSITY_STEPS = 16
"""Greedy picks of the DIVERSITY merge that cost one unit (each is a Python step over every
candidate: ~25 µs at 2,000 candidates)..."""

DIVERSITY_CANDIDATES = 10_000
"""...and the candidates that double a pick's cost."""

ROUND_ROBIN_PICKS = 200
"""Items the ROUND_ROBIN merge picks (one Python step each) for one unit."""

RERANK_UNIT = 40
"""Candidates a ranker scores for one unit."""

EXPLAIN_UNITS = 3.0
"""Units of an explanation (one more call of the user tower's weights)."""


@dataclass(frozen=True)
class ModelSize:
    """What a query's cost depends on besides the query itself.

    Attributes:
        num_interests: interests per user (K): each searches the index.
        num_items: items in the index: no search goes deeper.
    """

    num_interests: int
    num_items: int

    @classmethod
    def of(cls, retriever: Retriever) -> ModelSize:
        """The size of the model and index ``retriever`` serves."""
        return cls(retriever.model.num_interests, retriever.index.ntotal)


def cost(
    size: ModelSize,
    *,
    ids: int,
    k: int,
    depth: int,
    excluded: int,
    merge: MergeStrategy = MergeStrategy.MAX_SCORE,
    reranked: int = 0,
    explain: bool = False,
) -> float:
    """Estimated cost of a query in units (the module docstring; docs/serving.md has the
    formula and the measurements behind each term)::

        1                                         its share of a tower call and a search
        + ids / 1000                              ids looked up
        + candidates / 1000                       candidates = K × min(depth + excluded, items)
        + k × (1 + min(candidates, items) / 10,000) / 16    DIVERSITY: k greedy picks
        + k / 200                                 ROUND_ROBIN: k picks
        + reranked / 40                           candidates the ranker scores
        + 3 with explain                          one more tower call

    Args:
        size: the served model's interests and items.
        ids: ids it sends (history, exclude, allow and unclicked lists).
        k: items it asks for.
        depth: each interest's search depth before exclusions: the largest of ``k``,
            ``per_interest_k`` and the rerank's candidates.
        excluded: ids its search must drop (history and exclude list): the search fetches that
            many more per interest.
        merge: how its interests' lists are merged.
        reranked: candidates a ranker scores (0 = no rerank).
        explain: whether it asks for explanations.
    """
    candidates = size.num_interests * min(depth + excluded, size.num_items)
    units = 1 + ids / ID_UNIT + candidates / CANDIDATE_UNIT + reranked / RERANK_UNIT
    if merge is MergeStrategy.DIVERSITY:
        units += k * (1 + min(candidates, size.num_items) / DIVERSITY_CANDIDATES) / DIVERSITY_STEPS
    elif merge is MergeStrategy.ROUND_ROBIN:
        units += k / ROUND_ROBIN_PICKS
    return units + (EXPLAIN_UNITS if explain else 0.0)


def query_cost(query: Query, size: ModelSize) -> float:
    """:func:`cost` of a :class:`Query`."""
    rerank = query.rerank
    reranked = 0 if rerank is None else rerank.candidates or max(query.k, DEFAULT_RERANK_CANDIDATES)
    unclicked = 0 if rerank is None else len(rerank.unclicked)
    return cost(
        size,
        ids=len(query.history) + len(query.exclude) + len(query.allow) + unclicked,
        k=query.k,
        depth=max(query.k, query.per_interest_k, reranked),
        excluded=len(query.history) + len(query.exclude),
        merge=query.merge,
        reranked=reranked,
        explain=query.explain,
    )


_MERGES = {
    retrieval_pb2.DIVERSITY: MergeStrategy.DIVERSITY,
    retrieval_pb2.ROUND_ROBIN: MergeStrategy.ROUND_ROBIN,
}
"""The request's merge numbers that cost more than the max-score merge."""


def request_cost(request: retrieval_pb2.RetrieveRequest, size: ModelSize) -> float:
    """:func:`cost` of a parsed request, from its fields' lengths: nothing is copied, so a call
    is admitted or refused before its ids become Python objects."""
    history = len(request.history) or len(request.events)
    rerank = request.rerank
    reranked = 0
    if request.HasField("rerank"):
        reranked = rerank.candidates or max(request.k, DEFAULT_RERANK_CANDIDATES)
    return cost(
        size,
        ids=history + len(request.exclude_ids) + len(request.allow_ids) + len(rerank.unclicked),
        k=request.k,
        depth=max(request.k, request.per_interest_k, reranked),
        excluded=history + len(request.exclude_ids),
        merge=_MERGES.get(request.merge, MergeStrategy.MAX_SCORE),
        reranked=reranked,
        explain=request.explain,
    )


def call_cost(queries: Sequence[Query] | Sequence[retrieval_pb2.RetrieveRequest], size: ModelSize) -> float:
    """Estimated cost of a call: the sum of its queries' (or parsed requests')."""
    return sum(query_cost(q, size) if isinstance(q, Query) else request_cost(q, size) for q in queries)


class Overloaded(ResourceExhausted):
    """A call refused for want of capacity (``RESOURCE_EXHAUSTED``).

    Attributes:
        refusal: why, the ``reason`` label of ``retrieval_refusals_total``: ``queue_full``
            (``--max-queued`` calls held), ``batch_queue_full``, ``heavy_capacity`` (heavy calls
            hold the budget, no room to wait), ``memory``, ``unread_large`` (a large request
            not read while heavy calls leave no room), ``rate_limit``, ``message_size`` (a
            request gRPC did not deliver: over the size limit, or cancelled while sent).
    """

    def __init__(self, refusal: str, message: str, retry_after: float | None) -> None:
        super().__init__(message, retry_after)
        self.refusal = refusal


class Admission:
    """Admits calls by estimated cost (see the module docstring); safe to use from many threads.

    Example:
        >>> admission = Admission(LimitsConfig(max_cost=256))
        >>> with admission.admit(call_cost(queries, size), timeout=context.time_remaining()):
        ...     answer(queries)
    """

    def __init__(
        self,
        limits: LimitsConfig,
        memory: Callable[[], int | None] = resident_bytes,
        observe_waiting: Callable[[int], None] | None = None,
    ) -> None:
        """``memory`` tells the resident memory; ``observe_waiting`` is called with the number
        of heavy calls waiting whenever it changes (a metrics gauge)."""
        self.limits = limits
        self._memory = memory
        self._observe_waiting = observe_waiting
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
            Overloaded: a heavy call that cannot be admitted, with ``retry_after``.
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
        wait = self.limits.heavy_wait if timeout is None else min(timeout, self.limits.heavy_wait)
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
            Overloaded: with ``retry_after``.
        """
        if size > self.limits.cheap_bytes:
            with self._lock:
                if self._heavy and self._waiting >= self.limits.max_waiting:
                    call = f"{self._waiting} calls wait: this one ({size / 2**20:.1f} MiB) was not read"
                    raise self._busy("unread_large", 0.0, call)

    def yield_to_cheap(self, timeout: float = 0.05) -> None:
        """Waits (at most ``timeout`` seconds) until no cheap call is in flight: a heavy call
        calls it between two chunks of its work."""
        with self._lock:
            self._cheap_done.wait_for(lambda: not self._cheap, timeout)

    def chunks(self, queries: Sequence[Query], costs: Sequence[float]) -> list[Sequence[Query]]:
        """``queries`` cut into consecutive runs of at most ``chunk_cost`` units by their
        ``costs`` (one query at least each): the work a heavy call does between two yields."""
        runs: list[Sequence[Query]] = []
        start, total = 0, 0.0
        for i, cost in enumerate(costs):
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
            raise Overloaded(
                "memory",
                f"server memory {memory / 2**20:.0f} MiB is over its {ceiling / 2**20:.0f} MiB ceiling: "
                f"heavy calls (cost {cost:.0f}) are refused until it falls; retry later",
                retry_after=self.limits.heavy_wait,
            )
        deadline = time.monotonic() + max(wait, 0.0)
        with self._lock:
            if not self._fits(cost) and self._waiting >= self.limits.max_waiting:
                raise self._busy("heavy_capacity", cost, f"this call costs {cost:.0f} (no room to wait)")
            self._set_waiting(+1)
            try:
                while not self._fits(cost):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self._busy(
                            "heavy_capacity", cost, f"this call costs {cost:.0f} (waited {wait:.2f} s)"
                        )
                    self._capacity.wait(left)
            finally:
                self._set_waiting(-1)
            self._heavy += 1
            self._heavy_cost += cost

    def _set_waiting(self, change: int) -> None:
        """Counts a heavy call starting or ending its wait (under the lock)."""
        self._waiting += change
        if self._observe_waiting is not None:
            self._observe_waiting(self._waiting)

    def _leave_heavy(self, cost: float, seconds: float) -> None:
        with self._lock:
            self._heavy -= 1
            self._heavy_cost -= cost
            self._seconds_per_unit = 0.8 * self._seconds_per_unit + 0.2 * seconds / cost
            self._capacity.notify_all()

    def _fits(self, cost: float) -> bool:
        return not self._heavy or self._heavy_cost + cost <= self.limits.max_cost

    def _busy(self, refusal: str, cost: float, call: str) -> Overloaded:
        """The refusal of a call of ``cost`` (``call`` says what it is and why it is refused)."""
        retry_after = max(0.01, (self._heavy_cost + cost - self.limits.max_cost) * self._seconds_per_unit)
        return Overloaded(
            refusal,
            f"server busy: heavy calls hold {self._heavy_cost:.0f} of {self.limits.max_cost:.0f} cost units "
            f"and {call}; retry in about {retry_after * 1000:.0f} ms",
            retry_after=retry_after,
        )


class CallLimit:
    """At most ``limit`` calls held at once, computing or waiting for a request thread (the
    server's ``--max-queued``): checked when a call arrives, before it takes a thread or is read.
    Thread-safe.

    Example:
        >>> calls = CallLimit(128)
        >>> if calls.enter():
        ...     try: answer()
        ...     finally: calls.leave(seconds)
    """

    def __init__(self, limit: int, observe: Callable[[int], None] | None = None) -> None:
        """``observe`` is called with the number of calls held whenever it changes (a gauge).

        Raises:
            ValueError: ``limit`` < 1.
        """
        if limit < 1:
            raise ValueError(f"the call limit must be >= 1, got {limit}")
        self.limit = limit
        self._observe = observe
        self._lock = threading.Lock()
        self._held = 0
        self._seconds = 0.01  # moving average of a call's time held

    @property
    def held(self) -> int:
        """Calls held now."""
        return self._held

    def enter(self) -> bool:
        """Holds one more call; ``False`` (nothing held) when ``limit`` are held already."""
        with self._lock:
            if self._held >= self.limit:
                return False
            self._change(+1)
            return True

    def leave(self, seconds: float) -> None:
        """Releases a call :meth:`enter` held, which took ``seconds``."""
        with self._lock:
            self._change(-1)
            self._seconds = 0.9 * self._seconds + 0.1 * seconds

    def refusal(self) -> Overloaded:
        """The refusal of a call that found ``limit`` calls held: retry after about one call's
        time, when some will have left."""
        retry_after = min(max(self._seconds, 0.01), 1.0)
        return Overloaded(
            "queue_full",
            f"server busy: it holds {self.limit} calls already (--max-queued); "
            f"retry in about {retry_after * 1000:.0f} ms",
            retry_after,
        )

    def _change(self, by: int) -> None:
        self._held += by
        if self._observe is not None:
            self._observe(self._held)
