"""gRPC server for ``retrieval.v1.RetrievalService``: message conversion around a :class:`Retriever`.

Besides the service it exposes the standard health service (SERVING only once the retriever
is in place, NOT_SERVING from the moment the server starts stopping) and server reflection,
so ``grpcurl`` and load balancers work without the ``.proto``. Operations: dynamic
micro-batching of concurrent ``Retrieve`` calls (:mod:`retrieval.serving.batching`), hot swaps of the
retriever (:mod:`retrieval.serving.reload`), deadlines, a bound on concurrent calls, message size
limits, TLS or mutual TLS, and Prometheus metrics on a separate HTTP port.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

import faiss
import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from retrieval.api.convert import (
    SERVICE_NAME,
    check_sizes,
    model_info_message,
    parse,
    query_from_request,
    response_from_result,
)
from retrieval.api.errors import REQUEST_ID, DeadlineExceeded, InvalidArgument, RetrievalError
from retrieval.api.types import MAX_BATCH, Query, Retrieved
from retrieval.api.v1 import retrieval_pb2, retrieval_pb2_grpc
from retrieval.serving.access import (
    AccessControl,
    CallGate,
    abort,
    identity_label,
    start_health_server,
)
from retrieval.serving.access_log import model_version, request_id
from retrieval.serving.addresses import bind_every_address
from retrieval.serving.admission import (
    Admission,
    CallLimit,
    ModelSize,
    Overloaded,
    request_cost,
)
from retrieval.serving.auth import AccessDenied, Identity
from retrieval.serving.batching import MicroBatcher
from retrieval.serving.config import (
    BatchingConfig,
    LimitsConfig,
    ServerConfig,
    TlsConfig,
    check_server_config,
)
from retrieval.serving.health import HealthServicer
from retrieval.serving.memory import trimmer
from retrieval.serving.metrics import Metrics
from retrieval.serving.reload import RetrieverSlot
from retrieval.serving.retriever import Retriever, check_deadline
from retrieval.serving.tls import CertificateFiles

logger = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)
R = TypeVar("R", bound=Message)


def add_servicer(servicer: RetrievalServicer, server: grpc.Server) -> None:
    """Registers ``servicer``'s methods as the generated ``add_RetrievalServiceServicer_to_server``
    does, but each with its request handed over as a stream of bytes, which the servicer reads
    once it has admitted the caller and parses itself (:func:`parse`). On the wire a call is
    the same unary call: only the server's handler reads it later."""
    service = retrieval_pb2.DESCRIPTOR.services_by_name["RetrievalService"]
    handlers = {
        method.name: grpc.stream_unary_rpc_method_handler(
            getattr(servicer, method.name), response_serializer=lambda response: response.SerializeToString()
        )
        for method in service.methods
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))


