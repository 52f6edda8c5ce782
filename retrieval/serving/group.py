"""A serving group: N worker processes answering on one address, under one supervisor.

One Python process serves at most one core's worth of requests (the GIL). A group runs
``processes`` workers, each a whole server (its own micro-batcher, user tower and request
threads) built from the same options, listening on the same port with ``SO_REUSEPORT``: the
kernel spreads connections over them. The supervisor, the process that started them, loads no
model; it

* claims the port before any worker starts (:func:`hold_ports`): a port already served, by a
  single server or another group, fails the start instead of being shared; port 0 picks a free
  one, the same for every worker;
* reports the group healthy only when every worker is up and loaded: each worker's health
  service says SERVING only once the supervisor tells it so, and NOT_SERVING again while a
  worker is down;
* restarts a worker that exits (its replacement loads the version the group serves; the
  others keep answering meanwhile, NOT_SERVING), and stops the group when a replacement cannot
  start;
* with ``watch``, polls the deployment root itself and swaps versions in two phases, so that
  one version at a time serves: every worker loads and checks the new version, then all swap;
  if any worker refuses it, none swaps (:meth:`ServingGroup.reload`);
* serves the metrics of every worker summed (:class:`~retrieval.serving.metrics.GroupMetrics`);
* on SIGTERM or SIGINT, stops every worker with the same drain and grace as a single server,
  waits for them and returns 0. A worker whose supervisor dies (its control socket closes)
  stops on its own: no orphan keeps the port.

Workers are forked by multiprocessing's fork server (:func:`worker_context`), a fresh
interpreter that has imported :mod:`retrieval.serving.preload` (TensorFlow, Keras, FAISS,
NumPy) and nothing else: the workers share those pages instead of importing them each, and
none is a fork of a process that has started gRPC or run TensorFlow. Each runs
``options.worker`` (a picklable function) with a :class:`~retrieval.serving.worker.WorkerLink`,
the worker's side of the protocol below. Messages are tuples over a socket pair, the first item
their kind:

==========================  =========================================================
supervisor -> worker        worker -> supervisor
==========================  =========================================================
(the worker starts)         ``("ready", folder, model_version, refusals, reason)``, or
                            ``("failed", reason)``: could not start, exits
``("serving", bool)``       (none)
``("load", folder)``        ``("loaded", folder)`` or ``("refused", folder, reason)``
``("swap", folder)``        ``("swapped", folder)``
``("discard", folder, r)``  (none; ``r`` is the refusal's reason or ``None``)
``("stop", grace, drain)``  (none; the worker exits once drained)
==========================  =========================================================
"""

from __future__ import annotations

import contextlib
import errno
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import Any

from retrieval.serving.metrics import BasicAuth, GroupMetrics
from retrieval.serving.worker import run_worker
from retrieval.storage.versions import resolve_current

logger = logging.getLogger(__name__)

STOP_MARGIN = 30.0
"""Seconds a stopping worker gets beyond its drain and grace before it is killed."""

_POLL = 0.2
"""Seconds between two looks at the stop flag while waiting for workers."""


def hold_ports(host: str, port: int) -> tuple[list[socket.socket], int]:
    """Claims ``host:port`` for a serving group; ``port`` 0 picks a free one.

    Each address ``host`` resolves to is first bound without ``SO_REUSEPORT``, which fails if
    any socket is bound there (a single server, another group), then bound again with
    ``SO_REUSEPORT`` and held, not listening, until the group stops: the group's workers (which
    set ``SO_REUSEPORT`` too) can join it, and a later single server or group is refused. A
    foreign server setting ``SO_REUSEPORT`` (grpcio's default) under the same user could still
    join; ours never do. Between the two binds (microseconds) another process could take the port.

    Returns:
        The held sockets (close them when the group stops) and the port.

    Raises:
        OSError: the port is in use or cannot be bound (``errno.EADDRINUSE`` for in use).
    """
    held: list[socket.socket] = []
    addresses = {
        (family, address[0])
        for family, _, _, _, address in socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    }
    try:
        for family, address in sorted(addresses):
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((address, port))
                port = probe.getsockname()[1]
            holder = socket.socket(family, socket.SOCK_STREAM)
            held.append(holder)
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            holder.bind((address, port))
    except OSError as e:
        for holder in held:
            holder.close()
        cause = "the address is in use" if e.errno == errno.EADDRINUSE else e.strerror
        raise OSError(e.errno, f"cannot serve gRPC on {host}:{port}: {cause}") from None
    return held, port


