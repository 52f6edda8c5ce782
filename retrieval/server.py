"""gRPC server for ``retrieval.v1.RetrievalService``: message conversion around a :class:`Retriever`.

Besides the service it exposes the standard health service (SERVING only once the retriever
is in place) and server reflection, so ``grpcurl`` and load balancers work without the
``.proto``.
"""

from __future__ import annotations

import logging
import signal
from concurrent import futures
from types import FrameType

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from proto import retrieval_pb2, retrieval_pb2_grpc
from retrieval.errors import (
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    RetrievalError,
    Unavailable,
)
from retrieval.retriever import Retriever

logger = logging.getLogger(__name__)

SERVICE_NAME: str = retrieval_pb2.DESCRIPTOR.services_by_name["RetrievalService"].full_name

_STATUS: dict[type[RetrievalError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_for(error: Exception) -> tuple[grpc.StatusCode, str]:
    """The gRPC status code and details to answer ``error`` with.

    Domain errors keep their message; anything else is a bug: it becomes INTERNAL with a
    generic message (internals stay out of responses) and its traceback goes to the log.
    """
    for error_type, code in _STATUS.items():
        if isinstance(error, error_type):
            return code, str(error)
    logger.error("internal error while serving a request", exc_info=error)
    return grpc.StatusCode.INTERNAL, f"internal error ({type(error).__name__}), see the server log"


class RetrievalServicer(retrieval_pb2_grpc.RetrievalServiceServicer):
    """Converts messages and errors; all logic lives in the :class:`Retriever`."""

    def __init__(self, retriever: Retriever) -> None:
        self._retriever = retriever

    def Retrieve(
        self, request: retrieval_pb2.RetrieveRequest, context: grpc.ServicerContext
    ) -> retrieval_pb2.RetrieveResponse:
        try:
            if request.events and request.history:
                raise InvalidArgument("send the history either as history or as events, not both")
            if request.events:
                events = request.events
                result = self._retriever.retrieve(
                    [e.item_id for e in events],
                    request.k,
                    [e.timestamp for e in events],
                    [e.action for e in events],
                )
            else:
                result = self._retriever.retrieve(request.history, request.k)
        except Exception as error:  # every error must become a status, none a crash
            context.abort(*status_for(error))
        return retrieval_pb2.RetrieveResponse(
            items=[
                retrieval_pb2.ScoredItem(item_id=item, score=score, interest=interest)
                for item, score, interest in result.items
            ],
            model_version=result.model_version,
            unknown_items=result.unknown_items,
        )


def create_server(
    retriever: Retriever, host: str = "127.0.0.1", port: int = 0, max_workers: int = 4
) -> tuple[grpc.Server, int]:
    """Starts a server for ``retriever`` with health checking and reflection.

    Args:
        retriever: answers the requests.
        host: interface to bind (``"0.0.0.0"`` or ``"[::]"`` for all).
        port: port to bind; 0 picks a free one.
        max_workers: request threads. The user tower and FAISS release the GIL, so a few
            threads overlap requests; more than the cores only queue.

    Returns:
        ``(server, bound port)``; the server is started.
    """
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="retrieve"))
    health_servicer = health.HealthServicer()
    # "" is the whole server's status, which most health probes ask for.
    for service in ("", SERVICE_NAME):
        health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(RetrievalServicer(retriever), server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    server.start()
    for service in ("", SERVICE_NAME):
        health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    return server, bound


def serve_forever(
    retriever: Retriever,
    host: str = "127.0.0.1",
    port: int = 50051,
    max_workers: int = 4,
    grace: float = 5.0,
) -> None:
    """Serves until SIGTERM or SIGINT, then stops gracefully.

    In-flight requests get ``grace`` seconds to finish; new ones are refused meanwhile. Must
    run in the main thread (Python delivers signals only there).
    """
    server, bound = create_server(retriever, host, port, max_workers)

    def stop(signum: int, frame: FrameType | None) -> None:
        logger.info("%s received, stopping (grace %.1f s)", signal.Signals(signum).name, grace)
        server.stop(grace)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    logger.info("serving %s (model %s) on %s:%d", SERVICE_NAME, retriever.model_version, host, bound)
    try:
        server.wait_for_termination()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    logger.info("server stopped")