class RetrievalServicer(retrieval_pb2_grpc.RetrievalServiceServicer):
    """Converts messages and errors; all logic lives in the :class:`Retriever`.

    Every call, in this order (docs/serving.md, "Admission"): a call whose deadline has already
    passed is not computed; its caller is identified, authorized and rate-limited from the
    call's metadata (``access``, :class:`AccessControl`); only then is its request read (the
    handlers hand over a request stream, :func:`add_servicer`), refused unread if it is large
    while heavy calls leave no room, and parsed; retrieval calls are costed and go through
    ``admission`` (:mod:`retrieval.serving.admission`: cheap ones always, heavy ones while they
    fit, computed in chunks that let cheap calls through); a cheap ``Retrieve`` is validated
    on its own, then answered in a micro-batch of ``batcher``. A call whose deadline passes
    while it computes stops at the next stage (DEADLINE_EXCEEDED). Each call is counted and
    timed in ``metrics`` (a refusal by why and who) and written to the access log. The
    retriever is read from ``slot`` on every call, so a hot swap takes effect at once.
    """

    def __init__(
        self,
        slot: Retriever | RetrieverSlot,
        metrics: Metrics | None = None,
        batcher: MicroBatcher | None = None,
        admission: Admission | None = None,
        access: AccessControl | None = None,
    ) -> None:
        self._slot = slot if isinstance(slot, RetrieverSlot) else RetrieverSlot(slot)
        self._metrics = metrics
        self._batcher = batcher
        self._admission = admission or Admission(LimitsConfig())
        self._access = access or AccessControl()
        self._trimmer = trimmer()

    def Retrieve(self, request: Request, context: grpc.ServicerContext) -> retrieval_pb2.RetrieveResponse:
        return self._call("Retrieve", context, request, retrieval_pb2.RetrieveRequest, self._retrieve)

    def BatchRetrieve(
        self, request: Request, context: grpc.ServicerContext
    ) -> retrieval_pb2.BatchRetrieveResponse:
        return self._call(
            "BatchRetrieve", context, request, retrieval_pb2.BatchRetrieveRequest, self._batch_retrieve
        )

    def GetModelInfo(self, request: Request, context: grpc.ServicerContext) -> retrieval_pb2.ModelInfo:
        return self._call(
            "GetModelInfo", context, request, retrieval_pb2.GetModelInfoRequest, self._model_info
        )

    def _retrieve(
        self, request: retrieval_pb2.RetrieveRequest, context: grpc.ServicerContext, caller: Identity
    ) -> retrieval_pb2.RetrieveResponse:
        check_sizes(request)
        retriever = self._slot.current  # one version for the whole call
        cost = request_cost(request, ModelSize.of(retriever))
        with self._admission.admit(cost, context.time_remaining()):
            query = query_from_request(request)
            if self._batcher is not None and self._admission.is_cheap(cost):
                retriever.validate(query)  # a bad query is refused alone, never inside a batch
                return response_from_result(self._batcher.submit(query, context.time_remaining(), cost))
            (result,) = self._compute(retriever, [query], [cost], _deadline(context))
        return response_from_result(result)

    def _batch_retrieve(
        self, request: retrieval_pb2.BatchRetrieveRequest, context: grpc.ServicerContext, caller: Identity
    ) -> retrieval_pb2.BatchRetrieveResponse:
        requests = request.requests
        if len(requests) > MAX_BATCH:  # before converting any
            raise InvalidArgument(f"the batch has {len(requests)} requests, at most {MAX_BATCH}")
        for i, one in enumerate(requests):
            try:
                check_sizes(one)
            except InvalidArgument as e:
                raise InvalidArgument(e.reason, i) from None
        retriever = self._slot.current
        size = ModelSize.of(retriever)
        costs = [request_cost(one, size) for one in requests]
        with self._admission.admit(sum(costs), context.time_remaining()):
            queries = _queries(requests)
            results = self._compute(retriever, queries, costs, _deadline(context))
        return retrieval_pb2.BatchRetrieveResponse(responses=[response_from_result(r) for r in results])

    def _model_info(
        self, request: retrieval_pb2.GetModelInfoRequest, context: grpc.ServicerContext, caller: Identity
    ) -> retrieval_pb2.ModelInfo:
        identities = self._access.identities
        stale = "" if identities is None else identities.stale or ""
        info = dataclasses.replace(self._slot.model_info(), access_file_error=stale)
        if "admin" not in caller.permissions:
            info = dataclasses.replace(
                info,
                last_refusal=public_refusal(info.last_refusal),
                access_file_error=public_refusal(info.access_file_error),
            )
        return model_info_message(info)

    def _compute(
        self, retriever: Retriever, queries: Sequence[Query], costs: Sequence[float], deadline: float | None
    ) -> list[Retrieved]:
        """Answers ``queries`` (of ``costs``) with one retriever call, or a heavy call in chunks
        with the cheap calls in flight let through between two (the answers are the same either
        way)."""
        if self._admission.is_cheap(sum(costs)):
            self._observe_batch(len(queries))
            return retriever.retrieve_many(queries, deadline)
        results: list[Retrieved] = []
        for chunk in self._admission.chunks(queries, costs):
            self._admission.yield_to_cheap()
            self._observe_batch(len(chunk))
            try:
                results += retriever.retrieve_many(chunk, deadline)
            except InvalidArgument as e:
                within = 0 if e.request is None else e.request
                raise InvalidArgument(e.reason, len(results) + within if len(queries) > 1 else None) from None
        return results

    def _observe_batch(self, size: int) -> None:
        if self._metrics is not None and size:
            self._metrics.batch_size.observe(size)

    def _call(
        self,
        method: str,
        context: grpc.ServicerContext,
        request: Request,
        message: type[M],
        work: Callable[[M, grpc.ServicerContext, Identity], R],
    ) -> R:
        """Runs ``work`` on the parsed request under the deadline, once the caller is admitted
        (the class docstring); every error becomes a status, and an answer ready after the
        deadline counts as DEADLINE_EXCEEDED (its client has stopped waiting). A large request
        has its memory given back once answered."""
        started = time.perf_counter()
        code, refusal, caller, size, answer = grpc.StatusCode.OK, None, None, 0, None
        log = self._access.access_log
        rid = None if log is None else request_id(context.invocation_metadata())
        fields: dict[str, Any] | None = None
        if log is not None and log.sampled():
            fields = {"request_id": rid, "identity": None, "method": method}
        try:
            remaining = context.time_remaining()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceeded(f"the deadline passed {-remaining:.3f} s before the server started")
            caller = self._access.identify(context)
            if fields is not None:
                fields["identity"] = caller.name
            self._access.allow(f"/{SERVICE_NAME}/{method}", caller)
            body = cast("M | bytes", _receive(request))  # only now: the caller may call, and may now
            size = _size(body)
            self._admission.screen(size)
            parsed = parse(body, message)
            if fields is not None and log is not None:
                fields.update(log.request_fields(parsed))
            answer = work(parsed, context, caller)
            check_deadline(_deadline(context), "the answer was ready")
            return answer
        except Exception as error:  # every error must become a status, none a crash
            code, details = status_for(error)
            refusal = refusal_reason(error, code)
            abort(context, code, details, getattr(error, "retry_after", None))
        finally:
            self._trimmer.note(size)
            seconds = time.perf_counter() - started
            if self._metrics is not None:
                self._metrics.answered(method, code.name, seconds, refusal, identity_label(caller))
            if rid is not None:  # added last: a refusal may have set trailing metadata of its own
                context.set_trailing_metadata((*(context.trailing_metadata() or ()), (REQUEST_ID, rid)))
            if fields is not None and log is not None:
                fields["code"] = code.name
                fields["latency_ms"] = round(seconds * 1000, 3)
                fields["model_version"] = model_version(answer) if code is grpc.StatusCode.OK else None
                log.write(fields)