@dataclass(frozen=True)
class GroupOptions:
    """What a serving group runs.

    Attributes:
        processes: worker processes (>= 1).
        worker: run in each worker with its :class:`~retrieval.serving.worker.WorkerLink`; must
            be picklable (a module-level function, or a ``functools.partial`` of one). It
            builds and serves the worker's server (``serve_forever(...,
            **link.server_options())``) and returns its exit code.
        host: the interface, as the workers bind it.
        port: the port the workers share (0: a free one).
        health_port: the plaintext health port the workers share, if any (claimed too).
        watch: a deployment root the supervisor watches for new versions (hot reload).
        watch_interval: seconds between two polls of ``watch``.
        grace: seconds in-flight calls get when the group stops.
        drain: seconds the workers keep answering, NOT_SERVING, before they stop.
        metrics_port: serve the group's metrics on this port (``None``: no metrics).
        metrics_host: the metrics endpoint's interface.
        metrics_auth: the credentials ``/metrics`` asks for, if any.
    """

    processes: int
    worker: Callable[[Any], int]
    host: str = "127.0.0.1"
    port: int = 0
    health_port: int | None = None
    watch: Path | None = None
    watch_interval: float = 2.0
    grace: float = 5.0
    drain: float = 0.0
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    metrics_auth: BasicAuth | None = None


class GroupError(Exception):
    """The group could not start, or stopped because a worker could not be replaced."""


@dataclass
class _Worker:
    """A worker process, the supervisor's end of its control socket, and what it reported."""

    number: int
    process: BaseProcess
    conn: Connection
    ready: bool = False
    folder: str | None = None
    version: str = ""

    def receive(self) -> tuple[Any, ...] | None:
        """The next message; ``None`` once the worker exited (its socket closed)."""
        try:
            message: tuple[Any, ...] = self.conn.recv()
        except (EOFError, OSError):
            return None
        return message

    def send(self, message: tuple[Any, ...]) -> None:
        with contextlib.suppress(OSError):  # it exited: the main loop sees its socket closed
            self.conn.send(message)

    def wait(self, timeout: float) -> int:
        """The worker's exit code, once it exited; killed after ``timeout`` seconds."""
        self.process.join(timeout)
        if self.process.exitcode is None:
            logger.error("worker %d (pid %d) did not stop: killed", self.number, self.process.pid)
            self.process.kill()
            self.process.join()
        self.conn.close()
        return int(self.process.exitcode or 0)


