"""Per-stream logging context.

Every log line written while a stream is handled carries its message id and request id,
taken from context variables, so one grep follows a message across processes - and into
vLLM's own log, which records the same request id (we send it as ``X-Request-Id``).

The request id is the engine request's: ``<message id>.<segment index>``. Lines from a
generation (and from the engine client it drives) carry both ids; lines from a reader carry
the message id (a reader spans segments). ``LOG_FORMAT=json`` writes one JSON object a line.
"""

from __future__ import annotations

import contextvars
import json
import logging
from datetime import UTC, datetime

NO_ID = "-"

message_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("message_id", default=NO_ID)
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default=NO_ID)


class _StreamContext:
    """Entered for as long as a stream or a generation runs: a class, because a
    generator-based context manager would hold a generator and its frame all that time."""

    __slots__ = ("_message_token", "_request_token", "message_id", "request_id")

    def __init__(self, message_id: str, request_id: str | None) -> None:
        self.message_id = message_id
        self.request_id = request_id

    def __enter__(self) -> None:
        self._message_token = message_id_var.set(self.message_id)
        request_id = self.request_id
        self._request_token = request_id_var.set(request_id) if request_id is not None else None

    def __exit__(self, *exc_info: object) -> None:
        if self._request_token is not None:
            request_id_var.reset(self._request_token)
        message_id_var.reset(self._message_token)


def stream_context(message_id: str, request_id: str | None = None) -> _StreamContext:
    """Tag the log lines of the code inside (and of tasks it starts) with these ids."""
    return _StreamContext(message_id, request_id)


class StreamContextFilter(logging.Filter):
    """Copies the ids onto each record; an explicit ``extra={"message_id": ...}`` wins."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "message_id"):
            record.message_id = message_id_var.get()
        if not hasattr(record, "request_id"):
            record.request_id = request_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers; ids are always present ("-" if none)."""

    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "message_id": getattr(record, "message_id", NO_ID),
            "request_id": getattr(record, "request_id", NO_ID),
            "pid": record.process,
        }
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            payload["stack"] = self.formatStack(record.stack_info)
        return json.dumps(payload, ensure_ascii=False)
