"""The public API of :mod:`retrieval.serving` (loaded on first use by ``__init__.py``)."""

from .access import AccessControl, AccessInterceptor
from .access_log import AccessLog
from .admission import Admission, AdmissionLimits, call_cost, cost, query_cost, request_cost
from .auth import PERMISSIONS, AccessFile, Identity
from .batching import MicroBatcher
from .logs import LOG_FORMATS, configure_logging
from .memory import MemoryTrimmer, resident_bytes, trimmer
from .metrics import BasicAuth, Metrics
from .ratelimit import RateLimiter
from .reload import DeploymentWatcher, RetrieverSlot, load_deployment, open_deployment, warm_up
from .retriever import Retriever
from .server import RetrievalServer, RetrievalServicer, TlsFiles, create_server, serve_forever, status_for
from .tls import CertificateFiles

__all__ = [
    "LOG_FORMATS",
    "PERMISSIONS",
    "AccessControl",
    "AccessFile",
    "AccessInterceptor",
    "AccessLog",
    "Admission",
    "AdmissionLimits",
    "BasicAuth",
    "CertificateFiles",
    "DeploymentWatcher",
    "Identity",
    "MemoryTrimmer",
    "Metrics",
    "MicroBatcher",
    "RateLimiter",
    "RetrievalServer",
    "RetrievalServicer",
    "Retriever",
    "RetrieverSlot",
    "TlsFiles",
    "call_cost",
    "configure_logging",
    "cost",
    "create_server",
    "load_deployment",
    "open_deployment",
    "query_cost",
    "request_cost",
    "resident_bytes",
    "serve_forever",
    "status_for",
    "trimmer",
    "warm_up",
]