def worker_context() -> ForkServerContext | SpawnContext:
    """How workers start: forked by multiprocessing's fork server, which preloads
    :mod:`retrieval.serving.preload`, where the platform has one; fresh interpreters elsewhere."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["retrieval.serving.preload"])
    return context


class ServingGroup:
    """Runs a serving group until SIGTERM or SIGINT (see the module docstring).

    Example:
        >>> ServingGroup(GroupOptions(2, partial(serve_worker, argv), port=50051)).run()
    """

    def __init__(self, options: GroupOptions) -> None:
        if options.processes < 1:
            raise ValueError(f"processes must be >= 1, got {options.processes}")
        self.options = options
        self.port = options.port
        self.workers: list[_Worker] = []
        self.folder: str | None = None
        """The deployment version folder the group serves (``watch`` only)."""
        self.version = ""
        """The model version the group serves."""
        self._refused: set[str] = set()
        self._stopping = False
        self.up = False
        """Whether every worker has been up once (a worker failing before is a start failure)."""
        self._metrics_dir: Path | None = None
        self.metrics: GroupMetrics | None = None

    # ------------------------------------------------------------------------------- lifecycle

    def run(self) -> int:
        """Serves until a signal; returns 0 once every worker stopped.

        Raises:
            OSError: the gRPC, health or metrics port cannot be bound (nothing was started).
            GroupError: a worker could not start (its reason in the message), or a worker that
                exited could not be replaced; every worker is stopped.
        """
        held, self.port = hold_ports(self.options.host, self.options.port)
        if self.options.health_port is not None:
            held += hold_ports(self.options.host, self.options.health_port)[0]
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._start_metrics()
            self.folder = None if self.options.watch is None else str(resolve_current(self.options.watch))
            self.workers = [self._spawn(n) for n in range(self.options.processes)]
            self._loop()
        finally:
            self._stop_workers()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for holder in held:
                holder.close()
            if self.metrics is not None:
                self.metrics.close()
            if self._metrics_dir is not None:
                shutil.rmtree(self._metrics_dir, ignore_errors=True)
        logger.info("serving group stopped")
        return 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self._stopping:
            logger.info(
                "%s received, stopping %d workers (drain %.1f s, grace %.1f s)",
                signal.Signals(signum).name,
                len(self.workers),
                self.options.drain,
                self.options.grace,
            )
        self._stopping = True

    def _start_metrics(self) -> None:
        if self.options.metrics_port is None:
            return
        self._metrics_dir = Path(tempfile.mkdtemp(prefix="mitt-metrics-"))
        self.metrics = GroupMetrics(self._metrics_dir)
        host, port = self.options.metrics_host, self.options.metrics_port
        try:
            bound = self.metrics.serve(port, host, self.options.metrics_auth)
        except OSError as e:
            raise OSError(e.errno, f"cannot serve metrics on {host}:{port}: {e.strerror}") from None
        logger.info("metrics of the group on http://%s:%d/metrics", host, bound)

    def _spawn(self, number: int) -> _Worker:
        """Starts worker ``number`` on the group's version; it reports ``ready`` once loaded."""
        ours, theirs = (Connection(end.detach()) for end in socket.socketpair())
        link = {
            "number": number,
            "port": self.port,
            "folder": self.folder,
            "metrics": None if self._metrics_dir is None else str(self._metrics_dir),
            "grace": self.options.grace,
        }
        process = worker_context().Process(
            target=run_worker, args=(theirs, self.options.worker, link), name=f"mitt-worker-{number}"
        )
        with theirs:  # the worker holds its own copy once started
            process.start()
        logger.info("worker %d started (pid %d)", number, process.pid)
        return _Worker(number, process, ours)

    def _stop_workers(self) -> None:
        """Asks every worker to drain and stop, and waits for them (killing late ones)."""
        self._stopping = True
        for worker in self.workers:
            worker.send(("stop", self.options.grace, self.options.drain))
        deadline = time.monotonic() + self.options.drain + self.options.grace + STOP_MARGIN
        for worker in self.workers:
            code = worker.wait(max(0.0, deadline - time.monotonic()))
            if code:
                logger.warning(
                    "worker %d (pid %d) exited with code %d", worker.number, worker.process.pid, code
                )

    # ------------------------------------------------------------------------------- main loop

    def _loop(self) -> None:
        next_poll = time.monotonic() + self.options.watch_interval
        while not self._stopping:
            for worker in self._readable(self.workers):
                message = worker.receive()
                if message is None:
                    self._replace(worker, None)
                else:
                    self._handle(worker, message)
            if self.complete and self.options.watch is not None and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + self.options.watch_interval
                self.poll()

    @property
    def complete(self) -> bool:
        """Whether every worker is up and loaded."""
        return all(w.ready for w in self.workers)

    def _handle(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "failed":
            self._replace(worker, str(message[1]))
        elif kind == "ready":
            _, folder, version, refusals, reason = message
            worker.ready, worker.folder, worker.version = True, folder, version
            logger.info("worker %d (pid %d) loaded model %s", worker.number, worker.process.pid, version)
            if self.complete:
                self._group_up(refusals, reason)
        else:
            logger.warning("worker %d sent an unexpected %r", worker.number, kind)

    def _group_up(self, refusals: int, reason: str) -> None:
        """Every worker is ready: align their versions if they differ, then report SERVING."""
        folders = {w.folder for w in self.workers}
        if not self.up:
            self.up = True
            if self.folder is not None and self.folder not in folders:
                self._refused.add(self.folder)  # the workers fell back to an older version
            if self.metrics is not None and refusals:
                self.metrics.version.reload_refusals.inc(refusals)
            self.folder = self.workers[0].folder
        if len(folders) > 1 or len({w.version for w in self.workers}) > 1:
            # A version published while the workers started, read by some of them only.
            logger.warning("the workers loaded different versions: all move to %s", self.folder)
            if self.folder is None or not self.reload(self.folder):
                raise GroupError("the workers serve different model versions and cannot be aligned")
        self._set_version(self.workers[0].version)
        self._broadcast(("serving", True))
        if self.metrics is not None:
            self.metrics.workers.set(len(self.workers))
        logger.info(
            "serving group of %d workers on %s:%d, model %s, SERVING",
            len(self.workers),
            self.options.host,
            self.port,
            self.version,
        )

    def _replace(self, worker: _Worker, reason: str | None) -> None:
        """``worker`` exited (or failed to start): the group reports NOT_SERVING and the worker
        is restarted on the group's version; one that never came up stops the group."""
        code = worker.wait(STOP_MARGIN)  # killed if it said it failed but does not exit
        if self._stopping:
            return
        why = f": {reason}" if reason else ""
        if not worker.ready:
            raise GroupError(f"worker {worker.number} could not start (exit code {code}){why}")
        logger.error(
            "worker %d (pid %d) exited with code %d%s; the group is NOT_SERVING until its replacement is up",
            worker.number,
            worker.process.pid,
            code,
            why,
        )
        self._broadcast(("serving", False))
        if self.metrics is not None:
            self.metrics.workers.set(sum(w.ready for w in self.workers) - 1)
        self.workers[self.workers.index(worker)] = self._spawn(worker.number)

    @staticmethod
    def _readable(workers: list[_Worker]) -> list[_Worker]:
        """Those of ``workers`` with a message (or an exit) to read, after at most :data:`_POLL` s."""
        ready = wait([w.conn for w in workers], timeout=_POLL)
        return [w for w in workers if w.conn in ready]

    def _broadcast(self, message: tuple[Any, ...]) -> None:
        for worker in self.workers:
            worker.send(message)

    def _set_version(self, version: str) -> None:
        if self.metrics is not None:
            self.metrics.version.serves(self.version or None, version)
        self.version = version

    # ------------------------------------------------------------------------------ hot reload

    def poll(self) -> bool:
        """Swaps the watched root's current version in if it is new (:meth:`reload`)."""
        assert self.options.watch is not None
        folder = str(resolve_current(self.options.watch))
        if folder == self.folder or folder in self._refused:
            return False
        return self.reload(folder)

    def reload(self, folder: str) -> bool:
        """Moves every worker to the version ``folder`` in two phases: all load and check it,
        then all swap; a refusal by any worker (or a worker lost meanwhile) leaves every
        worker on the old version. Returns ``True`` when the group swapped."""
        logger.info("loading %s in %d workers", folder, len(self.workers))
        self._broadcast(("load", folder))
        replies = self._collect({"loaded", "refused"})
        refusals = [] if replies is None else [r for r in replies if r[0] == "refused"]
        if replies is None or refusals:
            reason = str(refusals[0][2]) if refusals else None
            self._broadcast(("discard", folder, reason))
            if reason is not None:
                self._refused.add(folder)
                if self.metrics is not None:
                    self.metrics.version.reload_refusals.inc()
                logger.error("refused the new %s; still serving model %s", reason, self.version)
            return False
        self._broadcast(("swap", folder))
        swapped = self._collect({"swapped"})
        if swapped is None:  # a worker was lost while swapping: its replacement loads ``folder``
            self.folder = folder
            return False
        self.folder = folder
        self._set_version(str(swapped[0][2]))
        logger.info("the group now serves model %s from %s", self.version, folder)
        return True

    def _collect(self, kinds: set[str]) -> list[tuple[Any, ...]] | None:
        """One reply of ``kinds`` from every worker, in worker order; ``None`` if a worker
        exited meanwhile (it is replaced) or the group is stopping."""
        replies: dict[int, tuple[Any, ...]] = {}
        while len(replies) < len(self.workers):
            if self._stopping:
                return None
            for worker in self._readable([w for w in self.workers if w.number not in replies]):
                message = worker.receive()
                if message is None:
                    self._replace(worker, None)
                    return None
                if message[0] in kinds:
                    replies[worker.number] = message
                else:
                    self._handle(worker, message)
        return [replies[w.number] for w in self.workers]


def default_processes() -> int:
    """The cores this process may run on (``os.sched_getaffinity``)."""
    return len(os.sched_getaffinity(0))


def serve_group(options: GroupOptions) -> int:
    """Runs :class:`ServingGroup` (``options``); returns its exit code: 0 once stopped, 2 when it
    could not start (the reason printed to stderr), 1 when a worker could not be replaced."""
    group = ServingGroup(options)
    try:
        return group.run()
    except OSError as e:
        print(f"error: {e.strerror or e}", file=sys.stderr)
        return 2
    except GroupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1 if group.up else 2
