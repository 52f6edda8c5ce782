"""A serving process's main: start the server of either engine, serve until a signal, stop within
bounds (:func:`serve_forever`). ``mitt serve`` and a serving group's workers run it."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable

from retrieval.api.convert import SERVICE_NAME
from retrieval.serving.access import AccessControl
from retrieval.serving.config import MetricsConfig, ServerConfig
from retrieval.serving.metrics import BasicAuth, Metrics
from retrieval.serving.native import choose_engine
from retrieval.serving.reload import RetrieverSlot
from retrieval.serving.retriever import Retriever
from retrieval.serving.server import StartedServer, create_server
from retrieval.serving.stopping import STOP_MARGIN, StopGuard

logger = logging.getLogger(__name__)

_POLL = 0.1
"""Seconds between two looks of a serving process's main thread at its signals."""


SWITCH_INTERVAL = 0.001
"""Seconds a thread holds the GIL while another waits for it, in a serving process."""


def serve_forever(
    retriever: Retriever | RetrieverSlot,
    config: ServerConfig | None = None,
    *,
    access: AccessControl | None = None,
    metrics: Metrics | None = None,
    on_start: Callable[[StartedServer], None] | None = None,
    reuse_port: bool = False,
    serving: bool = True,
) -> None:
    """Serves until SIGTERM or SIGINT with the engine ``config.engine`` names (``auto``:
    :func:`~retrieval.serving.native.choose_engine`), then stops gracefully.

    On the signal the health status turns NOT_SERVING, calls are still answered for
    ``config.drain`` seconds (while load balancers move away), then new calls are refused and
    in-flight ones get ``config.grace`` seconds to finish. Every step of the stop is bounded: if
    the process is still running :data:`~retrieval.serving.stopping.STOP_MARGIN` seconds after
    that (a stuck call, a stuck step), or at a second SIGTERM or SIGINT, it exits with code 1
    (:class:`StopGuard`). Must run in the main thread (Python delivers signals only there).

    ``config.metrics.port`` serves Prometheus metrics (behind ``access.metrics_auth`` if set);
    without it ``metrics`` counts in a :class:`Metrics` served elsewhere (a group's worker's).
    ``on_start`` is called with the started server (e.g. to start a
    :class:`~retrieval.serving.reload.DeploymentWatcher`); the rest goes to :func:`create_server`.

    Raises:
        OSError: the metrics port or the gRPC port cannot be bound; nothing is left serving.
        ValueError, NativeEngineMissing: ``native`` asked for, and it cannot serve ``config``.
    """
    # A heavy call's Python work holds the GIL for up to the switch interval each time a cheap
    # call's thread asks for it, and a call asks many times: 1 ms (instead of 5) keeps cheap
    # calls' latency under heavy load (bench/robustness --abuse).
    sys.setswitchinterval(SWITCH_INTERVAL)
    config = choose_engine(config or ServerConfig())
    access = AccessControl.from_config(config) if access is None else access
    served = _serve_metrics(config.metrics, access.metrics_auth)
    try:
        server, bound = _create(retriever, config, access, served or metrics, reuse_port, serving)
        _log_started(server, config, bound)
        with StopGuard(budget=config.drain + config.grace + STOP_MARGIN) as guard:
            if on_start is not None:
                on_start(server)
            _serve_until_stopped(server, guard, config.grace, config.drain)
    finally:
        if served is not None:
            served.close()
    logger.info("server stopped")


def _create(
    retriever: Retriever | RetrieverSlot,
    config: ServerConfig,
    access: AccessControl,
    metrics: Metrics | None,
    reuse_port: bool,
    serving: bool,
) -> tuple[StartedServer, int]:
    """The started server of ``config.engine``: :func:`create_server`, or the native engine's
    :func:`~retrieval.serving.native_server.create_native_server`."""
    if config.engine == "native":
        from retrieval.serving.native_server import create_native_server

        return create_native_server(
            retriever, config, access=access, metrics=metrics, reuse_port=reuse_port, serving=serving
        )
    return create_server(
        retriever, config, access=access, metrics=metrics, reuse_port=reuse_port, serving=serving
    )


def _serve_metrics(config: MetricsConfig, auth: BasicAuth | None) -> Metrics | None:
    """A :class:`Metrics` served on ``config.port`` (``None`` without one). Started before the
    gRPC port: a metrics port in use must fail the start, not a serving server.

    Raises:
        OSError: the port cannot be bound.
    """
    if not config.port:
        return None
    metrics = Metrics()
    try:
        bound = metrics.serve(config.port, config.host, auth)
    except OSError as e:
        raise OSError(f"cannot serve metrics on {config.host}:{config.port}: {e.strerror}") from None
    logger.info("metrics on http://%s:%d/metrics", config.host, bound)
    return metrics


def _log_started(server: StartedServer, config: ServerConfig, bound: int) -> None:
    tls = " with TLS" if config.tls.cert else ""
    engine = f" ({config.engine} engine)"
    version = server.slot.current.model_version
    logger.info("serving %s (model %s) on %s:%d%s%s", SERVICE_NAME, version, config.host, bound, tls, engine)
    if server.health_port is not None:
        logger.info("health checks in plaintext on %s:%d", config.host, server.health_port)


def _serve_until_stopped(server: StartedServer, guard: StopGuard, grace: float, drain: float) -> None:
    """Waits until ``server`` stopped. The first signal starts its stop in a thread of its own (a
    step that hangs cannot hold this loop, nor a second signal); a stop, whoever asked for it
    (a group's supervisor), arms ``guard`` :data:`STOP_MARGIN` s after the calls' grace."""
    stopping = False
    while server.wait_for_termination(_POLL):
        if guard.signals and not stopping:
            stopping = True
            logger.info("%s received, stopping (drain %.1f s, grace %.1f s)", guard.signal_name, drain, grace)
            threading.Thread(target=server.stop, args=(grace, drain), name="stop", daemon=True).start()
        if server.stop_deadline is not None:
            guard.arm(server.stop_deadline + STOP_MARGIN)
