"""The native engine as ``mitt serve --engine native`` runs it: :func:`create_native_server` starts
a :class:`~retrieval.serving.native.NativeServer` on a :class:`RetrieverSlot`'s version, following
its swaps, and returns it as a :class:`~retrieval.serving.server.StartedServer`, which
:func:`~retrieval.serving.run.serve_forever` and a serving group's worker drive as they drive
the Python engine's: health, SIGTERM's drain and grace, hot reload, the group's two-phase swaps.

Example:
    >>> server, port = create_native_server(retriever, ServerConfig(port=0, engine="native"))
    >>> server.stop(grace=5.0).wait()
"""

from __future__ import annotations

import threading

from retrieval.serving.access import AccessControl
from retrieval.serving.addresses import host_addresses, join_host_port
from retrieval.serving.config import ServerConfig, check_server_config
from retrieval.serving.metrics import Metrics
from retrieval.serving.native import NativeServer, check_native
from retrieval.serving.native_kernel import native_servable
from retrieval.serving.native_metrics import NativeMetrics
from retrieval.serving.reload import RetrieverSlot
from retrieval.serving.retriever import Retriever
from retrieval.serving.server import StartedServer

__all__ = ["NativeRetrievalServer", "create_native_server"]


class NativeRetrievalServer(StartedServer):
    """A started native server (:func:`create_native_server`): stop it with :meth:`stop`."""

    def __init__(
        self,
        server: NativeServer,
        port: int,
        slot: RetrieverSlot,
        metrics: NativeMetrics | None = None,
        health_port: int | None = None,
    ) -> None:
        super().__init__(port, slot, health_port)
        self.engine = server
        """The engine itself (its counters)."""
        self._metrics = metrics
        self._terminated = threading.Event()

    def set_serving(self, serving: bool) -> None:
        self.engine.set_serving(serving)

    def _shut_down(self, grace: float | None) -> threading.Event:
        def stop() -> None:
            self.engine.stop(grace or 0.0)  # blocks until every call has finished (GIL released)
            if self._metrics is not None:
                self._metrics.stop()  # the last calls counted
            self._terminated.set()

        threading.Thread(target=stop, name="native-stop", daemon=True).start()
        return self._terminated

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return not self._terminated.wait(timeout)


def create_native_server(
    retriever: Retriever | RetrieverSlot,
    config: ServerConfig | None = None,
    *,
    access: AccessControl | None = None,
    metrics: Metrics | None = None,
    reuse_port: bool = False,
    serving: bool = True,
) -> tuple[NativeRetrievalServer, int]:
    """Starts the native engine for ``retriever`` as ``config`` says: its address (every one its
    host resolves to), micro-batching, limits, access control and FAISS threads; each swap of the
    slot (a :class:`~retrieval.serving.reload.DeploymentWatcher`'s, a group's) is handed to the
    engine.

    Args:
        retriever: answers the requests; a :class:`RetrieverSlot` to swap it while serving.
        config: how to serve; ``None``: its defaults.
        access: who may call, and how often; ``None``: as ``config.access`` says
            (:meth:`AccessControl.from_config`, which reads its files).
        metrics: where the engine's counts go (:class:`NativeMetrics`), under the Python
            engine's names; ``None`` for none. Its HTTP endpoint is started separately.
        reuse_port: share the port with other servers that set it (a serving group's workers).
        serving: report SERVING once started; ``False`` leaves it NOT_SERVING until
            :meth:`~retrieval.serving.server.StartedServer.set_serving`.

    Returns:
        ``(server, bound port)``; the server is started.

    Raises:
        ValueError: fields of ``config`` that do not go together, an option the native engine
            does not implement yet (:func:`~retrieval.serving.native.check_native`), an invalid
            access file.
        NativeEngineMissing: the engine is not built.
        OSError: an address cannot be bound (nothing is left serving), or a file of
            ``config.access`` cannot be read.
    """
    config = check_server_config(config or ServerConfig(engine="native"), artifacts=False)
    check_native(config)
    access = AccessControl.from_config(config) if access is None else access
    slot = retriever if isinstance(retriever, RetrieverSlot) else RetrieverSlot(retriever)
    addresses = _addresses(config.host, config.port)
    threads = config.search_threads
    server = NativeServer(
        native_servable(slot.current, slot.model_info(), threads),
        batching=config.batching,
        limits=config.limits,
        access=access,
        reflection=config.access.reflection,
        tls=config.tls,
    )
    try:
        port = server.start(addresses, serving=serving, reuse_port=reuse_port)
    except RuntimeError:
        server.stop(0)  # its access file's thread too
        raise OSError(
            f"cannot serve gRPC on {config.host}:{config.port}: the address is in use or not available"
        ) from None
    health_port = _health_port(server, config, reuse_port)
    server.follow(slot, threads)
    moved = None
    if metrics is not None:
        metrics.follow(slot)
        if access.identities is not None:
            metrics.follow_access(access.identities)
        moved = NativeMetrics(server, metrics)
        moved.start()
    return NativeRetrievalServer(server, port, slot, moved, health_port), port


def _health_port(server: NativeServer, config: ServerConfig, reuse_port: bool) -> int | None:
    """The plaintext health port's, if ``config`` asks for one, started on every address of its
    host as the Python engine starts it.

    Raises:
        OSError: it cannot be bound; ``server`` is stopped.
    """
    host, port = config.host, config.access.health_port
    if not port:
        return None
    try:
        return server.start_health(_addresses(host, port, "the health port"), reuse_port=reuse_port)
    except (OSError, RuntimeError) as e:
        server.stop(0)
        if isinstance(e, OSError):
            raise
        raise OSError(
            f"cannot serve the health port on {host}:{port}: the address is in use or not available"
        ) from None


def _addresses(host: str, port: int, what: str = "gRPC") -> list[str]:
    """``address:port`` of every address ``host`` resolves to, as the Python engine binds them
    (:func:`~retrieval.serving.addresses.bind_every_address`).

    Raises:
        OSError: ``host`` does not resolve, or resolves to several addresses with ``port`` 0
            (each would get a port of its own).
    """
    try:
        found = [address for _, address in host_addresses(host)]
    except OSError as e:
        raise OSError(f"cannot serve {what} on {host}:{port}: {e.strerror or e}") from None
    if port == 0 and len(found) > 1:
        raise OSError(
            f"cannot serve {what} on {host}:0 with the native engine: {host} has {len(found)} addresses "
            "and each would get a port of its own; give a port"
        )
    return [join_host_port(address, port) for address in found]
