"""The service's documented limits and message types, and one generated call as it is sent."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError, Message

from retrieval.api.v1 import retrieval_pb2

FUZZ_MAX_MESSAGE_BYTES = 1 << 20
"""Request and response limit of the fuzzed server: small, so oversized requests are cheap to make."""

MAX_K, MAX_HISTORY, MAX_PER_INTEREST_K, MAX_FILTER_IDS, MAX_BATCH, MAX_USER_ID = (
    1000, 10_000, 2000, 10_000, 256, 256,
)  # fmt: skip
"""The documented limits (docs/serving.md, API): the generator aims at both sides of each."""

MERGES = (0, 1, 2, 3)  # MERGE_STRATEGY_UNSPECIFIED, MAX_SCORE, ROUND_ROBIN, DIVERSITY
MAX_SCORE_MERGES = (0, 1)
"""The merges answering the best-scoring items, best first (unspecified means max-score)."""
ROUND_ROBIN = 2
DIVERSITY = 3
SERVICE = "/retrieval.v1.RetrievalService/"
REQUEST_TYPES: dict[str, type[Message]] = {
    "Retrieve": retrieval_pb2.RetrieveRequest,
    "BatchRetrieve": retrieval_pb2.BatchRetrieveRequest,
    "GetModelInfo": retrieval_pb2.GetModelInfoRequest,
}
RESPONSE_TYPES: dict[str, type[Message]] = {
    "Retrieve": retrieval_pb2.RetrieveResponse,
    "BatchRetrieve": retrieval_pb2.BatchRetrieveResponse,
    "GetModelInfo": retrieval_pb2.ModelInfo,
}
DOCUMENTED_ERRORS = frozenset(
    {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED}
)


@dataclass(frozen=True)
class Call:
    """One generated RPC.

    Attributes:
        method: ``Retrieve``, ``BatchRetrieve`` or ``GetModelInfo``.
        payload: the request's wire bytes, exactly as sent.
        request: ``payload`` parsed, ``None`` when it is not a valid message.
        kind: which branch of the generator made it (``typed``, ``wire``, ``undecodable``).
    """

    method: str
    payload: bytes
    request: Message | None
    kind: str

    def describe(self, limit: int = 300) -> str:
        """A short, readable description (long fields are summarised)."""
        if self.request is None:
            return f"{self.method} undecodable payload {self.payload[:limit]!r} ({len(self.payload)} bytes)"
        return f"{self.method}({_summary(self.request, limit)}) [{len(self.payload)} bytes, {self.kind}]"


def _summary(message: Message, limit: int) -> str:
    """``field=value, ...`` of ``message``, lists shown by their first items and length."""
    parts = []
    for descriptor, value in message.ListFields():
        if descriptor.is_repeated:
            values = list(value)
            shown = ", ".join(_summary(v, 80) if isinstance(v, Message) else repr(v)[:40] for v in values[:4])
            parts.append(
                f"{descriptor.name}=[{shown}{', ...' if len(values) > 4 else ''}] (len {len(values)})"
            )
        elif isinstance(value, Message):
            parts.append(f"{descriptor.name}={_summary(value, 80)}")
        else:
            parts.append(f"{descriptor.name}={repr(value)[:60]}")
    text = ", ".join(parts)
    return text if len(text) <= limit else text[:limit] + "..."


def make_call(method: str, payload: bytes, kind: str) -> Call:
    """The :class:`Call` of ``payload`` sent to ``method``: parsed when it parses (its ``kind``
    then kept), else ``undecodable``."""
    try:
        request: Message | None = REQUEST_TYPES[method].FromString(payload)
    except DecodeError:
        request = None
    return Call(method, payload, request, "undecodable" if request is None else kind)
