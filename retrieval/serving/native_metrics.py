"""The native engine's counts on the metrics endpoint, under the Python engine's names.

The C++ engine counts every call by method and status code with its latency, every call that did
not end OK by why (a capacity refusal's reason, else the code's name), and the rows of each
kernel call, at the buckets :class:`~retrieval.serving.metrics.Metrics` uses
(:meth:`NativeServer.metrics`). :class:`NativeMetrics` moves what was counted since its last read
into a :class:`Metrics`: ``retrieval_requests_total``, ``retrieval_request_seconds``,
``retrieval_refusals_total`` (by the caller's identity of the access file, ``""`` when
there is none or it is not known),
``retrieval_batch_size`` and ``retrieval_queue_depth`` (calls held, queries waiting for a batch,
heavy calls waiting), before every scrape of an endpoint served here and every
:data:`SYNC_INTERVAL` seconds (a serving group's worker, whose supervisor reads the counts its
files hold). ``retrieval_index_search_seconds`` is timed by the kernel itself
(:meth:`NativeKernel.search <retrieval.serving.native_kernel.NativeKernel.search>`), the model
version and refusals by :meth:`Metrics.follow`, as for the Python engine.

Example:
    >>> moved = NativeMetrics(engine, metrics)
    >>> moved.start()
    >>> moved.stop()  # the last counts moved too
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from prometheus_client.metrics import Histogram

from retrieval.serving.metrics import Metrics
from retrieval.serving.native import NativeServer, code_names

__all__ = ["SYNC_INTERVAL", "NativeMetrics"]

SYNC_INTERVAL = 1.0
"""Seconds between two moves of the engine's counts (besides one before each scrape)."""


class NativeMetrics:
    """Moves the counts of ``engine`` into ``metrics``: what was added since the last move."""

    def __init__(self, engine: NativeServer, metrics: Metrics) -> None:
        self._engine = engine
        self._metrics = metrics
        self._lock = threading.Lock()
        self._last: dict[str, Any] = {"latency": {}, "refusals": {}, "batches": ((), 0.0)}
        self._stopped = threading.Event()
        metrics.before_scrape(self.sync)

    def start(self, interval: float = SYNC_INTERVAL) -> None:
        """Moves the counts every ``interval`` seconds in a daemon thread, until :meth:`stop`."""

        def every() -> None:
            while not self._stopped.wait(interval):
                self.sync()

        threading.Thread(target=every, name="native-metrics", daemon=True).start()

    def stop(self) -> None:
        """Stops the moves, after a last one (the calls answered up to now are all counted)."""
        self._stopped.set()
        self.sync()

    def sync(self) -> None:
        """Moves what the engine counted since the last move, and sets the queue depths."""
        with self._lock:
            now = self._engine.metrics()
            last, metrics = self._last, self._metrics
            for (method, number), (buckets, seconds) in now["latency"].items():
                old_buckets, old_seconds = last["latency"].get((method, number), ((), 0.0))
                added = _added(buckets, old_buckets)
                code = code_names()[number]
                metrics.requests.labels(method, code).inc(sum(added))
                _observed(metrics.latency.labels(method, code), added, seconds - old_seconds)
            for (method, number, reason, identity), count in now["refusals"].items():
                code = code_names()[number]
                added_calls = count - last["refusals"].get((method, number, reason, identity), 0)
                metrics.refusals.labels(method, code, reason or code.lower(), identity).inc(added_calls)
            buckets, rows = now["batches"]
            old_buckets, old_rows = last["batches"]
            _observed(metrics.batch_size, _added(buckets, old_buckets), rows - old_rows)
            for queue, depth in now["queues"].items():
                metrics.queue.labels(queue).set(depth)
            self._last = now


def _added(counts: Sequence[int], before: Sequence[int]) -> list[int]:
    """``counts`` minus ``before`` (empty: nothing before), bucket by bucket."""
    return [n - (before[i] if before else 0) for i, n in enumerate(counts)]


def _observed(histogram: Histogram, added: Sequence[int], total: float) -> None:
    """Adds ``added[i]`` observations to bucket ``i`` of ``histogram`` (a child: its labels
    given), summing to ``total``: what as many :meth:`Histogram.observe` calls would have added.
    prometheus_client has no public call for counts kept elsewhere; a bucket's value is what
    ``observe`` increments (not cumulative), in one process and in a group's files alike."""
    if not any(added):
        return
    histogram._sum.inc(total)
    for bucket, count in zip(histogram._buckets, added, strict=True):
        if count:
            bucket.inc(count)
