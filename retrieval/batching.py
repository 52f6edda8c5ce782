"""Dynamic micro-batching: concurrent single requests answered by one batched retriever call.

Each request thread hands its :class:`~retrieval.retriever.Query` to a :class:`MicroBatcher`
and blocks; a worker thread takes every query waiting (up to ``max_batch``, waiting at most
``max_wait`` seconds for more) and answers them with one user-tower call and one index search
(:meth:`Retriever.retrieve_many`). With ``max_wait = 0`` nothing waits on purpose: a lone
request is answered at once, and under load the queries that arrived while the worker was busy
form the next batch, so batches grow exactly when batching pays.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from retrieval.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted, Unavailable
from retrieval.retriever import Query, Retrieved, Retriever

logger = logging.getLogger(__name__)


@dataclass
class _Pending:
    query: Query
    deadline: float | None  # time.monotonic() after which the answer is useless
    done: threading.Event = field(default_factory=threading.Event)
    result: Retrieved | None = None
    error: BaseException | None = None

    def finish(self, result: Retrieved | None = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


class MicroBatcher:
    """Answers single queries in batches; safe to call from many threads.

    Example:
        >>> batcher = MicroBatcher(lambda: retriever, max_batch=32)
        >>> batcher.submit(Query(["B0001"], k=10)).items[:1]
        [('B0107', 3.52, 1)]
        >>> batcher.close()
    """

    def __init__(
        self,
        retriever: Callable[[], Retriever],
        max_batch: int = 32,
        max_wait: float = 0.0,
        max_queue: int = 1024,
        observe_batch: Callable[[int], None] | None = None,
    ) -> None:
        """Starts the worker thread.

        Args:
            retriever: returns the retriever to answer the next batch with (read once per
                batch, so a hot-swapped retriever takes over between batches).
            max_batch: most queries per batch, ``1..MAX_BATCH``.
            max_wait: seconds the worker waits for more queries once it has one (0 = none).
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
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="micro-batcher", daemon=True)
        self._worker.start()

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
        if self._closed:
            raise Unavailable("the server is shutting down")
        if self._queue.qsize() >= self._max_queue:
            raise ResourceExhausted(f"server busy: {self._max_queue} requests queued, retry with backoff")
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = _Pending(query, deadline)
        self._queue.put(pending)
        if not pending.done.wait(timeout):
            raise DeadlineExceeded(f"no answer within the deadline ({timeout:.3f} s)")
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    def close(self) -> None:
        """Answers what is queued, then stops the worker; later submits get UNAVAILABLE."""
        self._closed = True
        self._queue.put(None)
        self._worker.join()

    def _take(self) -> list[_Pending] | None:
        """The next batch (waits for its first query); ``None`` once closed."""
        first = self._queue.get()
        if first is None:
            return None
        batch = [first]
        until = time.monotonic() + self._max_wait
        while len(batch) < self._max_batch:
            try:
                remaining = until - time.monotonic()
                item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._queue.put(None)  # seen again after this batch: stop then
                break
            batch.append(item)
        return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            now = time.monotonic()
            live = []
            for p in batch:
                if p.deadline is not None and p.deadline <= now:
                    p.finish(error=DeadlineExceeded("the deadline passed while the request was queued"))
                else:
                    live.append(p)
            if live:
                if self._observe_batch is not None:
                    self._observe_batch(len(live))
                self._answer(self._retriever(), live)

    @staticmethod
    def _answer(retriever: Retriever, batch: Sequence[_Pending]) -> None:
        try:
            results = retriever.retrieve_many([p.query for p in batch])
        except InvalidArgument as error:
            if len(batch) == 1:
                batch[0].finish(error=error)
                return
            # One bad query fails the whole call: answer each alone so each gets its own answer.
            for p in batch:
                MicroBatcher._answer(retriever, [p])
            return
        except Exception as error:  # every caller must be answered, whatever failed
            logger.exception("a batch of %d requests failed", len(batch))
            for p in batch:
                p.finish(error=error)
            return
        for p, result in zip(batch, results, strict=True):
            p.finish(result)
