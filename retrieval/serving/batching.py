"""Dynamic micro-batching: concurrent single requests answered by one batched retriever call.

Request threads hand their :class:`~retrieval.api.types.Query` to a :class:`MicroBatcher`.
There is no batching thread: the first caller to find the batcher idle becomes the *leader*
and answers the queries waiting at the head of the queue (up to ``max_batch``, its own among
them) with one user-tower call and one index search (:meth:`Retriever.retrieve_many`), then
hands the lead to the oldest query still waiting. So a lone request is answered on its own
thread with no hand-off at all, and under load the queries that arrived while a batch was
computing form the next one: batches grow exactly when batching pays. ``max_wait`` > 0 makes
a leader wait that long for a fuller batch.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from retrieval.api.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted, Unavailable
from retrieval.api.types import Query, Retrieved
from retrieval.serving.retriever import Retriever

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Pending:
    query: Query
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
    ) -> None:
        """
        Args:
            retriever: returns the retriever to answer the next batch with (read once per
                batch, so a hot-swapped retriever takes over between batches).
            max_batch: most queries per batch.
            max_wait: seconds a leader waits for more queries before computing (0 = none).
            max_queue: queries waiting beyond which :meth:`submit` refuses new ones.
            observe_batch: called with each batch's size (metrics).

        Raises:
            ValueError: a bound out of range.
        """
        if max_batch < 1 or max_wait < 0 or max_queue < 1:
            raise ValueError(
                f"need max_batch >= 1, max_wait >= 0 and max_queue >= 1, "
                f"got {max_batch}, {max_wait} and {max_queue}"
            )
        self._retriever = retriever
        self._max_batch = max_batch
        self._max_wait = max_wait
        self._max_queue = max_queue
        self._observe_batch = observe_batch
        self._queue: collections.deque[_Pending] = collections.deque()
        self._arrived = threading.Condition()  # guards the queue, _busy and _closed
        self._busy = False  # a leader is computing
        self._closed = False

    @property
    def queued(self) -> int:
        """Queries waiting for a batch."""
        return len(self._queue)

    def submit(self, query: Query, timeout: float | None = None) -> Retrieved:
        """Answers ``query`` (blocking), as :meth:`Retriever.retrieve_many` of it alone would.

        Args:
            timeout: seconds the caller can wait (its deadline); a query whose deadline passes
                while queued is dropped unanswered.

        Raises:
            InvalidArgument: the query is bad.
            ResourceExhausted: ``max_queue`` queries are already waiting.
            DeadlineExceeded: the deadline passed before the query was answered.
            Unavailable: the batcher is closed.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = _Pending(query, deadline)
        with self._arrived:
            if self._closed:
                raise Unavailable("the server is shutting down")
            if len(self._queue) >= self._max_queue:
                raise ResourceExhausted(f"server busy: {self._max_queue} requests queued, retry with backoff")
            self._queue.append(pending)
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
            batch: list[_Pending] = []
            while self._queue and len(batch) < self._max_batch:
                p = self._queue.popleft()
                if not p.cancelled:
                    batch.append(p)
        try:
            if batch:
                if self._observe_batch is not None:
                    self._observe_batch(len(batch))
                self._answer(self._retriever(), batch)
        finally:
            with self._arrived:
                while self._queue and self._queue[0].cancelled:
                    self._queue.popleft()
                if self._queue:
                    head = self._queue[0]
                    head.lead = True
                    head.wake()
                else:
                    self._busy = False

    @staticmethod
    def _answer(retriever: Retriever, batch: Sequence[_Pending]) -> None:
        """Answers ``batch``; the work stops once every caller's deadline has passed."""
        deadlines = [p.deadline for p in batch]
        deadline = None if None in deadlines else max(d for d in deadlines if d is not None)
        try:
            results = retriever.retrieve_many([p.query for p in batch], deadline)
        except InvalidArgument as error:
            if len(batch) == 1:
                batch[0].finish(error=error)
                return
            # One bad query fails the whole call: answer each alone so each gets its own answer.
            for p in batch:
                MicroBatcher._answer(retriever, [p])
            return
        except Exception as error:  # every caller must be answered, whatever failed
            if not isinstance(error, DeadlineExceeded):
                logger.exception("a batch of %d requests failed", len(batch))
            for p in batch:
                p.finish(error=error)
            return
        for p, result in zip(batch, results, strict=True):
            p.finish(result)
