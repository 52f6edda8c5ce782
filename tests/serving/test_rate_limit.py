"""Per-client rate limits: the token bucket against worked-out numbers, then a real server that
refuses an identity past its burst with RESOURCE_EXHAUSTED, the limit in the message and a
retry pushback, lets other identities through, and recovers once a token is back."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from retrieval.api.client import RetrievalClient
from retrieval.serving.access import AccessControl, peer_host
from retrieval.serving.auth import AccessFile
from retrieval.serving.ratelimit import MAX_BUCKETS, RateLimiter, TokenBucket
from retrieval.serving.retriever import Retriever
from retrieval.serving.server import create_server
from tests.helpers import local


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_token_bucket_by_hand() -> None:
    bucket = TokenBucket(rate=2, burst=3, tokens=3, updated=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]  # the burst
    assert bucket.take(0.0) == pytest.approx(0.5)  # one token every 1/2 s
    assert bucket.take(0.25) == pytest.approx(0.25)  # half a token earned, half to go
    assert bucket.take(0.5) == 0.0
    assert bucket.take(100.0) == 0.0 and bucket.tokens == pytest.approx(2)  # refilled to 3, one taken


def test_rate_limiter_keeps_one_bucket_per_identity_with_its_own_limit() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=8, clock=clock)  # burst: one second's worth
    assert limiter.burst == 8
    assert [limiter.wait("a") for _ in range(8)] == [0.0] * 8
    assert limiter.wait("a") == 0.125
    assert limiter.wait("b") == 0.0  # another identity, another bucket
    assert [limiter.wait("c", rate=1, burst=2) for _ in range(3)] == [0.0, 0.0, pytest.approx(1.0)]
    assert all(limiter.wait("d", rate=0) == 0.0 for _ in range(100))  # 0 = unlimited
    clock.now += 0.125  # (times in binary fractions: exact in floating point)
    assert limiter.wait("a") == 0.0
    # A changed limit applies to the bucket in place: 0.125 s at the old 1/s earned 0.125 token,
    # the other 0.875 take 8.75 ms at 100/s.
    assert limiter.wait("c", rate=100, burst=2) == pytest.approx(0.00875)
    with pytest.raises(ValueError, match="rate > 0 and a burst >= 1"):
        RateLimiter(rate=0)
    with pytest.raises(ValueError, match="rate > 0 and a burst >= 1"):
        RateLimiter(rate=5, burst=0.5)


def test_full_buckets_are_forgotten_when_there_are_too_many() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=1, burst=1, clock=clock)
    for i in range(MAX_BUCKETS):
        limiter.wait(f"caller-{i}")
    clock.now += 10  # every bucket refilled: dropped when the next identity arrives
    assert limiter.wait("newcomer") == 0.0
    assert len(limiter._buckets) == 1
    assert limiter.wait("newcomer") == pytest.approx(1.0)


def test_peer_host_drops_the_port() -> None:
    assert peer_host("ipv4:10.0.0.5:41234") == "10.0.0.5"
    assert peer_host("ipv6:[::1]:41234") == "::1"
    assert peer_host("unix:/tmp/socket") == "/tmp/socket"


def refusal(client: RetrievalClient, calls: int = 200) -> tuple[int, float, grpc.RpcError]:
    """Calls until refused: ``(calls answered before, seconds they took, the refusal)``."""
    started = time.monotonic()
    for answered in range(calls):
        try:
            client.model_info()
        except grpc.RpcError as e:
            return answered, time.monotonic() - started, e
    raise AssertionError(f"{calls} calls and none refused")


def pushback_ms(error: grpc.RpcError) -> int:
    (value,) = [v for k, v in error.trailing_metadata() if k == "grpc-retry-pushback-ms"]
    return int(value)


def test_server_refuses_past_the_burst_and_recovers(retriever: Retriever) -> None:
    rate, burst = 2.0, 5
    server, port = create_server(
        retriever, local(), access=AccessControl(rate_limit=RateLimiter(rate, burst))
    )
    try:
        with RetrievalClient(f"127.0.0.1:{port}", retries=0, timeout=30) as client:
            answered, elapsed, refused = refusal(client)
            # The burst, plus what the bucket earned meanwhile (wide: a loaded machine is slow).
            assert burst <= answered <= burst + rate * elapsed + 1
            assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            details = refused.details() or ""
            assert details.startswith(
                "rate limit of 2 requests/s (burst 5) for identity '127.0.0.1' exceeded"
            )
            wait = pushback_ms(refused)
            assert 0 < wait <= 1000 / rate
            time.sleep(wait / 1000 + 0.05)
            client.model_info()  # a token is back
    finally:
        server.stop(None)


def test_identities_have_their_own_buckets_and_limits(retriever: Retriever, tmp_path: Path) -> None:
    access_file = tmp_path / "access.toml"
    access_file.write_text(
        '[identities.slow]\ntokens = ["slow"]\npermissions = ["info"]\nrate = 0.5\nburst = 2\n'
        '[identities.free]\ntokens = ["free"]\npermissions = ["info"]\nrate = 0\n'
        '[identities.default]\ntokens = ["default"]\npermissions = ["info"]\n'
    )
    access = AccessControl(identities=AccessFile(access_file), rate_limit=RateLimiter(rate=1000, burst=1000))
    server, port = create_server(retriever, local(), access=access)
    address = f"127.0.0.1:{port}"
    try:
        with RetrievalClient(address, retries=0, timeout=30, token="slow") as slow:
            answered, elapsed, refused = refusal(slow)
            assert 2 <= answered <= 2 + 0.5 * elapsed + 1
            assert "rate limit of 0.5 requests/s (burst 2) for identity 'slow'" in (refused.details() or "")
            assert 0 < pushback_ms(refused) <= 2000
        with RetrievalClient(address, retries=0, timeout=30, token="free") as free:
            for _ in range(50):
                free.model_info()  # unlimited
        with RetrievalClient(address, retries=0, timeout=30, token="default") as default:
            for _ in range(50):
                default.model_info()  # the server's 1000/s, untouched by "slow"
    finally:
        server.stop(None)


def test_a_client_with_retries_waits_for_the_pushback(retriever: Retriever) -> None:
    server, port = create_server(retriever, local(), access=AccessControl(rate_limit=RateLimiter(4, 1)))
    try:
        with RetrievalClient(f"127.0.0.1:{port}", retries=0, timeout=30) as plain:
            _, _, refused = refusal(plain)  # the bucket is empty
        pushback = pushback_ms(refused) / 1000
        assert pushback > 0.1  # 4 calls a second: the next token is ~250 ms away
        with RetrievalClient(f"127.0.0.1:{port}", retries=2, timeout=30) as client:
            started = time.monotonic()
            info = client.model_info()  # refused, retried after the pushback, answered
            waited = time.monotonic() - started
        assert info.model_version
        # Retried at once, it would be refused again (the bucket refills at 4 a second) and, out
        # of retries, fail: answered means it waited, and no sooner than the token came back.
        assert waited >= 0.5 * pushback, (waited, pushback)
    finally:
        server.stop(None)