Request = Message | bytes | Iterator[bytes]
"""A request as the servicer gets it: the call's request stream from gRPC (:func:`add_servicer`),
or from a Python caller its bytes or the message itself."""


def _receive(request: Request) -> Message | bytes:
    """The request: as given, or the one message of the call's request stream, read now.

    Raises:
        Overloaded: gRPC delivered no message: it refused one over the size limit (or the
            client cancelled while sending).
    """
    if isinstance(request, Message | bytes):
        return request
    try:
        body = next(request, None)
    except grpc.RpcError:  # the call ended while its request was read
        body = None
    if body is None:
        raise Overloaded(
            "message_size", "the request was not received: larger than the server's limit, or cancelled", None
        )
    return body


def _queries(requests: Sequence[retrieval_pb2.RetrieveRequest]) -> list[Query]:
    """A batch's requests as queries.

    Raises:
        InvalidArgument: a bad request, named by its place in the batch.
    """
    queries = []
    for i, one in enumerate(requests):
        try:
            queries.append(query_from_request(one))
        except InvalidArgument as e:
            raise InvalidArgument(e.reason, i) from None
    return queries


def _size(request: Message | bytes) -> int:
    """Bytes of a request as received (parsed requests, from Python callers, count 0)."""
    return len(request) if isinstance(request, bytes) else 0


