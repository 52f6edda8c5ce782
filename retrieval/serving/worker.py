"""A serving group's worker process: its side of the protocol of :mod:`retrieval.serving.group`.

:func:`run_worker` is what a group's supervisor starts in each worker process, with the
worker's end of its control socket, the function to run and this worker's options; it runs the
function with a :class:`WorkerLink`. The function builds the same server a single process would, with
:meth:`WorkerLink.server_options` (the group's port, shared; NOT_SERVING until the group is
up; per-request metrics summed by the supervisor) and ``on_start=link.start``; a control
thread then follows the supervisor's messages: health, two-phase version swaps, stop. When the
control socket closes (the supervisor is gone, even killed), the worker stops by itself.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from retrieval.serving.metrics import Metrics
    from retrieval.serving.retriever import Retriever
    from retrieval.serving.server import RetrievalServer

logger = logging.getLogger(__name__)


class WorkerLink:
    """A worker's end of its group's control socket.

    Attributes:
        number: the worker's number in its group (0..N-1).
        port: the port the group's workers share.
        folder: the deployment version folder to serve (the group's; ``None`` without a watched
            deployment).
    """

    def __init__(
        self, conn: Connection, number: int, port: int, folder: str | None, metrics: str | None, grace: float
    ) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self.number = number
        self.port = port
        self.folder = None if folder is None else Path(folder)
        self._metrics = metrics is not None
        if metrics is not None:  # read by prometheus_client when the worker imports it
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics
        self._grace = grace

    def send(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            self._conn.send(message)

    def server_options(self) -> dict[str, Any]:
        """What :func:`~retrieval.serving.server.serve_forever` takes to serve as this worker:
        the group's port shared (``reuse_port``), NOT_SERVING at first, and the per-request
        metrics (:class:`~retrieval.serving.metrics.Metrics` as a worker) when the group has
        metrics."""
        return {"port": self.port, "reuse_port": True, "serving": False, "metrics": self.metrics()}

    def metrics(self) -> Metrics | None:
        if not self._metrics:
            return None
        from retrieval.serving.metrics import Metrics

        return Metrics(worker=True)

    def failed(self, reason: str) -> None:
        """Tells the supervisor this worker could not start (it then exits)."""
        self.send(("failed", reason))

    def start(self, server: RetrievalServer) -> None:
        """Reports ``server`` ready to the supervisor and follows its messages in a daemon thread
        (pass it as ``serve_forever``'s ``on_start``)."""
        slot = server.slot
        folder = None if slot.folder is None else str(slot.folder)
        self.send(("ready", folder, slot.current.model_version, slot.refusals, slot.last_refusal))
        threading.Thread(target=self._follow, args=(server,), name="group-control", daemon=True).start()

    def _follow(self, server: RetrievalServer) -> None:
        from retrieval.serving.reload import describe_error, load_deployment, swap_version
        from retrieval.storage.manifest import ArtifactError

        slot = server.slot
        pending: Retriever | None = None
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                logger.error("the serving group's supervisor is gone: worker %d stops", self.number)
                server.stop(self._grace)
                return
            kind = message[0]
            if kind == "serving":
                if not server.stopping:
                    server.set_serving(bool(message[1]))
            elif kind == "load":
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
            elif kind == "stop":
                server.stop(float(message[1]), float(message[2]))
                return


def run_worker(conn: Connection, run: Callable[[WorkerLink], int], options: dict[str, Any]) -> None:
    """A worker process's body: ``run`` with a :class:`WorkerLink` over ``conn`` (``options``
    are the link's); exits with the code ``run`` returns."""
    sys.exit(int(run(WorkerLink(conn, **options))))
