"""Serving: the retriever and the gRPC server around it.

* :mod:`~retrieval.serving.retriever`: :class:`Retriever`, histories in, top-k items out, one
  user-tower call and one batched index search for a whole batch (plain Python, no gRPC).
* :mod:`~retrieval.serving.batching`: :class:`MicroBatcher`, concurrent calls answered together.
* :mod:`~retrieval.serving.server`: :func:`create_server` / :func:`serve_forever`, the servicer
  (message conversion only), health, reflection, TLS, limits, graceful stop.
* :mod:`~retrieval.serving.reload`: hot swaps of the retriever (:class:`DeploymentWatcher`).
* :mod:`~retrieval.serving.metrics`, :mod:`~retrieval.serving.logs`: Prometheus metrics, logging.

Example:
    >>> retriever = Retriever.from_dirs(Path("runs/model"), Path("runs/index"))
    >>> server, port = create_server(retriever, port=0)
"""

from retrieval.serving.batching import MicroBatcher
from retrieval.serving.logs import LOG_FORMATS, configure_logging
from retrieval.serving.metrics import Metrics
from retrieval.serving.reload import DeploymentWatcher, RetrieverSlot, load_deployment, warm_up
from retrieval.serving.retriever import Retriever
from retrieval.serving.server import (
    RetrievalServer,
    RetrievalServicer,
    TlsFiles,
    create_server,
    serve_forever,
    status_for,
)

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
