r"""Serve a model and its index over gRPC until SIGTERM or SIGINT.

mitt serve --model runs/ml100k-sa --index runs/ml100k-sa-index --port 50051
mitt serve ... --ranker runs/ml100k-din        # requests may ask for a rerank
mitt serve ... --max-cost 256 --max-memory-mb 4096 --metrics-port 9090 \
    --tls-cert server.pem --tls-key server.key --tls-ca clients-ca.pem   # mutual TLS
# hot reload: serve ROOT's current version, swap to each one mitt deploy publishes
mitt serve --watch runs/live --log-format json
# one process per core (the default) answering on one port; --processes 1: a single process
mitt serve ... --processes 4 --threads 32
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retrieval.api import DEFAULT_MAX_REQUEST_BYTES
from retrieval.cli.inputs import flag_inputs, missing_inputs
from retrieval.environment import VERBOSE_HELP, quiet_tensorflow
from retrieval.serving import LOG_FORMATS  # loads retrieval.serving.logs only (the layer is lazy)
from retrieval.storage import ArtifactError

if TYPE_CHECKING:
    from retrieval.serving import AccessControl
    from retrieval.serving.worker import WorkerLink

__all__ = ["access_control", "main", "parse_args", "serve_worker"]


class _DeprecatedWorkers(argparse.Action):
    """``--workers N``: the old name of ``--threads N``, with a warning."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: Any = None) -> None:
        warnings.warn(
            "--workers is deprecated: use --threads (request threads per process)", FutureWarning, 2
        )
        namespace.threads = values


def parse_args(argv: Sequence[str] | None, prog: str | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", type=Path, help="model artifact folder")
    p.add_argument("--index", type=Path, help="index artifact folder built from that model")
    p.add_argument(
        "--ranker",
        type=Path,
        action="append",
        default=[],
        help="a ranker artifact for RetrieveRequest.rerank (mitt train-ranker); repeatable "
        "(with --watch, the deployment's own rankers are used)",
    )
    p.add_argument(
        "--xla",
        action="store_true",
        help="run the user tower and the rankers compiled by XLA (faster, compiled at start; not "
        "with --watch: TensorFlow keeps every compiled version in memory)",
    )
    p.add_argument(
        "--watch",
        type=Path,
        help="deployment root (mitt deploy): serve its current version, hot-reload new ones",
    )
    p.add_argument(
        "--watch-interval", type=float, default=2.0, help="seconds between checks (default %(default)s)"
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="interface to bind, 0.0.0.0 for all (default %(default)s)"
    )
    p.add_argument("--port", type=int, default=50051, help="0 picks a free port (default %(default)s)")
    p.add_argument(
        "--processes",
        type=int,
        default=None,
        help="server processes answering on the port, each with its own model and request "
        "threads; 1 = one process, no supervisor (default: one per core)",
    )
    p.add_argument(
        "--threads", type=int, default=64, help="request threads per process (default %(default)s)"
    )
    p.add_argument("--workers", type=int, action=_DeprecatedWorkers, help="deprecated name of --threads")
    p.add_argument(
        "--max-batch",
        type=int,
        default=32,
        help="Retrieve calls per micro-batch, 1 = off (default %(default)s)",
    )
    p.add_argument(
        "--max-wait-ms", type=float, default=0.0, help="wait for a fuller micro-batch (default %(default)s)"
    )
    p.add_argument(
        "--search-threads", type=int, default=1, help="FAISS threads per search (default %(default)s)"
    )
    p.add_argument("--grace", type=float, default=5.0, help="seconds in-flight requests get on stop")
    p.add_argument(
        "--drain",
        type=float,
        default=0.0,
        help="seconds still serving after SIGTERM while reporting NOT_SERVING, so load "
        "balancers and health-watching clients move away first (default %(default)s)",
    )
    _add_limits(p)
    _add_access_control(p)
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (0 = off)")
    p.add_argument("--tls-cert", type=Path, help="server certificate (PEM): serve TLS")
    p.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    p.add_argument("--tls-ca", type=Path, help="CA of client certificates (PEM): require mutual TLS")
    p.add_argument("--log-format", choices=LOG_FORMATS, default="text", help="default %(default)s")
    p.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    args = p.parse_args(argv)
    if args.processes is None:
        from retrieval.serving.group import default_processes

        args.processes = default_processes()
    direct = (args.model is not None, args.index is not None)
    if direct != ((False, False) if args.watch else (True, True)):
        p.error("give --model and --index, or --watch alone")
    if args.watch and args.ranker:
        p.error("with --watch the rankers come with each deployment (mitt deploy --ranker)")
    if args.watch and args.xla:
        p.error("--xla is for a fixed model: each hot-reloaded version would stay in memory")
    if (args.tls_cert is None) != (args.tls_key is None) or (args.tls_ca and not args.tls_cert):
        p.error("TLS needs --tls-cert and --tls-key together (and --tls-ca only with them)")
    if min(args.max_queued, args.max_memory_mb, args.metrics_port, args.max_wait_ms, args.drain) < 0:
        p.error("--max-queued, --max-memory-mb, --metrics-port, --max-wait-ms and --drain must be >= 0")
    if args.grace < 0:
        p.error("--grace must be >= 0")
    if min(args.max_cost, args.cheap_cost, args.max_request_mb) <= 0 or args.max_waiting < 0:
        p.error("--max-cost, --cheap-cost and --max-request-mb must be > 0, --max-waiting >= 0")
    if args.search_threads < 1 or args.watch_interval <= 0 or args.processes < 1 or args.threads < 1:
        p.error("--search-threads, --processes and --threads must be >= 1, --watch-interval > 0")
    _check_access_control(p, args)
    return args


def _add_access_control(p: argparse.ArgumentParser) -> None:
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
        default=0.0,
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
        default=0.0,
        metavar="SHARE",
        help="share of requests in the access log, logger retrieval.access (0 = off, 1 = every one)",
    )
    group.add_argument(
        "--access-log-user-ids", action="store_true", help="log the requests' user_id in the access log"
    )
    group.add_argument(
        "--health-port",
        type=int,
        default=0,
        metavar="PORT",
        help="also serve the health service alone, in plaintext and without credentials, on this "
        "port, for probes (0 = off)",
    )
    group.add_argument("--no-reflection", action="store_true", help="do not serve gRPC server reflection")
    group.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="interface of the metrics endpoint (default %(default)s: this machine only)",
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


