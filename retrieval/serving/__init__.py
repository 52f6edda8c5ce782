"""Serving: the retriever and the gRPC server around it.

* :mod:`~retrieval.serving.retriever`: :class:`Retriever`, histories in, top-k items out, one
  user-tower call and one batched index search for a whole batch (plain Python, no gRPC).
* :mod:`~retrieval.serving.batching`: :class:`MicroBatcher`, concurrent calls answered together.
* :mod:`~retrieval.serving.config`: :class:`ServerConfig`, a server's settings (``mitt serve``'s
  flags, ``--config``, ``--set``).
* :mod:`~retrieval.serving.server`: :func:`create_server`, the Python engine's servicer
  (message conversion only), health, reflection, TLS, limits, graceful stop;
  :mod:`~retrieval.serving.native_server`: the native engine's; :mod:`~retrieval.serving.run`:
  :func:`serve_forever`, a serving process's main (either engine until a signal).
* :mod:`~retrieval.serving.reload`: hot swaps of the retriever (:class:`DeploymentWatcher`).
* :mod:`~retrieval.serving.group`: :class:`ServingGroup`, N worker processes on one port under a
  supervisor (health, two-phase hot reload, summed metrics, drain);
  :mod:`~retrieval.serving.worker`: a worker's side (:class:`WorkerLink`).
* :mod:`~retrieval.serving.access`: who may call (:class:`AccessControl`): tokens and client
  certificates (:mod:`~retrieval.serving.auth`), rate limits (:mod:`~retrieval.serving.ratelimit`),
  the access log (:mod:`~retrieval.serving.access_log`); :mod:`~retrieval.serving.tls`: TLS
  files reloaded when they change.
* :mod:`~retrieval.serving.metrics`, :mod:`~retrieval.serving.logs`: Prometheus metrics, logging.

Names load on first use (``lazy_loader``, from ``__init__.pyi``): ``mitt serve --help`` reads
:mod:`~retrieval.serving.config` here, a group's supervisor :mod:`~retrieval.serving.group` and
the native engine :mod:`~retrieval.serving.native`, and an eager import would load FAISS, pandas
and pyarrow into each.

Example:
    >>> retriever = Retriever.from_dirs(Path("runs/model"), Path("runs/index"))
    >>> server, port = create_server(retriever, ServerConfig(port=0))
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
