"""Dynamic micro-batching: concurrent single requests answered by one batched retriever call.

Request threads hand their :class:`~retrieval.api.types.Query` to a :class:`MicroBatcher`.
There is no batching thread: the first caller to find the batcher idle becomes the *leader*
and answers the queries waiting at the head of the queue (up to ``max_batch``, its own among
them) with one user-tower call and one index search (:meth:`Retriever.retrieve_many`), then
hands the lead to the oldest query still waiting. So a lone request is answered on its own
thread with no hand-off at all, and under load the queries that arrived while a batch was
computing form the next one: batches grow exactly when batching pays. ``max_wait`` > 0 makes
a leader wait that long for a fuller batch.

A batch is bounded in queries (``max_batch``) and in cost (``max_cost``, in the units of
:mod:`~retrieval.serving.admission`): its queries times the costliest one's, since they share one
index search as deep as the deepest (each over-fetches by the longest exclusion list), so a
cheap but deep query shares its batch with fewer others. Queries are validated before they are
submitted (:meth:`Retriever.validate`, every check that needs no lookup); one that still
fails in its batch (a history of unknown ids, or a retriever swapped since) gets its error
alone, and the others their answers from one more call (:meth:`Retriever.retrieve_each`),
never one call each.
"""

from __future__ import annotations

import collections
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from retrieval.api.errors import DeadlineExceeded, InvalidArgument, Unavailable
from retrieval.api.types import Query, Retrieved
from retrieval.serving.admission import Overloaded
from retrieval.serving.retriever import Retriever

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Pending:
    query: Query
    cost: float  # estimated, in admission units
    deadline: float | None  # time.monotonic() time after which its caller stops waiting
    # Answered, or asked to lead: a C queue, not a threading.Event, whose set() runs a Python
    # Condition under the GIL for each of a batch's callers. A wake-up may be left over from
    # a wait that timed out; the waiter re-reads ``done`` and ``lead`` after every wake-up.
    wakes: queue.SimpleQueue[None] = field(default_factory=queue.SimpleQueue)
    lead: bool = False
    done: bool = False
    cancelled: bool = False  # its caller stopped waiting: skip it
    result: Retrieved | None = None
    error: BaseException | None = None

    def wake(self) -> None:
        self.wakes.put(None)

    def wait(self, timeout: float | None) -> bool:
        """Blocks until a wake-up (True) or ``timeout`` seconds (False)."""
        try:
            self.wakes.get(timeout=timeout)
        except queue.Empty:
            return False
        return True

    def finish(self, result: Retrieved | None = None, error: BaseException | None = None) -> None:
        self.result, self.error, self.done = result, error, True
        self.wake()


