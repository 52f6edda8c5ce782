r"""Serve a model and its index over gRPC until SIGTERM or SIGINT.

mitt serve --model runs/ml100k-sa --index runs/ml100k-sa-index --port 50051
mitt serve ... --ranker runs/ml100k-din        # requests may ask for a rerank
mitt serve ... --max-cost 256 --max-memory-mb 4096 --metrics-port 9090 \
    --tls-cert server.pem --tls-key server.key --tls-ca clients-ca.pem   # mutual TLS
# hot reload: serve ROOT's current version, swap to each one mitt deploy publishes
mitt serve --watch runs/live --log-format json
# the native engine (make native builds it): C++ gRPC, the model called once per micro-batch
mitt serve ... --engine native
# one process per core (the default) answering on one port; --processes 1: a single process
mitt serve ... --processes 4 --threads 32
# the settings from a file, one changed; the resolved configuration printed, nothing served
mitt serve --config server.yaml --set batching.max_batch=64 --print-config

Settings are applied in order: the defaults (retrieval/serving/config.py's ServerConfig),
--config FILE (JSON or YAML, whole or partial), the flags below (each stands for a field), then
every --set (--set limits.max_cost=256, --set access.rate_limit=50). Every setting is checked
against its choices or range, and the files and folders it names must exist, before FAISS or
TensorFlow is loaded; --print-config prints the resolved configuration as JSON and exits
(docs/configuration.md).
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retrieval.cli.inputs import Input
from retrieval.cli.startup import add_config_options, command_parser, layered, refuse, start
from retrieval.config import flag_of
from retrieval.environment import VERBOSE_HELP, quiet_tensorflow, single_threaded_tensorflow
from retrieval.serving.config import ENGINES, ServerConfig, check_server_config  # configuration only
from retrieval.serving.logs import LOG_FORMATS
from retrieval.storage import ArtifactError

if TYPE_CHECKING:
    from retrieval.serving import RetrieverSlot
    from retrieval.serving.worker import WorkerLink

__all__ = ["main", "parse_args", "serve_worker"]

# flag dest -> ServerConfig field; a flag overrides its field only when given, and an error names it.
FLAG_FIELDS = {
    "model": "model",
    "index": "index",
    "watch": "watch",
    "watch_interval": "watch_interval",
    "xla": "xla",
    "engine": "engine",
    "host": "host",
    "port": "port",
    "processes": "processes",
    "threads": "threads",
    "search_threads": "search_threads",
    "grace": "grace",
    "drain": "drain",
    "log_format": "log_format",
    "max_batch": "batching.max_batch",
    "max_wait_ms": "batching.max_wait_ms",
    "max_request_mb": "limits.max_request_mb",
    "max_queued": "limits.max_queued",
    "cheap_cost": "limits.cheap_cost",
    "max_cost": "limits.max_cost",
    "max_waiting": "limits.max_waiting",
    "max_memory_mb": "limits.max_memory_mb",
    "access_file": "access.file",
    "rate_limit": "access.rate_limit",
    "rate_burst": "access.rate_burst",
    "access_log_sample": "access.log_sample",
    "access_log_user_ids": "access.log_user_ids",
    "health_port": "access.health_port",
    "reflection": "access.reflection",
    "metrics_port": "metrics.port",
    "metrics_host": "metrics.host",
    "metrics_auth_file": "metrics.auth_file",
    "metrics_auth_env": "metrics.auth_env",
    "tls_cert": "tls.cert",
    "tls_key": "tls.key",
    "tls_ca": "tls.ca",
}

INPUTS = {
    "model": "model",
    "index": "index",
    "ranker": "rankers",
    "watch": "watch",
    "access_file": "access.file",
    "tls_cert": "tls.cert",
    "tls_key": "tls.key",
    "tls_ca": "tls.ca",
    "metrics_auth_file": "metrics.auth_file",
}
"""The files and folders a server reads: flag dest -> its field."""


class _DeprecatedWorkers(argparse.Action):
    """``--workers N``: the old name of ``--threads N``, with a warning."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: Any = None) -> None:
        warnings.warn(
            "--workers is deprecated: use --threads (request threads per process)", FutureWarning, 2
        )
        namespace.threads = values


