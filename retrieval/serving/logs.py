"""Log set-up for the command-line tools: plain text, or one JSON object per line for log
collectors (``--log-format json``)."""

from __future__ import annotations

import json
import logging
import typing
from datetime import UTC, datetime
from typing import Literal

LogFormat = Literal["text", "json"]
"""A server's log format (``ServerConfig.log_format``, ``--log-format``)."""
LOG_FORMATS: tuple[str, ...] = typing.get_args(LogFormat)
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", ["exception"]}`` per record, one line each, plus
    the record's structured ``fields`` if it has them (``extra={"fields": {...}}``, as the access
    log's)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(fmt: str = "text", level: int = logging.INFO) -> None:
    """Sends log records of ``level`` and above to stderr in ``fmt`` (one of :data:`LOG_FORMATS`).

    Raises:
        ValueError: an unknown format.
    """
    if fmt not in LOG_FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; choose from {LOG_FORMATS}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
