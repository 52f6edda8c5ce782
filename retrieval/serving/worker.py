"""A serving group's worker process: its side of the protocol of :mod:`retrieval.serving.group`.

:func:`run_worker` is what a group's supervisor starts in each worker process, with the
worker's end of its control socket, the function to run and this worker's options; it runs the
function with a :class:`WorkerLink`. The function builds the same server a single process
would, with :meth:`WorkerLink.worker_config` and :meth:`WorkerLink.server_options` (the group's
port, shared; NOT_SERVING until the group is up; per-request metrics summed by the supervisor)
and ``on_start=link.start``; a control thread then follows the supervisor's messages: health,
two-phase version swaps, stop. When the control socket closes (the supervisor is gone, even
killed), the worker stops by itself.
"""

from __future__ import annotations

import dataclasses
import fcntl
import gc
import logging
import os
import queue
import shutil
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from retrieval.serving.config import ServerConfig
    from retrieval.serving.metrics import Metrics
    from retrieval.serving.reload import RetrieverSlot
    from retrieval.serving.retriever import Retriever
    from retrieval.serving.server import StartedServer

logger = logging.getLogger(__name__)


FOLDER_LOCK = ".in-use"
"""The file in a group's metrics folder that every process using the folder holds a shared lock on."""


def use_folder(folder: Path) -> int:
    """Marks ``folder`` as used by this process until :func:`leave_folder`, or its death (the
    kernel drops the lock of a killed process); returns the lock's file descriptor."""
    fd = os.open(folder / FOLDER_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def leave_folder(folder: Path, fd: int) -> bool:
    """Stops using ``folder`` (``fd`` from :func:`use_folder`) and removes it if no other
    process uses it; returns whether it removed it.

    Each process lets go of its shared lock before it asks for the exclusive one, so of
    processes leaving at once the last one removes the folder.
    """
    os.close(fd)
    try:
        fd = os.open(folder / FOLDER_LOCK, os.O_RDWR)
    except FileNotFoundError:  # another process removed it
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # still in use
        os.close(fd)
        return False
    shutil.rmtree(folder, ignore_errors=True)
    os.close(fd)
    return True


class WorkerLink:
    """A worker's end of its group's control socket.

    Attributes:
        number: the worker's number in its group (0..N-1).
        port: the port the group's workers share.
        folder: the deployment version folder to serve (the group's; ``None`` without a watched
            deployment).
    """

    def __init__(
        self,
        conn: Connection,
        number: int,
        port: int,
        folder: str | None,
        metrics: str | None,
        grace: float,
        serve_when_loaded: bool = False,
    ) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self.number = number
        self.port = port
        self.folder = None if folder is None else Path(folder)
        self._metrics = None if metrics is None else Path(metrics)
        self._metrics_lock: int | None = None
        if self._metrics is not None:  # read by prometheus_client when the worker imports it
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(self._metrics)
            self._metrics_lock = use_folder(self._metrics)
        self._grace = grace
        self._serve_when_loaded = serve_when_loaded

    def send(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            self._conn.send(message)

    def worker_config(self, config: ServerConfig) -> ServerConfig:
        """The group's ``config`` as this worker serves it: on the group's port (the one it
        claimed, when ``config`` said 0), without a metrics port of its own (the supervisor
        serves the group's)."""
        return dataclasses.replace(
            config, port=self.port, metrics=dataclasses.replace(config.metrics, port=0)
        )

    def server_options(self, slot: RetrieverSlot) -> dict[str, Any]:
        """What :func:`~retrieval.serving.run.serve_forever` takes besides its config to
        serve ``slot`` as this worker: the group's port shared (``reuse_port``), the
        per-request metrics (:class:`~retrieval.serving.metrics.Metrics` as a worker) when the
        group has metrics, and NOT_SERVING until the supervisor says the group is up, except
        for a replacement in a group that is up and serving the version it loaded: SERVING at
        once."""
        same_version = self.folder is None or slot.folder == self.folder.resolve()
        serving = self._serve_when_loaded and same_version
        return {"reuse_port": True, "serving": serving, "metrics": self.metrics()}

    def metrics(self) -> Metrics | None:
        if self._metrics is None:
            return None
        from retrieval.serving.metrics import Metrics

        return Metrics(worker=True)

    def failed(self, reason: str) -> None:
        """Tells the supervisor this worker could not start (it then exits)."""
        self.send(("failed", reason))

    def start(self, server: StartedServer) -> None:
        """Reports ``server`` ready to the supervisor and follows its messages in daemon threads
        (pass it as ``serve_forever``'s ``on_start``)."""
        slot = server.slot
        folder = None if slot.folder is None else str(slot.folder)
        self.send(("ready", folder, slot.current.model_version, slot.refusals, slot.last_refusal))
        versions: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        threading.Thread(
            target=self._follow, args=(server, versions), name="group-control", daemon=True
        ).start()
        threading.Thread(
            target=self._versions, args=(server, versions), name="group-versions", daemon=True
        ).start()

    def close(self) -> None:
        """Lets go of the group's metrics folder, removing it if this is the last process
        using it (the supervisor was killed)."""
        if self._metrics is not None and self._metrics_lock is not None:
            leave_folder(self._metrics, self._metrics_lock)
            self._metrics_lock = None

    def _follow(self, server: StartedServer, versions: queue.SimpleQueue[tuple[Any, ...] | None]) -> None:
        """Reads the supervisor's messages: heartbeats, health and stop are answered here at
        once (none of them waits); version work, which takes seconds, goes to ``versions``."""
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                logger.error("the serving group's supervisor is gone: worker %d stops", self.number)
                server.stop(self._grace)
                versions.put(None)
                return
            kind = message[0]
            if kind == "ping":
                self.send(("pong", message[1]))
            elif kind == "serving":
                if not server.stopping:
                    server.set_serving(bool(message[1]))
            elif kind == "stop":
                server.stop(float(message[1]), float(message[2]))
                versions.put(None)
                return
            else:
                versions.put(message)

    def _versions(self, server: StartedServer, messages: queue.SimpleQueue[tuple[Any, ...] | None]) -> None:
        """Loads, swaps and discards versions as the supervisor asks (two-phase reload)."""
        from retrieval.serving.reload import describe_error, load_deployment, swap_version
        from retrieval.storage.manifest import ArtifactError

        slot = server.slot
        pending: Retriever | None = None
        while (message := messages.get()) is not None:
            kind = message[0]
            if kind == "load":
                folder = Path(message[1])
                try:
                    pending = load_deployment(folder, reuse=slot.current)
                except ArtifactError as e:
                    pending = None
                    self.send(("refused", str(folder), describe_error(e, limit=2000)))
                else:
                    self.send(("loaded", str(folder)))
            elif kind == "swap":
                if pending is not None:
                    swap_version(slot, Path(message[1]), pending)
                pending = None
                self.send(("swapped", message[1], slot.current.model_version))
            elif kind == "discard":
                pending = None
                if message[2] is not None:  # counted in GetModelInfo, as a single server does
                    slot.refuse(Path(message[1]), ArtifactError(message[2]))
                gc.collect()


def run_worker(conn: Connection, run: Callable[[WorkerLink], int], options: dict[str, Any]) -> None:
    """A worker process's body: ``run`` with a :class:`WorkerLink` over ``conn`` (``options``
    are the link's); exits with the code ``run`` returns."""
    link = WorkerLink(conn, **options)
    try:
        code = int(run(link))
    finally:
        link.close()
    sys.exit(code)