def parse_args(
    argv: Sequence[str] | None, prog: str | None = None
) -> tuple[ServerConfig, argparse.Namespace]:
    """The server's resolved settings and the parsed arguments, FAISS, TensorFlow and gRPC not
    loaded; fields that do not go together are argparse's usage error.

    Raises:
        ValueError: a bad config file or ``--set``, or a value outside its range or choices,
            named as it was given (flag, key, file).
    """
    c = ServerConfig()
    p = command_parser(prog, __doc__)
    _add_artifacts(p, c)
    _add_processes(p, c)
    _add_limits(p, c)
    _add_access_control(p, c)
    _add_operations(p, c)
    add_config_options(
        p, ServerConfig, set_help="any ServerConfig field: threads, batching.max_batch, access.rate_limit..."
    )
    p.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    args = p.parse_args(argv)
    rankers = None if args.ranker is None else {"rankers": [str(r) for r in args.ranker]}
    config = layered(c, args, FLAG_FIELDS, rankers)
    try:
        return check_server_config(config, artifacts=not args.print_config), args
    except ValueError as e:  # fields that do not go together: a usage error, as it always was
        p.error(str(e))


def _add_artifacts(p: argparse.ArgumentParser, c: ServerConfig) -> None:
    p.add_argument("--model", type=Path, help="model artifact folder")
    p.add_argument("--index", type=Path, help="index artifact folder built from that model")
    p.add_argument(
        "--ranker",
        type=Path,
        action="append",
        help="a ranker artifact for RetrieveRequest.rerank (mitt train-ranker); repeatable "
        "(with --watch, the deployment's own rankers are used)",
    )
    p.add_argument(
        "--xla",
        action="store_true",
        default=None,
        help="run the user tower and the rankers compiled by XLA (faster, compiled at start; not "
        "with --watch: TensorFlow keeps every compiled version in memory)",
    )
    p.add_argument(
        "--watch",
        type=Path,
        help="deployment root (mitt deploy): serve its current version, hot-reload new ones",
    )
    p.add_argument(
        "--watch-interval", type=float, help=f"seconds between checks (default {c.watch_interval})"
    )


def _add_processes(p: argparse.ArgumentParser, c: ServerConfig) -> None:
    p.add_argument(
        "--engine",
        choices=ENGINES,
        help="what answers the calls: native, a C++ gRPC server calling the model once per "
        "micro-batch (make native builds it); python; or auto: native where it is built and "
        f"implements every option given, else python (docs/serving.md, Engines) (default {c.engine})",
    )
    p.add_argument("--host", help=f"interface to bind, 0.0.0.0 for all (default {c.host})")
    p.add_argument("--port", type=int, help=f"0 picks a free port (default {c.port})")
    p.add_argument(
        "--processes",
        type=int,
        help="server processes answering on the port, each with its own model and request "
        "threads; 1 = one process, no supervisor (default: one per core)",
    )
    p.add_argument("--threads", type=int, help=f"request threads per process (default {c.threads})")
    p.add_argument("--workers", type=int, action=_DeprecatedWorkers, help="deprecated name of --threads")
    p.add_argument(
        "--max-batch",
        type=int,
        help=f"Retrieve calls per micro-batch, 1 = off (default {c.batching.max_batch})",
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        help=f"wait for a fuller micro-batch (default {c.batching.max_wait_ms})",
    )
    p.add_argument(
        "--search-threads", type=int, help=f"FAISS threads per search (default {c.search_threads})"
    )
    p.add_argument("--grace", type=float, help=f"seconds in-flight requests get on stop (default {c.grace})")
    p.add_argument(
        "--drain",
        type=float,
        help="seconds still serving after SIGTERM while reporting NOT_SERVING, so load "
        f"balancers and health-watching clients move away first (default {c.drain})",
    )


def _add_limits(p: argparse.ArgumentParser, c: ServerConfig) -> None:
    limits = p.add_argument_group(
        "limits", "what one call may cost; calls over a limit get RESOURCE_EXHAUSTED (docs/serving.md)"
    )
    limits.add_argument(
        "--max-request-mb",
        type=float,
        help=f"largest request in MiB, refused before it is parsed (default {c.limits.max_request_mb}: "
        "the API's largest valid request with headroom)",
    )
    limits.add_argument(
        "--max-queued",
        type=int,
        help="calls held at once per process, computing or waiting for a thread (0 = twice --threads)",
    )
    limits.add_argument(
        "--cheap-cost",
        type=float,
        help="calls up to this cost (1 = an ordinary query) are always admitted "
        f"(default {c.limits.cheap_cost})",
    )
    limits.add_argument(
        "--max-cost", type=float, help=f"cost heavier calls may hold at once (default {c.limits.max_cost})"
    )
    limits.add_argument(
        "--max-waiting",
        type=int,
        help=f"heavy calls that may wait for room (default {c.limits.max_waiting})",
    )
    limits.add_argument(
        "--max-memory-mb",
        type=float,
        help="resident memory above which heavy calls are refused (0 = no ceiling)",
    )