class MicroBatcher:
    """Answers single queries in batches; safe to call from many threads.

    Example:
        >>> batcher = MicroBatcher(lambda: retriever, max_batch=32)
        >>> batcher.submit(Query(["B0001"], k=10)).items[:1]
        [('B0107', 3.52, 1)]
    """

    def __init__(
        self,
        retriever: Callable[[], Retriever],
        max_batch: int = 32,
        max_wait: float = 0.0,
        max_queue: int = 1024,
        observe_batch: Callable[[int], None] | None = None,
        max_cost: float = math.inf,
        observe_queue: Callable[[int], None] | None = None,
    ) -> None:
        """
        Args:
            retriever: returns the retriever to answer the next batch with (read once per
                batch, so a hot-swapped retriever takes over between batches).
            max_batch: most queries per batch.
            max_wait: seconds a leader waits for more queries before computing (0 = none).
            max_queue: queries waiting beyond which :meth:`submit` refuses new ones.
            observe_batch: called with each batch's size (metrics).
            max_cost: most cost units per batch, as its queries times the costliest one's (a
                query costlier than that is answered alone).
            observe_queue: called with the number of queries waiting whenever it changes.

        Raises:
            ValueError: a bound out of range.
        """
        if max_batch < 1 or max_wait < 0 or max_queue < 1 or not max_cost > 0:
            raise ValueError(
                f"need max_batch >= 1, max_wait >= 0, max_queue >= 1 and max_cost > 0, "
                f"got {max_batch}, {max_wait}, {max_queue} and {max_cost}"
            )
        self._retriever = retriever
        self._max_batch = max_batch
        self._max_wait = max_wait
        self._max_queue = max_queue
        self._observe_batch = observe_batch
        self._max_cost = max_cost
        self._observe_queue = observe_queue
        self._batch_seconds = 0.01  # moving average of a batch's time, for retry hints
        self._queue: collections.deque[_Pending] = collections.deque()
        self._arrived = threading.Condition()  # guards the queue, _busy and _closed
        self._busy = False  # a leader is computing
        self._closed = False

    @property
    def queued(self) -> int:
        """Queries waiting for a batch."""
        return len(self._queue)

    def submit(self, query: Query, timeout: float | None = None, cost: float = 1.0) -> Retrieved:
        """Answers ``query`` (blocking), as :meth:`Retriever.retrieve_many` of it alone would.

        Args:
            timeout: seconds the caller can wait (its deadline); a query whose deadline passes
                while queued is dropped unanswered.
            cost: its estimated cost (:func:`~retrieval.serving.admission.query_cost`).

        Raises:
            InvalidArgument: the query is bad.
            Overloaded: ``max_queue`` queries are already waiting.
            DeadlineExceeded: the deadline passed before the query was answered.
            Unavailable: the batcher is closed.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = _Pending(query, cost, deadline)
        with self._arrived:
            if self._closed:
                raise Unavailable("the server is shutting down")
            if len(self._queue) >= self._max_queue:
                retry_after = self._batch_seconds * len(self._queue) / self._max_batch
                raise Overloaded(
                    "batch_queue_full",
                    f"server busy: {self._max_queue} requests queued, "
                    f"retry in about {retry_after * 1000:.0f} ms",
                    retry_after,
                )
            self._queue.append(pending)
            self._queued()
            pending.lead = not self._busy
            self._busy = True
            self._arrived.notify()
        while not pending.done:
            if pending.lead:
                pending.lead = False
                self._lead()
                continue
            remaining = None if deadline is None else deadline - time.monotonic()
            if (remaining is not None and remaining <= 0) or not pending.wait(remaining):
                with self._arrived:
                    if not (pending.done or pending.lead):
                        pending.cancelled = True
                        raise DeadlineExceeded(f"no answer within the deadline ({timeout:.3f} s)")
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    def close(self) -> None:
        """Refuses new queries (UNAVAILABLE); those already queued are still answered."""
        with self._arrived:
            self._closed = True

    def _lead(self) -> None:
        """Answers one batch from the head of the queue, then passes the lead on."""
        with self._arrived:
            if self._max_wait > 0:
                until = time.monotonic() + self._max_wait
                while len(self._queue) < self._max_batch and (left := until - time.monotonic()) > 0:
                    self._arrived.wait(left)
            batch = self._take()
        started = time.monotonic()
        try:
            if batch:
                if self._observe_batch is not None:
                    self._observe_batch(len(batch))
                self._answer(self._retriever(), batch)
        finally:
            with self._arrived:
                self._batch_seconds = 0.8 * self._batch_seconds + 0.2 * (time.monotonic() - started)
                while self._queue and self._queue[0].cancelled:
                    self._queue.popleft()
                self._queued()
                if self._queue:
                    head = self._queue[0]
                    head.lead = True
                    head.wake()
                else:
                    self._busy = False

    def _take(self) -> list[_Pending]:
        """The next batch from the head of the queue (under ``_arrived``): up to ``max_batch``
        queries while their count times the costliest one's fits ``max_cost``, one at least."""
        batch: list[_Pending] = []
        costliest = 0.0
        while self._queue and len(batch) < self._max_batch:
            p = self._queue[0]
            if not p.cancelled:
                if batch and (len(batch) + 1) * max(costliest, p.cost) > self._max_cost:
                    break
                batch.append(p)
                costliest = max(costliest, p.cost)
            self._queue.popleft()
        self._queued()
        return batch

    def _queued(self) -> None:
        """Reports the queue's length (under ``_arrived``)."""
        if self._observe_queue is not None:
            self._observe_queue(len(self._queue))

    @staticmethod
    def _answer(retriever: Retriever, batch: Sequence[_Pending]) -> None:
        """Answers ``batch`` (a bad query gets its own error, the others their answers); the work
        stops once every caller's deadline has passed."""
        queries = [p.query for p in batch]
        deadlines = [p.deadline for p in batch]
        deadline = None if None in deadlines else max(d for d in deadlines if d is not None)
        results: Sequence[Retrieved | InvalidArgument]
        try:
            try:
                results = retriever.retrieve_many(queries, deadline)
            except InvalidArgument:
                # A query the checks before batching let through (a history of unknown ids, a
                # retriever swapped since), refused before any tower call: one more call
                # answers the others and refuses each bad one alone.
                results = retriever.retrieve_each(queries, deadline)
        except Exception as error:  # every caller must be answered, whatever failed
            if not isinstance(error, DeadlineExceeded):
                logger.exception("a batch of %d requests failed", len(batch))
            for p in batch:
                p.finish(error=error)
            return
        for p, result in zip(batch, results, strict=True):
            if isinstance(result, InvalidArgument):
                p.finish(error=result)
            else:
                p.finish(result)
