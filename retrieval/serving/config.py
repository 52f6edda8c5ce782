"""The settings of a server (:class:`ServerConfig`): what it serves and where, its processes and
threads, micro-batching (:class:`BatchingConfig`), what one call may cost (:class:`LimitsConfig`),
who may call (:class:`AccessConfig`), metrics (:class:`MetricsConfig`) and TLS (:class:`TlsConfig`).

``mitt serve`` resolves one as ``mitt train`` resolves its :class:`~retrieval.training.Config`
(:mod:`retrieval.config`): the defaults, ``--config FILE``, the flags that stand for its fields,
every ``--set``; then :func:`check_server_config` checks the fields that go together.
:func:`~retrieval.serving.create_server` and :func:`~retrieval.serving.serve_forever` take one.
This module imports nothing heavier than the API's limits, so a whole configuration is checked
before FAISS or TensorFlow is loaded.

Example:
    >>> config = ServerConfig(port=0, batching=BatchingConfig(max_batch=16))
    >>> apply_overrides(config, ["limits.max_cost=256", "access.rate_limit=50"]).limits.max_cost
    256.0
    >>> ServerConfig(threads=0)
    Traceback (most recent call last):
    retrieval.config.FieldError: ServerConfig.threads=0: must be >= 1
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Annotated, Literal

from retrieval.api.convert import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_RESPONSE_BYTES
from retrieval.api.types import MAX_BATCH
from retrieval.config import (
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Range,
    Share,
    check_fields,
)
from retrieval.serving.logs import LogFormat

__all__ = [
    "ENGINES",
    "AccessConfig",
    "BatchingConfig",
    "LimitsConfig",
    "MetricsConfig",
    "ServerConfig",
    "TlsConfig",
    "check_server_config",
]

Port = Annotated[int, Range(0, 65535)]
"""A TCP port; 0 picks a free one (the gRPC port), or is off (the others)."""

MIB = 2**20

Engine = Literal["auto", "python", "native"]
"""What answers the calls (``ServerConfig.engine``, ``--engine``); ``auto`` is decided at start
(:func:`~retrieval.serving.native.choose_engine`)."""
ENGINES: tuple[str, ...] = typing.get_args(Engine)


@dataclass(frozen=True)
class BatchingConfig:
    """Dynamic micro-batching of concurrent ``Retrieve`` calls (:class:`~retrieval.serving.MicroBatcher`).

    Attributes:
        max_batch: most ``Retrieve`` calls answered by one user-tower call and one index search;
            1 answers each call on its own thread.
        max_wait_ms: how long a micro-batch waits for more calls once it has one; 0 adds no
            latency: calls that arrive while a batch computes form the next one.
    """

    max_batch: Annotated[int, Range(1, MAX_BATCH)] = 32
    max_wait_ms: NonNegativeFloat = 0.0

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def max_wait(self) -> float:
        """``max_wait_ms`` in seconds."""
        return self.max_wait_ms / 1000


@dataclass(frozen=True)
class LimitsConfig:
    """What one call may cost; calls over a limit get RESOURCE_EXHAUSTED. Costs are in units of
    about one ordinary query (:func:`~retrieval.serving.cost`); the bounds of the cost-based
    admission (:class:`~retrieval.serving.Admission`, docs/serving.md "Admission").

    Attributes:
        max_request_mb: largest request in MiB, refused before it is parsed (default: the API's
            largest valid request with headroom, :data:`~retrieval.api.DEFAULT_MAX_REQUEST_BYTES`).
        max_response_mb: largest response in MiB (default: the largest ``BatchRetrieve`` answer
            with headroom).
        max_queued: calls a process holds at once, computing or waiting for a thread; more are
            refused as they arrive, before they are read, with a retry hint; 0 = twice
            ``threads``.
        cheap_cost: calls costing at most this are cheap: always admitted, micro-batched.
        max_cost: cost units heavy calls may hold at once (a lone heavy call runs whatever its
            cost): 64 is ~25 ms of CPU in flight; on two cores more heavy calls at once add
            latency for every call, not throughput (bench.robustness --abuse).
        max_waiting: heavy calls that may wait for capacity; more are refused at once.
        max_memory_mb: resident memory above which heavy calls are refused; 0 = no ceiling.
        batch_cost: most cost units one micro-batch holds, counted as its queries times the
            costliest one's (they share one search as deep as the deepest): a cheap call takes
            a share of a batch as large as its cost.
        cheap_bytes: requests larger than this (bytes) are not parsed while heavy calls leave
            no room to wait: an ordinary request is under 1 KiB, one of 64 KiB holds ~10,000
            ids (heavy on any real catalogue), and parsing a few MiB holds the interpreter for
            tens of ms.
        heavy_wait: seconds a heavy call waits for capacity (less if its deadline is nearer).
        chunk_cost: cost units a heavy call computes between two yields to cheap calls.
    """

    max_request_mb: PositiveFloat = DEFAULT_MAX_REQUEST_BYTES / MIB
    max_response_mb: PositiveFloat = DEFAULT_MAX_RESPONSE_BYTES / MIB
    max_queued: NonNegativeInt = 0
    cheap_cost: PositiveFloat = 16.0
    max_cost: PositiveFloat = 64.0
    max_waiting: NonNegativeInt = 2
    max_memory_mb: NonNegativeFloat = 0.0
    batch_cost: PositiveFloat = 64.0
    cheap_bytes: PositiveInt = 64 * 1024
    heavy_wait: PositiveFloat = 1.0
    chunk_cost: PositiveFloat = 64.0

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mb * MIB)

    @property
    def max_response_bytes(self) -> int:
        return int(self.max_response_mb * MIB)

    @property
    def max_memory_bytes(self) -> int | None:
        """``max_memory_mb`` in bytes; ``None`` for no ceiling."""
        return int(self.max_memory_mb * MIB) or None


@dataclass(frozen=True)
class AccessConfig:
    """Who may call, how often, and what they asked; all off by default (docs/serving.md, "Access
    control"). :meth:`AccessControl.from_config <retrieval.serving.AccessControl.from_config>`
    reads its files.

    Attributes:
        file: the access file (TOML): identities with their tokens, client certificate names,
            permissions and rate limits, re-read when it changes; ``None``: anyone may call
            anything.
        rate_limit: requests a second per identity (per client IP address without an access
            file); more get RESOURCE_EXHAUSTED; 0 = no limit.
        rate_burst: most requests an identity may send at once (``None``: one second's worth).
        log_sample: share of requests written to the access log (logger ``retrieval.access``);
            0 = no access log, 1 = every request.
        log_user_ids: the access log also writes the requests' ``user_id``.
        health_port: also serve the health service alone, in plaintext and without credentials,
            on this port, for probes; 0 = off.
        reflection: serve gRPC server reflection (to callers with the ``info`` permission).
    """

    file: str | None = None
    rate_limit: NonNegativeFloat = 0.0
    rate_burst: Annotated[float, Range(1)] | None = None
    log_sample: Share = 0.0
    log_user_ids: bool = False
    health_port: Port = 0
    reflection: bool = True

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class MetricsConfig:
    """Prometheus metrics on an HTTP port of their own (docs/serving.md, "Metrics and logs").

    Attributes:
        port: the ``/metrics`` port; 0 = no metrics.
        host: the interface it listens on (default: this machine only).
        auth_file: a file holding the ``user:password`` that ``/metrics`` asks for.
        auth_env: an environment variable holding it instead.
    """

    port: Port = 0
    host: str = "127.0.0.1"
    auth_file: str | None = None
    auth_env: str | None = None

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class TlsConfig:
    """PEM files for TLS; with ``ca`` the server also requires client certificates signed by it
    (mutual TLS). Files that change are re-read (:class:`~retrieval.serving.CertificateFiles`).

    Attributes:
        cert: the server's certificate chain; ``None``: plaintext.
        key: its private key.
        ca: the CA that signs client certificates; ``None`` for server-side TLS only.
    """

    cert: str | None = None
    key: str | None = None
    ca: str | None = None


@dataclass(frozen=True)
class ServerConfig:
    """How ``mitt serve`` (or :func:`~retrieval.serving.serve_forever`) serves.

    Attributes:
        model: the model artifact folder (with ``index``).
        index: the index artifact folder built from that model.
        rankers: ranker artifact folders a request may rerank with (``RetrieveRequest.rerank``).
        watch: a deployment root (``mitt deploy``) instead: serve its current version and
            hot-reload each new one (with its own rankers).
        watch_interval: seconds between two looks at ``watch``.
        xla: run the user tower and the rankers compiled by XLA (not with ``watch``: TensorFlow
            keeps every compiled version in memory).
        engine: what answers the calls: ``native``, a C++ gRPC server (``make native``) calling
            the loaded tower and index once per micro-batch, which refuses at start the options
            it does not implement yet (:func:`~retrieval.serving.native.check_native`);
            ``python`` (grpcio, the retriever in Python); or ``auto``: ``native`` where it is
            built and implements every option set, else ``python`` (docs/serving.md, "Engines").
        host: the interface to bind (``0.0.0.0`` for all); every address it resolves to is bound.
        port: the gRPC port; 0 picks a free one.
        processes: server processes answering on the port, each with its own model and request
            threads; 1 = one process, no supervisor; ``None`` = one per core.
        threads: request threads per process. With micro-batching most of them only wait for
            their batch: about as many as requests in flight.
        search_threads: FAISS (OpenMP) threads per search, set in every request thread;
            ``None`` leaves FAISS's default, one per core (one each is faster and steadier with
            concurrent requests, see the index benchmark).
        grace: seconds in-flight calls get once the server stops.
        drain: seconds still serving after SIGTERM while reporting NOT_SERVING, so load
            balancers and health-watching clients move away first.
        log_format: ``text``, or ``json``: one object per line, for log collectors.
        batching: micro-batching.
        limits: what one call may cost.
        access: who may call, how often, what they asked.
        metrics: the metrics endpoint.
        tls: TLS or mutual TLS instead of plaintext.
    """

    model: str | None = None
    index: str | None = None
    rankers: tuple[str, ...] = ()
    watch: str | None = None
    watch_interval: PositiveFloat = 2.0
    xla: bool = False
    engine: Engine = "auto"
    host: str = "127.0.0.1"
    port: Port = 50051
    processes: PositiveInt | None = None
    threads: PositiveInt = 64
    search_threads: PositiveInt | None = 1
    grace: NonNegativeFloat = 5.0
    drain: NonNegativeFloat = 0.0
    log_format: LogFormat = "text"
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    access: AccessConfig = field(default_factory=AccessConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def max_queued(self) -> int:
        """Calls a process holds at once: ``limits.max_queued``, or twice ``threads``."""
        return self.limits.max_queued or 2 * self.threads


def check_server_config(config: ServerConfig, artifacts: bool = True) -> ServerConfig:
    """``config``, once the fields that go together are checked: after every layer, since one
    layer may set a field (``--set tls.cert=...``) and the next its partner. The messages name
    the flags, the fields' shortcuts. ``artifacts``: also require what to serve (``model`` and
    ``index``, or ``watch``); a printed configuration needs none.

    Raises:
        ValueError: fields that do not go together.
    """
    direct = (config.model is not None, config.index is not None)
    if artifacts and direct != ((False, False) if config.watch else (True, True)):
        raise ValueError("give --model and --index, or --watch alone")
    if config.watch and config.rankers:
        raise ValueError("with --watch the rankers come with each deployment (mitt deploy --ranker)")
    if config.watch and config.xla:
        raise ValueError("--xla is for a fixed model: each hot-reloaded version would stay in memory")
    tls = config.tls
    if (tls.cert is None) != (tls.key is None) or (tls.ca and not tls.cert):
        raise ValueError("TLS needs --tls-cert and --tls-key together (and --tls-ca only with them)")
    access, metrics = config.access, config.metrics
    if access.rate_burst is not None and not access.rate_limit:
        raise ValueError("--rate-burst needs a --rate-limit")
    if access.log_user_ids and not access.log_sample:
        raise ValueError("--access-log-user-ids needs an --access-log-sample above 0")
    if metrics.auth_file and metrics.auth_env:
        raise ValueError("give --metrics-auth-file or --metrics-auth-env, not both")
    if (metrics.auth_file or metrics.auth_env) and not metrics.port:
        raise ValueError("--metrics-auth-file and --metrics-auth-env need --metrics-port")
    return config