def _add_access_control(p: argparse.ArgumentParser, c: ServerConfig) -> None:
    group = p.add_argument_group(
        "access control",
        "who may call, how often, and what they asked; all off by default (docs/serving.md)",
    )
    group.add_argument(
        "--access-file",
        type=Path,
        metavar="FILE",
        help="identities with their tokens, client certificate names, permissions and rate limits "
        "(TOML), re-read when it changes; without it anyone may call",
    )
    group.add_argument(
        "--rate-limit",
        type=float,
        metavar="R",
        help="requests/s per identity (per client IP without --access-file), more get "
        "RESOURCE_EXHAUSTED (0 = no limit)",
    )
    group.add_argument(
        "--rate-burst",
        type=float,
        metavar="N",
        help="most requests an identity may send at once (default: one second's worth)",
    )
    group.add_argument(
        "--access-log-sample",
        type=float,
        metavar="SHARE",
        help="share of requests in the access log, logger retrieval.access (0 = off, 1 = every one)",
    )
    group.add_argument(
        "--access-log-user-ids",
        action="store_true",
        default=None,
        help="log the requests' user_id in the access log",
    )
    group.add_argument(
        "--health-port",
        type=int,
        metavar="PORT",
        help="also serve the health service alone, in plaintext and without credentials, on this "
        "port, for probes (0 = off)",
    )
    group.add_argument(
        "--no-reflection",
        dest="reflection",
        action="store_false",
        default=None,
        help="do not serve gRPC server reflection",
    )
    _add_metrics_access(group, c)


def _add_metrics_access(group: argparse._ArgumentGroup, c: ServerConfig) -> None:
    """Who may read ``/metrics``: its interface, and the credentials it asks for."""
    group.add_argument(
        "--metrics-host",
        metavar="HOST",
        help=f"interface of the metrics endpoint (default {c.metrics.host}: this machine only)",
    )
    credentials = group.add_mutually_exclusive_group()
    credentials.add_argument(
        "--metrics-auth-file",
        type=Path,
        metavar="FILE",
        help="file holding user:password that /metrics asks for",
    )
    credentials.add_argument(
        "--metrics-auth-env", metavar="VAR", help="environment variable holding that user:password"
    )


def _add_operations(p: argparse.ArgumentParser, c: ServerConfig) -> None:
    p.add_argument("--metrics-port", type=int, help="Prometheus /metrics port (0 = off)")
    p.add_argument("--tls-cert", type=Path, help="server certificate (PEM): serve TLS")
    p.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    p.add_argument("--tls-ca", type=Path, help="CA of client certificates (PEM): require mutual TLS")
    p.add_argument("--log-format", choices=LOG_FORMATS, help=f"default {c.log_format}")


def inputs(config: ServerConfig, args: argparse.Namespace) -> dict[str, Input]:
    """The files and folders ``config`` names, each by its flag when it came from it, else by its
    key (a file's, a ``--set``'s)."""
    found: dict[str, Input] = {}
    for dest, key in INPUTS.items():
        value: Any = functools.reduce(getattr, key.split("."), config)
        given = getattr(args, dest)
        flagged = given is not None and (
            [str(g) for g in given] == list(value) if isinstance(given, list) else str(given) == value
        )
        found[flag_of(dest) if flagged else key] = value
    return found


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    started = start(parse_args, argv, prog, inputs)
    if isinstance(started, int):
        return started
    config, args = started
    from retrieval.serving.logs import configure_logging
    from retrieval.serving.native import NativeEngineMissing, choose_engine

    configure_logging(config.log_format)
    _require_serve_extra()  # first: without it, the one line says which extra to install
    try:  # before any process starts: not built, or an option it lacks
        config = choose_engine(config)
    except (ValueError, NativeEngineMissing) as e:
        return refuse(e)
    if config.engine == "native":
        single_threaded_tensorflow()  # the tower, called once per batch (its workers inherit it)
    from retrieval.serving.group import default_processes

    if (config.processes or default_processes()) > 1:
        return _serve_group(config, args.verbose)
    return _serve(config, args.verbose)


