"""Per-stream logging context.

Every log line written while a stream is handled carries its message id and request id,
taken from context variables, so one grep follows a message across processes.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager

message_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("message_id", default="-")
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


@contextmanager
def stream_context(message_id: str, request_id: str | None = None) -> Iterator[None]:
    tokens = [message_id_var.set(message_id)]
    if request_id is not None:
        tokens.append(request_id_var.set(request_id))
    try:
        yield
    finally:
        request_token = tokens[1] if len(tokens) > 1 else None
        if request_token is not None:
            request_id_var.reset(request_token)
        message_id_var.reset(tokens[0])


class StreamContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "message_id"):
            record.message_id = message_id_var.get()
        if not hasattr(record, "request_id"):
            record.request_id = request_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "message_id": getattr(record, "message_id", "-"),
            "request_id": getattr(record, "request_id", "-"),
        }
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, ensure_ascii=False)