def _check_access_control(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.rate_limit < 0 or (args.rate_burst is not None and (args.rate_burst < 1 or not args.rate_limit)):
        p.error("--rate-limit must be >= 0, and --rate-burst >= 1 only with a --rate-limit")
    if not 0 <= args.access_log_sample <= 1 or (args.access_log_user_ids and not args.access_log_sample):
        p.error("--access-log-sample must be in [0, 1], and > 0 for --access-log-user-ids")
    if args.health_port < 0:
        p.error("--health-port must be >= 0")
    if (args.metrics_auth_file or args.metrics_auth_env) and not args.metrics_port:
        p.error("--metrics-auth-file and --metrics-auth-env need --metrics-port")


def access_control(args: argparse.Namespace) -> AccessControl:
    """The :class:`~retrieval.serving.AccessControl` the "access control" flags ask for.

    Raises:
        OSError: the access file or the metrics credentials file cannot be read.
        ValueError: one of them is invalid, or the credentials variable is not set.
    """
    from retrieval.serving import AccessControl, AccessFile, AccessLog, BasicAuth, RateLimiter

    metrics_auth = None
    if args.metrics_auth_file:
        metrics_auth = BasicAuth.parse(args.metrics_auth_file.read_text(), str(args.metrics_auth_file))
    elif args.metrics_auth_env:
        metrics_auth = BasicAuth.parse(os.environ.get(args.metrics_auth_env, ""), f"${args.metrics_auth_env}")
    sample = args.access_log_sample
    return AccessControl(
        identities=AccessFile(args.access_file) if args.access_file else None,
        rate_limit=RateLimiter(args.rate_limit, args.rate_burst) if args.rate_limit else None,
        access_log=AccessLog(sample, args.access_log_user_ids) if sample else None,
        reflection=not args.no_reflection,
        health_port=args.health_port or None,
        metrics_auth=metrics_auth,
    )


def _add_limits(p: argparse.ArgumentParser) -> None:
    limits = p.add_argument_group(
        "limits", "what one call may cost; calls over a limit get RESOURCE_EXHAUSTED (docs/serving.md)"
    )
    limits.add_argument(
        "--max-request-mb",
        type=float,
        default=DEFAULT_MAX_REQUEST_BYTES / 2**20,
        help="largest request in MiB, refused before it is parsed (default %(default)s: the API's "
        "largest valid request with headroom)",
    )
    limits.add_argument(
        "--max-queued",
        type=int,
        default=0,
        help="calls held at once per process, computing or waiting for a thread (0 = twice --threads)",
    )
    limits.add_argument(
        "--cheap-cost",
        type=float,
        default=16.0,
        help="calls up to this cost (1 = an ordinary query) are always admitted (default %(default)s)",
    )
    limits.add_argument(
        "--max-cost",
        type=float,
        default=64.0,
        help="cost heavier calls may hold at once (default %(default)s)",
    )
    limits.add_argument(
        "--max-waiting", type=int, default=2, help="heavy calls that may wait for room (default %(default)s)"
    )
    limits.add_argument(
        "--max-memory-mb",
        type=float,
        default=0.0,
        help="resident memory above which heavy calls are refused (0 = no ceiling)",
    )


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    args = parse_args(argv, prog)
    read = ("model", "index", "ranker", "watch", "access_file", "tls_cert", "tls_key", "tls_ca")
    if missing_inputs(flag_inputs(args, *read, "metrics_auth_file")):
        return 2
    if args.processes > 1:
        return _serve_group(args, list(sys.argv[1:] if argv is None else argv))
    return _serve(args)


def serve_worker(argv: Sequence[str], link: WorkerLink) -> int:
    """A serving group's worker (:mod:`retrieval.serving.worker`): the server ``argv`` asks for,
    as one of the group's processes."""
    return _serve(parse_args(argv), link)


def _serve_group(args: argparse.Namespace, argv: list[str]) -> int:
    """``--processes N``: a supervisor starts N workers serving ``argv`` on one port
    (:mod:`retrieval.serving.group`) and loads no model itself."""
    from retrieval.serving.group import GroupOptions, serve_group
    from retrieval.serving.logs import configure_logging

    for library in ("faiss", "tensorflow"):  # the workers' (the supervisor imports neither)
        blocked = library in sys.modules and sys.modules[library] is None
        if blocked or importlib.util.find_spec(library) is None:  # missing: one line naming the extra
            raise ModuleNotFoundError(f"No module named {library!r}", name=library)
    configure_logging(args.log_format)
    quiet_tensorflow(args.verbose)  # in the environment the workers and the process forking them inherit
    try:
        access = access_control(args)  # a bad file fails here, before any worker starts
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    options = GroupOptions(
        processes=args.processes,
        worker=partial(serve_worker, argv),
        host=args.host,
        port=args.port,
        health_port=args.health_port or None,
        watch=args.watch,
        watch_interval=args.watch_interval,
        grace=args.grace,
        drain=args.drain,
        metrics_port=args.metrics_port or None,
        metrics_host=args.metrics_host,
        metrics_auth=access.metrics_auth,
    )
    return serve_group(options)


def _serve(args: argparse.Namespace, link: WorkerLink | None = None) -> int:
    """Serves until a signal: one process, or (``link``) one worker of a serving group, which
    loads the group's version, shares its port and follows its supervisor."""
    quiet_tensorflow(args.verbose)
    # Imported here, once TensorFlow's logging is set and never for --help: the serving layer
    # loads FAISS and pandas, and TensorFlow with the model.
    from retrieval.serving import (
        AdmissionLimits,
        DeploymentWatcher,
        Retriever,
        RetrieverSlot,
        TlsFiles,
        configure_logging,
        open_deployment,
        serve_forever,
        warm_up,
    )
    from retrieval.serving.stopping import STOP_MARGIN, exit_within

    def fail(message: str) -> int:
        print(f"error: {message}", file=sys.stderr)
        if link is not None:
            link.failed(message)
        return 2

    configure_logging(args.log_format)
    try:
        access = access_control(args)  # before loading the model: a bad file fails at once
    except (OSError, ValueError) as e:
        return fail(str(e))
    try:
        if args.watch:  # the current version, or the newest one that loads (logged as an error)
            slot = open_deployment(args.watch, None if link is None else link.folder)
        else:
            retriever = Retriever.from_dirs(args.model, args.index, args.ranker, xla=args.xla)
            warm_up(retriever)  # XLA compiles here, before the server reports SERVING
            slot = RetrieverSlot(retriever)
    except ArtifactError as e:
        return fail(str(e))
    # Objects loaded so far live as long as the process: keep them out of every later
    # collection, which would otherwise pause the request threads for much longer.
    gc.freeze()
    # A group's supervisor watches the deployment for its workers.
    watcher = DeploymentWatcher(args.watch, slot, args.watch_interval) if args.watch and not link else None
    tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_ca) if args.tls_cert else None
    group: dict[str, Any] = {} if link is None else link.server_options(slot)
    on_start = link.start if link is not None else None if watcher is None else lambda server: watcher.start()
    code = 1  # what the interpreter answers an unexpected error with
    try:
        serve_forever(
            slot,
            args.host,
            group.pop("port", args.port),
            grace=args.grace,
            drain=args.drain,
            metrics_port=(args.metrics_port or None) if link is None else None,
            metrics_host=args.metrics_host,
            access=access,
            on_start=on_start,
            max_workers=args.threads,
            max_batch=args.max_batch,
            max_wait=args.max_wait_ms / 1000,
            search_threads=args.search_threads,
            max_queued=args.max_queued or None,
            admission=AdmissionLimits(
                cheap_cost=args.cheap_cost,
                max_cost=args.max_cost,
                max_waiting=args.max_waiting,
                max_memory_bytes=int(args.max_memory_mb * 2**20) or None,
            ),
            max_request_bytes=int(args.max_request_mb * 2**20),
            tls=tls,
            **group,
        )
        code = 0
    except OSError as e:  # a port in use: nothing was left serving
        code = fail(str(e))
    finally:
        if watcher is not None:
            watcher.stop(STOP_MARGIN)  # a load in progress need not finish
        # A request thread stuck in a call would hold the interpreter's exit (it joins them).
        exit_within(STOP_MARGIN, code)
    return code
