"""The access log: one structured line per request (or per sampled request), through the
``retrieval.access`` logger, so ``--log-format json`` makes each line a JSON object.

Fields: ``request_id``, ``identity``, ``method``, ``history_len`` and ``k`` (``BatchRetrieve``:
sums over its requests, and ``batch``, their number), ``user_id`` (only when enabled;
``BatchRetrieve``: a list), ``code`` (the gRPC status name), ``latency_ms``, ``model_version``
(of the answer; null for a refused call). The request's fields are those of a request the
server parsed, which it does only once the caller is admitted: a refused caller's line has
its identity (null if unauthenticated) and code, never what it sent.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from typing import Any

from google.protobuf.message import Message

from retrieval.api.errors import REQUEST_ID
from retrieval.api.v1 import retrieval_pb2

logger = logging.getLogger("retrieval.access")

MAX_REQUEST_ID = 128
"""Longer ids sent by callers are replaced by a generated one."""


def request_id(metadata: Sequence[tuple[str, str | bytes]] | None) -> str:
    """The caller's ``x-request-id`` if it sent a usable one, else a new random id."""
    for key, value in metadata or ():
        if key == REQUEST_ID and isinstance(value, str) and 0 < len(value) <= MAX_REQUEST_ID:
            return value
    return f"{random.getrandbits(128):032x}"  # unique enough to find a line, and cheaper than uuid4


class AccessLog:
    """Writes a sampled share of the requests to the ``retrieval.access`` logger.

    Example:
        >>> log = AccessLog(sample=0.1)  # one request in ten, at random
        >>> if log.sampled():
        ...     log.write({"request_id": "r1", "method": "Retrieve", "code": "OK"})
    """

    def __init__(self, sample: float = 1.0, user_ids: bool = False) -> None:
        """``sample``: the share of requests logged (0 < sample <= 1); ``user_ids``: log the
        requests' ``user_id``.

        Raises:
            ValueError: ``sample`` out of range.
        """
        if not 0 < sample <= 1:
            raise ValueError(f"the access log sample must be in (0, 1], got {sample}")
        self.sample = sample
        self.user_ids = user_ids

    def sampled(self) -> bool:
        """Whether to log this request (never when the logger would drop the line)."""
        return (self.sample >= 1 or random.random() < self.sample) and logger.isEnabledFor(logging.INFO)

    def request_fields(self, request: Message) -> dict[str, Any]:
        """``history_len``, ``k`` (and ``batch``, ``user_id``) of a parsed Retrieve or
        BatchRetrieve request; nothing for other requests."""
        if isinstance(request, retrieval_pb2.BatchRetrieveRequest):
            requests, batch = list(request.requests), {"batch": len(request.requests)}
        elif isinstance(request, retrieval_pb2.RetrieveRequest):
            requests, batch = [request], {}
        else:
            return {}
        fields: dict[str, Any] = {
            "history_len": sum(len(r.history) or len(r.events) for r in requests),
            "k": sum(r.k for r in requests),
            **batch,
        }
        if self.user_ids:
            users = [r.user_id for r in requests]
            fields["user_id"] = users if batch else users[0]
        return fields

    def write(self, fields: dict[str, Any]) -> None:
        """Logs ``fields``: as ``key=value`` pairs in the message, and as the fields of a JSON line."""
        logger.info(
            "%s",
            " ".join(f"{key}={logfmt(value)}" for key, value in fields.items()),
            extra={"fields": fields},
        )


def logfmt(value: Any) -> str:
    """A value as logfmt writes it: bare when it has no space, quote or ``=``, else JSON-quoted."""
    text = value if isinstance(value, str) else json.dumps(value)
    return json.dumps(text) if not text or any(c in text for c in ' "=') else text


def model_version(response: Message | None) -> str | None:
    """The model version a response carries (a batch's: its first answer's)."""
    if isinstance(response, retrieval_pb2.BatchRetrieveResponse):
        return response.responses[0].model_version if response.responses else None
    version = getattr(response, "model_version", None)
    return version if isinstance(version, str) else None