def _require_serve_extra() -> None:
    """Raises :class:`ModuleNotFoundError` when FAISS or TensorFlow (the serve extra's) is missing,
    without importing them (a group's supervisor imports neither; its workers do)."""
    for library in ("faiss", "tensorflow"):
        blocked = library in sys.modules and sys.modules[library] is None
        if blocked or importlib.util.find_spec(library) is None:
            raise ModuleNotFoundError(f"No module named {library!r}", name=library)


def serve_worker(config: ServerConfig, verbose: bool, link: WorkerLink) -> int:
    """A serving group's worker (:mod:`retrieval.serving.worker`): the server ``config`` asks
    for, as one of the group's processes."""
    return _serve(config, verbose, link)


def _serve_group(config: ServerConfig, verbose: bool) -> int:
    """``--processes N``: a supervisor starts N workers serving ``config`` on one port
    (:mod:`retrieval.serving.group`) and loads no model itself."""
    from retrieval.serving import AccessControl
    from retrieval.serving.group import GroupOptions, serve_group

    try:
        access = AccessControl.from_config(config)  # a bad file fails here, before any worker starts
    except (OSError, ValueError) as e:
        return refuse(e)
    worker = functools.partial(serve_worker, config, verbose)
    return serve_group(GroupOptions(config, worker, access.metrics_auth))


def _serve(config: ServerConfig, verbose: bool, link: WorkerLink | None = None) -> int:
    """Serves until a signal: one process, or (``link``) one worker of a serving group, which
    loads the group's version, shares its port and follows its supervisor."""
    quiet_tensorflow(verbose)  # a group's worker: the level its supervisor was started with
    # Imported here, once TensorFlow's logging is set and never for --help: the serving layer
    # loads FAISS and pandas, and TensorFlow with the model.
    from retrieval.serving import AccessControl, DeploymentWatcher, configure_logging, serve_forever
    from retrieval.serving.stopping import STOP_MARGIN, exit_within

    configure_logging(config.log_format)
    try:
        access = AccessControl.from_config(config)  # before loading the model: a bad file fails at once
        slot = _load(config, link)
    except (OSError, ValueError, ArtifactError) as e:
        return _failed(e, link)
    # Objects loaded so far live as long as the process: keep them out of every later
    # collection, which would otherwise pause the request threads for much longer.
    gc.freeze()
    # A group's supervisor watches the deployment for its workers.
    watcher = None
    if config.watch and link is None:
        watcher = DeploymentWatcher(Path(config.watch), slot, config.watch_interval)
    on_start = link.start if link is not None else None if watcher is None else lambda server: watcher.start()
    served, options = (
        (config, {}) if link is None else (link.worker_config(config), link.server_options(slot))
    )
    code = 1  # what the interpreter answers an unexpected error with
    try:
        serve_forever(slot, served, access=access, on_start=on_start, **options)
        code = 0
    except OSError as e:  # a port in use: nothing was left serving
        code = _failed(e, link)
    finally:
        if watcher is not None:
            watcher.stop(STOP_MARGIN)  # a load in progress need not finish
        # A request thread stuck in a call would hold the interpreter's exit (it joins them).
        exit_within(STOP_MARGIN, code)
    return code


def _load(config: ServerConfig, link: WorkerLink | None) -> RetrieverSlot:
    """What ``config`` serves, loaded: the watched deployment's current version (or the newest
    one that loads, logged as an error; a group's worker: its group's), or the model and index
    folders with their rankers, warmed up (XLA compiles here, before the server reports SERVING).

    Raises:
        ArtifactError: it cannot be loaded.
    """
    from retrieval.serving import Retriever, RetrieverSlot, open_deployment, warm_up

    if config.watch:
        return open_deployment(Path(config.watch), None if link is None else link.folder)
    assert config.model is not None and config.index is not None  # check_server_config
    rankers = [Path(r) for r in config.rankers]
    retriever = Retriever.from_dirs(Path(config.model), Path(config.index), rankers, xla=config.xla)
    warm_up(retriever)
    return RetrieverSlot(retriever)


def _failed(error: Exception, link: WorkerLink | None) -> int:
    """Prints ``error`` (and tells a group's supervisor: the worker could not start); exit code 2."""
    if link is not None:
        link.failed(str(error))
    return refuse(error)