def _deadline(context: grpc.ServicerContext) -> float | None:
    """The call's deadline as a :func:`time.monotonic` time; ``None`` for none."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


class StartedServer(ABC):
    """A started server of either engine (:attr:`ServerConfig.engine`): its health status and its
    stop, a drain then a grace, as :func:`serve_forever` and a serving group's worker drive it.

    Attributes:
        port: the bound port.
        slot: the retriever in service; :meth:`RetrieverSlot.swap` (or a
            :class:`~retrieval.serving.reload.DeploymentWatcher` on it) replaces it while serving.
        health_port: the bound plaintext health port (:attr:`AccessControl.health_port`), if any.
    """

    def __init__(self, port: int, slot: RetrieverSlot, health_port: int | None = None) -> None:
        self.port = port
        self.slot = slot
        self.health_port = health_port
        self._stopped: threading.Event | None = None
        self._stop_lock = threading.Lock()
        self.stop_deadline: float | None = None
        """When in-flight calls are cancelled (a :func:`time.monotonic` time), once stopping."""

    @abstractmethod
    def set_serving(self, serving: bool) -> None:
        """Sets the health status of the server and of the retrieval service."""

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopped is not None

    def stop(self, grace: float | None, drain: float = 0.0) -> threading.Event:
        """Reports NOT_SERVING, keeps answering for ``drain`` seconds (clients that watch health,
        as :class:`~retrieval.api.client.RetrievalClient` over replicas does, move their calls to
        other replicas meanwhile), then refuses new calls and gives in-flight ones ``grace``
        seconds (``None``: cancels them at once). Does not block.

        Only the first call counts (a group's worker may be asked to stop by its supervisor and
        by a signal of its own).

        Returns:
            An event set once every call has finished.
        """
        with self._stop_lock:
            if self._stopped is None:
                self.stop_deadline = time.monotonic() + drain + (grace or 0.0)
                self._stopped = self._stop(grace, drain)
            return self._stopped

    def _stop(self, grace: float | None, drain: float) -> threading.Event:
        self.set_serving(False)
        if drain <= 0:
            return self._shut_down(grace)
        done = threading.Event()

        def shut_down_later() -> None:
            time.sleep(drain)
            self._shut_down(grace).wait()
            done.set()

        threading.Thread(target=shut_down_later, name="drain", daemon=True).start()
        return done

    @abstractmethod
    def _shut_down(self, grace: float | None) -> threading.Event:
        """Refuses new calls, gives in-flight ones ``grace`` seconds; does not block. Returns an
        event set once every call has finished."""

    @abstractmethod
    def wait_for_termination(self, timeout: float | None = None) -> bool:
        """Blocks until the server stopped (or ``timeout`` seconds); ``True`` on timeout."""


class RetrievalServer(StartedServer):
    """A started server of the Python engine and what it owns: stop it with :meth:`stop`."""

    def __init__(
        self,
        server: grpc.Server,
        port: int,
        slot: RetrieverSlot,
        health_servicer: HealthServicer,
        batcher: MicroBatcher | None,
        health_server: tuple[grpc.Server, int] | None = None,
    ) -> None:
        super().__init__(port, slot, None if health_server is None else health_server[1])
        self._server = server
        self._health_server = None if health_server is None else health_server[0]
        self._health = health_servicer
        self._batcher = batcher

    def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", SERVICE_NAME):  # "" is the whole server, which most probes ask for
            self._health.set(service, status)

    def _shut_down(self, grace: float | None) -> threading.Event:
        if self._batcher is not None:
            self._batcher.close()  # calls already in it are still answered
        if self._health_server is not None:
            self._health_server.stop(grace)
        return self._server.stop(grace)

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return bool(self._server.wait_for_termination(timeout))


def create_server(
    retriever: Retriever | RetrieverSlot,
    config: ServerConfig | None = None,
    *,
    access: AccessControl | None = None,
    metrics: Metrics | None = None,
    reuse_port: bool = False,
    serving: bool = True,
) -> tuple[RetrievalServer, int]:
    """Starts a server for ``retriever`` with health checking and reflection, as ``config`` says:
    its address, request threads, micro-batching, limits, access settings and TLS (what it
    serves, its processes, its metrics port and its stop's timing are :func:`serve_forever`'s).

    Args:
        retriever: answers the requests; a :class:`RetrieverSlot` to swap it while serving.
        config: how to serve (:class:`ServerConfig`); ``None``: its defaults.
        access: who may call; ``None``: as ``config.access`` says
            (:meth:`AccessControl.from_config`, which reads its files). Give one to share its
            state (rate buckets, the access file in force) or to build it from objects.
        metrics: where to count requests; ``None`` for none. Its HTTP endpoint is started
            separately (:meth:`Metrics.serve`).
        reuse_port: share the port with other servers that set it (``SO_REUSEPORT``): only the
            workers of one serving group (:mod:`retrieval.serving.group`) do. Without it, a
            port already served is refused.
        serving: report SERVING once started; ``False`` leaves it NOT_SERVING until
            :meth:`RetrievalServer.set_serving` (a group's worker waits for its group).

    Returns:
        ``(server, bound port)``; the server is started.

    Raises:
        ValueError: fields of ``config`` that do not go together (:func:`check_server_config`),
            an invalid access file or metrics credentials.
        OSError: a port cannot be bound (in use, or not allowed; nothing is left serving), or
            a file of ``config.access`` cannot be read.
    """
    config = check_server_config(config or ServerConfig(), artifacts=False)
    slot = retriever if isinstance(retriever, RetrieverSlot) else RetrieverSlot(retriever)
    access = AccessControl.from_config(config) if access is None else access
    limits = config.limits
    server = _grpc_server(config, access, metrics, reuse_port)
    if metrics is not None:
        metrics.follow(slot)
        if access.identities is not None:
            metrics.follow_access(access.identities)
    batcher = _batcher(slot, config.batching, limits, metrics)
    admission = Admission(limits, observe_waiting=_depth(metrics, "heavy"))
    add_servicer(RetrievalServicer(slot, metrics, batcher, admission, access), server)
    health_servicer = _add_operations(server, config.access.reflection)
    bound = bind_every_address(server, config.host, config.port, _credentials(config.tls))
    health_server = _health_port(server, health_servicer, config, reuse_port)
    running = RetrievalServer(server, bound, slot, health_servicer, batcher, health_server)
    running.set_serving(serving)  # before the port answers: no probe sees the status change
    server.start()
    return running, bound


def _grpc_server(
    config: ServerConfig, access: AccessControl, metrics: Metrics | None, reuse_port: bool
) -> grpc.Server:
    """The gRPC server: ``config.threads`` request threads (each with FAISS's
    ``search_threads``: the setting is per thread, and searches run on the request threads),
    the message size limits, and the :class:`CallGate` every call passes first."""
    threads = config.search_threads
    limits = config.limits
    return grpc.server(
        futures.ThreadPoolExecutor(
            max_workers=config.threads,
            thread_name_prefix="retrieve",
            initializer=None if threads is None else partial(faiss.omp_set_num_threads, threads),
        ),
        options=[
            ("grpc.max_receive_message_length", limits.max_request_bytes),
            ("grpc.max_send_message_length", limits.max_response_bytes),
            # grpcio shares a served port by default (SO_REUSEPORT): a second server, maybe of
            # another model version, would silently take half the traffic. Refuse it instead.
            ("grpc.so_reuseport", int(reuse_port)),
        ],
        interceptors=[CallGate(CallLimit(config.max_queued, _depth(metrics, "calls")), access, metrics)],
    )


def _batcher(
    slot: RetrieverSlot, batching: BatchingConfig, limits: LimitsConfig, metrics: Metrics | None
) -> MicroBatcher | None:
    """The micro-batcher of cheap ``Retrieve`` calls; ``None`` when ``max_batch`` is 1."""
    if batching.max_batch == 1:
        return None
    return MicroBatcher(
        lambda: slot.current,
        batching.max_batch,
        batching.max_wait,
        observe_batch=None if metrics is None else metrics.batch_size.observe,
        max_cost=limits.batch_cost,
        observe_queue=_depth(metrics, "batch"),
    )


def _add_operations(server: grpc.Server, reflection_on: bool) -> HealthServicer:
    """Adds the health service (returned, NOT_SERVING until told) and, if asked, reflection."""
    health_servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if reflection_on:
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
    return health_servicer


def _credentials(tls: TlsConfig) -> grpc.ServerCredentials | None:
    """TLS credentials that re-read the files when they change (:class:`CertificateFiles`);
    ``None`` for plaintext."""
    if tls.cert is None or tls.key is None:
        return None
    return CertificateFiles(
        Path(tls.cert), Path(tls.key), None if tls.ca is None else Path(tls.ca)
    ).credentials()


def _health_port(
    server: grpc.Server, health_servicer: HealthServicer, config: ServerConfig, reuse_port: bool
) -> tuple[grpc.Server, int] | None:
    """The plaintext health port's started server and port, if ``config`` asks for one.

    Raises:
        OSError: it cannot be bound; ``server`` is stopped (it has not started).
    """
    if not config.access.health_port:
        return None
    try:
        return start_health_server(health_servicer, config.host, config.access.health_port, reuse_port)
    except OSError:
        server.stop(None)
        raise


def _depth(metrics: Metrics | None, queue: str) -> Callable[[int], None] | None:
    """What sets ``retrieval_queue_depth{queue}``; ``None`` without metrics."""
    return None if metrics is None else metrics.queue.labels(queue).set


MAX_DETAILS = 1024
"""Longest status message: gRPC carries it in a trailer, and one over the peer's metadata limit
(8 KiB by default) would turn the status into RESOURCE_EXHAUSTED."""

SERVER_FAULTS = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
"""Statuses the server never answers with an error's own message: internals stay in its log."""


def status_for(error: Exception) -> tuple[grpc.StatusCode, str]:
    """The gRPC status code and details to answer ``error`` with.

    Domain errors (:class:`RetrievalError`: each class has its status) and access refusals keep
    their message; anything else is a bug: it becomes INTERNAL with a generic message
    (internals stay out of responses) and its traceback goes to the log.
    """
    if isinstance(error, AccessDenied):
        return error.code, str(error)
    if isinstance(error, RetrievalError) and error.code() not in SERVER_FAULTS:
        details = str(error)
        return error.code(), details if len(details) <= MAX_DETAILS else details[: MAX_DETAILS - 3] + "..."
    logger.error("internal error while serving a request", exc_info=error)
    return grpc.StatusCode.INTERNAL, f"internal error ({type(error).__name__}), see the server log"


def refusal_reason(error: Exception, code: grpc.StatusCode) -> str:
    """Why a call ended with ``code`` (not OK), the ``reason`` label of ``retrieval_refusals_total``:
    an access or capacity refusal's own (:class:`AccessDenied`, :class:`Overloaded`), else the
    code's name in lower case."""
    if isinstance(error, AccessDenied | Overloaded):
        return error.refusal
    return code.name.lower()


_ABSOLUTE_PATH = re.compile(r"(?<![\w.~])/[^\s'\",;()]+")
_EXCEPTION = re.compile(r"\w+(Error|Exception)")


def public_refusal(reason: str, limit: int = 160) -> str:
    """A refused version's reason (or why the access file is stale) as a caller without the
    ``admin`` permission sees it in ``GetModelInfo.last_refusal`` (``access_file_error``):
    absolute paths cut to their last part, and what a library said left out (the reason's
    ``part: part`` chain is cut after an exception's type, or after the first phrase of three
    words or more, where our messages quote a library's)."""
    text = _ABSOLUTE_PATH.sub(lambda path: Path(path.group()).name or "/", reason)
    kept: list[str] = []
    for part in text.split(": "):
        kept.append(part)
        if _EXCEPTION.fullmatch(part) or len(part.split()) >= 3:
            break
    shown = ": ".join(kept)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."
