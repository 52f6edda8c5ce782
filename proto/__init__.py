"""Generated gRPC/protobuf code for ``retrieval.proto``.

Regenerate after editing the ``.proto`` (a test fails while the checked-in code is stale)::

    python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. proto/retrieval.proto
"""
