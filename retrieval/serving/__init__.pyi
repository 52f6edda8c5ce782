"""The public API of :mod:`retrieval.serving` (loaded on first use by ``__init__.py``)."""

from .batching import MicroBatcher
from .logs import LOG_FORMATS, configure_logging
from .metrics import Metrics
from .reload import DeploymentWatcher, RetrieverSlot, load_deployment, warm_up
from .retriever import Retriever
from .server import RetrievalServer, RetrievalServicer, TlsFiles, create_server, serve_forever, status_for

__all__ = [
    "LOG_FORMATS",
    "DeploymentWatcher",
    "Metrics",
    "MicroBatcher",
    "RetrievalServer",
    "RetrievalServicer",
    "Retriever",
    "RetrieverSlot",
    "TlsFiles",
    "configure_logging",
    "create_server",
    "load_deployment",
    "serve_forever",
    "status_for",
    "warm_up",
]
