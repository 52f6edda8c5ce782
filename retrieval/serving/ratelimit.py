"""Per-client rate limits: a token bucket per identity (or per client address).

A bucket holds up to ``burst`` tokens and gains ``rate`` tokens a second; each call takes one,
and a call that finds the bucket empty is refused, told how long until a token is back.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

MAX_BUCKETS = 10_000
"""Buckets kept before the full ones (idle callers, which a new bucket would equal) are dropped."""


@dataclass
class TokenBucket:
    """``tokens`` of at most ``burst``, refilled at ``rate`` a second since ``updated``.

    Example:
        >>> bucket = TokenBucket(rate=2, burst=1, tokens=1, updated=0.0)
        >>> bucket.take(0.0), bucket.take(0.0)  # the second waits half a second for its token
        (0.0, 0.5)
    """

    rate: float
    burst: float
    tokens: float
    updated: float

    def refill(self, now: float) -> None:
        """Adds the tokens earned since the last update, up to ``burst``."""
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    def take(self, now: float) -> float:
        """Takes a token if there is one.

        Returns:
            0.0 when a token was taken, else the seconds until one is available.
        """
        self.refill(now)
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class RateLimiter:
    """One :class:`TokenBucket` per identity, ``rate`` requests a second with bursts of ``burst``
    (both overridable per identity); thread-safe.

    Example:
        >>> limiter = RateLimiter(rate=100, burst=200)
        >>> limiter.wait("team-a")  # 0.0: allowed
        >>> limiter.wait("team-b", rate=10, burst=10)  # an identity with its own limit
    """

    def __init__(
        self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``burst`` defaults to one second's worth of requests (at least 1); ``clock`` tells the
        time in seconds.

        Raises:
            ValueError: a rate that is not positive and finite, or a burst below 1.
        """
        self.rate, self.burst = check_limit(rate, max(1.0, rate) if burst is None else burst)
        self._clock = clock
        self._buckets: dict[Hashable, TokenBucket] = {}
        self._lock = threading.Lock()

    def limit(self, rate: float | None = None, burst: float | None = None) -> tuple[float, float]:
        """The ``(rate, burst)`` that applies: an identity's own values, else the defaults."""
        if rate is None:
            return self.rate, self.burst if burst is None else burst
        return rate, max(1.0, rate) if burst is None else burst

    def wait(self, identity: Hashable, rate: float | None = None, burst: float | None = None) -> float:
        """Takes a token from ``identity``'s bucket.

        Args:
            identity: whose bucket: a name, or any key (an anonymous client's address is kept
                apart from an identity of the same name).
            rate: the identity's own rate (requests a second; 0 = unlimited); ``None`` for the default.
            burst: the identity's own burst; ``None`` for the default (one second's worth
                with its own rate).

        Returns:
            0.0 when the call may go ahead, else the seconds until it may.
        """
        rate, burst = self.limit(rate, burst)
        if rate == 0:
            return 0.0
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(identity)
            if bucket is None:
                if len(self._buckets) >= MAX_BUCKETS:
                    self._drop_full(now)
                bucket = self._buckets[identity] = TokenBucket(rate, burst, burst, now)
            elif (bucket.rate, bucket.burst) != (rate, burst):  # the identity's limit was changed
                bucket.refill(now)
                bucket.rate, bucket.burst = rate, burst
            return bucket.take(now)

    def _drop_full(self, now: float) -> None:
        """Forgets the buckets that have refilled: a new one for that identity starts full too."""
        for identity, bucket in list(self._buckets.items()):
            bucket.refill(now)
            if bucket.tokens >= bucket.burst:
                del self._buckets[identity]


def check_limit(rate: float, burst: float) -> tuple[float, float]:
    """``(rate, burst)`` if valid: a rate (requests a second) positive and finite, a burst >= 1.

    Raises:
        ValueError: otherwise.
    """
    if not (math.isfinite(rate) and rate > 0 and math.isfinite(burst) and burst >= 1):
        raise ValueError(f"a rate limit needs a rate > 0 and a burst >= 1, got rate {rate}, burst {burst}")
    return float(rate), float(burst)
