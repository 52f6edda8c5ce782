"""The protobuf messages and gRPC stubs of ``retrieval.v1`` (``proto/retrieval.proto``), generated.

``retrieval_pb2`` holds the messages, ``retrieval_pb2_grpc`` the client stub and the servicer
base class. They live here, inside our own package, and not in a top-level ``proto`` package:
``proto-plus`` (which every google-cloud client library installs) owns that name. Never edit
them: after editing ``proto/retrieval.proto``, ``make proto`` regenerates them (a test fails
while they are stale)::

    python -m grpc_tools.protoc -Iretrieval/api/v1=proto --python_out=. --pyi_out=. \\
        --grpc_python_out=. proto/retrieval.proto

The ``-I`` mapping files the source under this package's path, so the generated imports name
``retrieval.api.v1`` and the descriptor pool knows the file as ``retrieval/api/v1/retrieval.proto``,
a name no other package registers. The service's full name stays ``retrieval.v1.RetrievalService``.
"""

from retrieval.api.v1 import retrieval_pb2, retrieval_pb2_grpc

__all__ = ["retrieval_pb2", "retrieval_pb2_grpc"]
