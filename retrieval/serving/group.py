"""A serving group: N worker processes answering on one address, under one supervisor.

One Python process serves at most one core's worth of requests (the GIL). A group runs
``processes`` workers, each a whole server (its own micro-batcher, user tower and request
threads) built from the same options, listening on the same port with ``SO_REUSEPORT``: the
kernel spreads connections over them. The supervisor, the process that started them, loads no
model; it

* claims the port before any worker starts (:func:`hold_ports`), on every address the host
  resolves to: a port already served, by a single server or another group, fails the start
  instead of being shared; port 0 picks a free one, the same for every worker;
* reports the group healthy once every worker is up and loaded: each worker's health service
  says SERVING only once the supervisor tells it so;
* restarts a worker that exits (its replacement loads the version the group serves, and
  reports SERVING once loaded; the others keep answering, SERVING, meanwhile), and stops the
  group when a replacement cannot start;
* pings every loaded worker each :data:`HEARTBEAT_INTERVAL` seconds; a worker that has not
  answered for :data:`HEARTBEAT_TIMEOUT` seconds (stopped, hung) is killed, logged and
  replaced, as one that exited;
* with ``watch``, polls the deployment root itself and swaps versions in two phases, so that
  one version at a time serves: every worker loads and checks the new version, then all swap;
  if any worker refuses it, none swaps (:meth:`ServingGroup.reload`);
* serves the metrics of every worker summed, and whether each is up
  (:class:`~retrieval.serving.metrics.GroupMetrics`);
* on SIGTERM or SIGINT, stops every worker with the same drain and grace as a single server,
  waits for them (killing those still there :data:`STOP_MARGIN` seconds after the grace) and
  returns 0; a second signal, or a stop still running ``2 * STOP_MARGIN`` seconds after the
  grace, kills every worker and exits 1 (:class:`~retrieval.serving.stopping.StopGuard`). A
  worker whose supervisor dies (its control socket closes) stops on its own: no orphan keeps
  the port, and the last one removes the metrics folder.

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
``("ping", t)``             ``("pong", t)``, at once, from a thread no request or load holds
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
from typing import Any

from retrieval.serving.addresses import host_addresses
from retrieval.serving.config import ServerConfig
from retrieval.serving.metrics import BasicAuth, GroupMetrics
from retrieval.serving.stopping import STOP_MARGIN, StopGuard
from retrieval.serving.worker import leave_folder, run_worker, use_folder
from retrieval.storage.versions import resolve_current

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL = 0.5
"""Seconds between two pings of a loaded worker."""

HEARTBEAT_TIMEOUT = 5.0
"""Seconds without an answer after which a loaded worker is taken for hung, killed and replaced:
well above what a busy worker takes (its control thread answers between two requests' Python
steps), well below what a client waits on a new connection."""

_POLL = 0.2
"""Seconds between two looks at the stop flag while waiting for workers."""


def hold_ports(host: str, port: int) -> tuple[list[socket.socket], int]:
    """Claims ``host:port`` for a serving group; ``port`` 0 picks a free one.

    Each address ``host`` resolves to (:func:`~retrieval.serving.addresses.host_addresses`) is
    first bound without ``SO_REUSEPORT``, which fails if any socket is bound there (a single
    server, another group), then bound again with ``SO_REUSEPORT`` and held, not listening,
    until the group stops: the group's workers (which set ``SO_REUSEPORT`` too) can join it,
    and a later single server or group is refused. A foreign server setting ``SO_REUSEPORT``
    (grpcio's default) under the same user could still join; ours never do. Between the two
    binds (microseconds) another process could take the port.

    Returns:
        The held sockets (close them when the group stops) and the port.

    Raises:
        OSError: the port is in use or cannot be bound (``errno.EADDRINUSE`` for in use).
    """
    held: list[socket.socket] = []
    try:
        for family, address in host_addresses(host):
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
        config: the server's settings, of which the supervisor reads its ``processes``
            (``None``: one per core), the ``host`` and ``port`` the workers share (0: a free
            one), the plaintext ``access.health_port`` they share (claimed too), the ``watch``
            root it polls every ``watch_interval`` seconds, the stop's ``drain`` and ``grace``,
            and the group's ``metrics`` endpoint.
        worker: run in each worker with its :class:`~retrieval.serving.worker.WorkerLink`; must
            be picklable (a module-level function, or a ``functools.partial`` of one). It
            builds and serves the worker's server (``serve_forever(retriever,
            link.worker_config(config), **link.server_options(slot))``) and returns its exit code.
        metrics_auth: the credentials ``/metrics`` asks for, if any (read from ``config.metrics``).
    """

    config: ServerConfig
    worker: Callable[[Any], int]
    metrics_auth: BasicAuth | None = None

    @property
    def processes(self) -> int:
        """Worker processes: ``config.processes``, or one per core."""
        return self.config.processes or default_processes()


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
    answered: float = 0.0
    """When it last answered (:func:`time.monotonic`): its ``ready``, then each ``pong``."""

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
            self.kill()
            self.process.join()
        self.conn.close()
        return int(self.process.exitcode or 0)

    def kill(self) -> None:
        """SIGKILL (a stopped process dies too); nothing if it already exited."""
        with contextlib.suppress(OSError):
            self.process.kill()


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
        >>> ServingGroup(GroupOptions(ServerConfig(processes=2), partial(serve_worker, config))).run()
    """

    def __init__(self, options: GroupOptions) -> None:
        self.options = options
        self.config = options.config
        self.port = options.config.port
        self.workers: list[_Worker] = []
        self.folder: str | None = None
        """The deployment version folder the group serves (``watch`` only)."""
        self.version = ""
        """The model version the group serves."""
        self._refused: set[str] = set()
        self._stop_asked = False
        self._guard: StopGuard | None = None
        self._next_ping = 0.0
        self.up = False
        """Whether every worker has been up once (a worker failing before is a start failure)."""
        self._metrics_dir: Path | None = None
        self._metrics_lock: int | None = None
        self.metrics: GroupMetrics | None = None

    # ------------------------------------------------------------------------------- lifecycle

    def run(self) -> int:
        """Serves until a signal; returns 0 once every worker stopped.

        Raises:
            OSError: the gRPC, health or metrics port cannot be bound (nothing was started).
            GroupError: a worker could not start (its reason in the message), or a worker that
                exited could not be replaced; every worker is stopped.
        """
        config = self.config
        held, self.port = hold_ports(config.host, config.port)
        if config.access.health_port:
            held += hold_ports(config.host, config.access.health_port)[0]
        budget = config.drain + config.grace + 2 * STOP_MARGIN
        try:
            with StopGuard(budget, cleanup=self._kill_all) as self._guard:
                try:
                    self._start_metrics()
                    self.folder = None if config.watch is None else str(resolve_current(Path(config.watch)))
                    self.workers = [self._spawn(n) for n in range(self.options.processes)]
                    self._loop()
                finally:
                    self._stop_workers()
        finally:
            for holder in held:
                holder.close()
            if self.metrics is not None:
                self.metrics.close()
            self._remove_metrics_dir()
        logger.info("serving group stopped")
        return 0

    @property
    def stopping(self) -> bool:
        """Whether the group is stopping (a signal, or :meth:`_stop_workers`)."""
        return self._stop_asked or (self._guard is not None and bool(self._guard.signals))

    def _kill_all(self) -> None:
        """A forced exit's cleanup: no worker outlives the supervisor, nor does the metrics folder."""
        workers = list(self.workers)
        for worker in workers:
            worker.kill()
        for worker in workers:  # dead before the supervisor is: nothing outlives it
            worker.process.join(1.0)
        if self._metrics_dir is not None:
            shutil.rmtree(self._metrics_dir, ignore_errors=True)

    def _start_metrics(self) -> None:
        if not self.config.metrics.port:
            return
        self._metrics_dir = Path(tempfile.mkdtemp(prefix="mitt-metrics-"))
        self._metrics_lock = use_folder(self._metrics_dir)  # the workers' own locks join it
        self.metrics = GroupMetrics(self._metrics_dir)
        host, port = self.config.metrics.host, self.config.metrics.port
        try:
            bound = self.metrics.serve(port, host, self.options.metrics_auth)
        except OSError as e:
            raise OSError(e.errno, f"cannot serve metrics on {host}:{port}: {e.strerror}") from None
        logger.info("metrics of the group on http://%s:%d/metrics", host, bound)

    def _remove_metrics_dir(self) -> None:
        """Removes the metrics folder (every worker has stopped: none writes there any more)."""
        if self._metrics_dir is not None and self._metrics_lock is not None:
            leave_folder(self._metrics_dir, self._metrics_lock)
            shutil.rmtree(self._metrics_dir, ignore_errors=True)  # even if a killed worker's lock lingers
            self._metrics_lock = None

    def _spawn(self, number: int) -> _Worker:
        """Starts worker ``number`` on the group's version; it reports ``ready`` once loaded (and,
        in a group already up, serves at once if it loaded that version)."""
        ours, theirs = (Connection(end.detach()) for end in socket.socketpair())
        link = {
            "number": number,
            "port": self.port,
            "folder": self.folder,
            "metrics": None if self._metrics_dir is None else str(self._metrics_dir),
            "grace": self.config.grace,
            "serve_when_loaded": self.up,
        }
        process = worker_context().Process(
            target=run_worker, args=(theirs, self.options.worker, link), name=f"mitt-worker-{number}"
        )
        with theirs:  # the worker holds its own copy once started
            process.start()
        logger.info("worker %d started (pid %d)", number, process.pid)
        return _Worker(number, process, ours)

    def _stop_workers(self) -> None:
        """Asks every worker to drain and stop, and waits for them: each one's own guard ends it
        :data:`STOP_MARGIN` s after its grace; one still there then (stopped, hung) is killed."""
        if self._guard is not None and self._guard.signals:
            logger.info(
                "%s received, stopping %d workers (drain %.1f s, grace %.1f s)",
                self._guard.signal_name,
                len(self.workers),
                self.config.drain,
                self.config.grace,
            )
        self._stop_asked = True
        for worker in self.workers:
            worker.send(("stop", self.config.grace, self.config.drain))
        deadline = time.monotonic() + self.config.drain + self.config.grace + STOP_MARGIN
        for worker in self.workers:
            code = worker.wait(max(0.0, deadline - time.monotonic()))
            if code:
                logger.warning(
                    "worker %d (pid %d) exited with code %d", worker.number, worker.process.pid, code
                )

    # ------------------------------------------------------------------------------- main loop

    def _loop(self) -> None:
        next_poll = time.monotonic() + self.config.watch_interval
        while not self.stopping:
            for worker in self._readable(self.workers):
                message = worker.receive()
                if message is None:
                    self._replace(worker, None)
                else:
                    self._handle(worker, message)
            self._heartbeat()
            if self.complete and self.config.watch is not None and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + self.config.watch_interval
                self.poll()

    @property
    def complete(self) -> bool:
        """Whether every worker is up and loaded."""
        return all(w.ready for w in self.workers)

    def _handle(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "pong":
            worker.answered = time.monotonic()
        elif kind == "failed":
            self._replace(worker, str(message[1]))
        elif kind == "ready":
            _, folder, version, refusals, reason = message
            worker.ready, worker.folder, worker.version = True, folder, version
            worker.answered = time.monotonic()
            logger.info("worker %d (pid %d) loaded model %s", worker.number, worker.process.pid, version)
            self._report_up()
            if self.complete:
                self._group_up(refusals, reason)
        else:
            logger.warning("worker %d sent an unexpected %r", worker.number, kind)

    def _heartbeat(self) -> bool:
        """Pings the loaded workers every :data:`HEARTBEAT_INTERVAL` s, and kills and replaces
        one that has not answered for :data:`HEARTBEAT_TIMEOUT` s. Called after the messages
        waiting were read, so a supervisor that was itself held up counts their answers first.
        Returns whether a worker was replaced."""
        now = time.monotonic()
        if now >= self._next_ping:
            self._next_ping = now + HEARTBEAT_INTERVAL
            for worker in self.workers:
                if worker.ready:
                    worker.send(("ping", now))
        for worker in self.workers:
            silent = now - worker.answered
            if worker.ready and silent > HEARTBEAT_TIMEOUT:
                worker.kill()
                self._replace(worker, f"killed, it had not answered for {silent:.1f} s (stopped or hung)")
                return True
        return False

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
        logger.info(
            "serving group of %d workers on %s:%d, model %s, SERVING",
            len(self.workers),
            self.config.host,
            self.port,
            self.version,
        )

    def _replace(self, worker: _Worker, reason: str | None) -> None:
        """``worker`` exited, failed to start or was killed: it is restarted on the group's
        version while the others keep serving; one that never came up stops the group."""
        code = worker.wait(2 * STOP_MARGIN)  # killed if it said it failed but does not exit
        if self.metrics is not None and worker.process.pid is not None:
            self.metrics.worker_gone(worker.process.pid)
        if self.stopping:
            return
        why = f": {reason}" if reason else ""
        if not worker.ready:
            raise GroupError(f"worker {worker.number} could not start (exit code {code}){why}")
        logger.error(
            "worker %d (pid %d) exited with code %d%s; the other workers keep serving while it is replaced",
            worker.number,
            worker.process.pid,
            code,
            why,
        )
        self.workers[self.workers.index(worker)] = self._spawn(worker.number)
        self._report_up()

    def _report_up(self) -> None:
        """Exports which workers are up and loaded (``retrieval_worker_up``, ``retrieval_workers``)."""
        if self.metrics is None:
            return
        for worker in self.workers:
            self.metrics.worker_up.labels(str(worker.number)).set(int(worker.ready))
        self.metrics.workers.set(sum(w.ready for w in self.workers))

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
        assert self.config.watch is not None
        folder = str(resolve_current(Path(self.config.watch)))
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
        exited or hung meanwhile (it is replaced) or the group is stopping."""
        replies: dict[int, tuple[Any, ...]] = {}
        while len(replies) < len(self.workers):
            if self.stopping:
                return None
            for worker in self._readable(self.workers):  # all: the others' heartbeats too
                message = worker.receive()
                if message is None:
                    self._replace(worker, None)
                    return None
                if message[0] in kinds:
                    replies[worker.number] = message
                else:
                    self._handle(worker, message)
            if self._heartbeat():
                return None
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
