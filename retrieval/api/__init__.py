"""The retrieval API as a caller sees it: request and response types, errors, proto conversion, client.

* :mod:`~retrieval.api.types`: :class:`Query`, :class:`Rerank`, :class:`Retrieved`,
  :class:`ModelInfo`, :class:`MergeStrategy` and the API's limits (``MAX_K``, ...).
* :mod:`~retrieval.api.errors`: one exception class per gRPC status the server returns.
* :mod:`~retrieval.api.convert`: those types to and from the messages of ``proto/retrieval.proto``.
* :mod:`~retrieval.api.client`: :class:`RetrievalClient`, over one server or several replicas.

Light by design: it needs grpcio, protobuf and numpy, never TensorFlow, FAISS or pandas (a test
checks), so that a service calling the retriever installs only this.

Example:
    >>> from retrieval.api import RetrievalClient
    >>> with RetrievalClient("localhost:50051") as client:
    ...     client.retrieve(["B0001", "B0042"], k=10).items[0]
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
