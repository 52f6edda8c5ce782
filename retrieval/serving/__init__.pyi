"""The public API of :mod:`retrieval.serving` (loaded on first use by ``__init__.py``)."""

from .access import AccessControl, CallGate
from .access_log import AccessLog
from .admission import (
    Admission,
    CallLimit,
    ModelSize,
    Overloaded,
    call_cost,
    cost,
    query_cost,
    request_cost,
)
from .auth import PERMISSIONS, AccessFile, Identity
from .batching import MicroBatcher
from .config import (
    ENGINES,
    AccessConfig,
    BatchingConfig,
    Engine,
    LimitsConfig,
    MetricsConfig,
    ServerConfig,
    TlsConfig,
    check_server_config,
)
from .group import (
    HEARTBEAT_INTERVAL,
    HEARTBEAT_TIMEOUT,
    GroupError,
    GroupOptions,
    ServingGroup,
    default_processes,
    hold_ports,
    serve_group,
)
from .logs import LOG_FORMATS, configure_logging
from .memory import MemoryTrimmer, resident_bytes, trimmer
from .metrics import BasicAuth, GroupMetrics, Metrics
from .native import NativeEngineMissing, NativeServer, native_module
from .native_kernel import NativeKernel, NativeServable, native_servable
from .native_server import create_native_server
from .ratelimit import RateLimiter
from .reload import (
    DeploymentWatcher,
    RetrieverSlot,
    load_deployment,
    open_deployment,
    refuse_version,
    swap_version,
    warm_up,
)
from .retriever import Retriever
from .run import serve_forever
from .server import RetrievalServer, RetrievalServicer, create_server, status_for
from .stopping import STOP_MARGIN
from .tls import CertificateFiles
from .worker import WorkerLink

__all__ = [
    "ENGINES",
    "HEARTBEAT_INTERVAL",
    "HEARTBEAT_TIMEOUT",
    "LOG_FORMATS",
    "PERMISSIONS",
    "STOP_MARGIN",
    "AccessConfig",
    "AccessControl",
    "AccessFile",
    "AccessLog",
    "Admission",
    "BasicAuth",
    "BatchingConfig",
    "CallGate",
    "CallLimit",
    "CertificateFiles",
    "DeploymentWatcher",
    "Engine",
    "GroupError",
    "GroupMetrics",
    "GroupOptions",
    "Identity",
    "LimitsConfig",
    "MemoryTrimmer",
    "Metrics",
    "MetricsConfig",
    "MicroBatcher",
    "ModelSize",
    "NativeEngineMissing",
    "NativeKernel",
    "NativeServable",
    "NativeServer",
    "Overloaded",
    "RateLimiter",
    "RetrievalServer",
    "RetrievalServicer",
    "Retriever",
    "RetrieverSlot",
    "ServerConfig",
    "ServingGroup",
    "TlsConfig",
    "WorkerLink",
    "call_cost",
    "check_server_config",
    "configure_logging",
    "cost",
    "create_native_server",
    "create_server",
    "default_processes",
    "hold_ports",
    "load_deployment",
    "native_module",
    "native_servable",
    "open_deployment",
    "query_cost",
    "refuse_version",
    "request_cost",
    "resident_bytes",
    "serve_forever",
    "serve_group",
    "status_for",
    "swap_version",
    "trimmer",
    "warm_up",
]
