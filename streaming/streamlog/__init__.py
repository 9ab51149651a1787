"""Durable per-message event log: one interface, two backends (Redis Streams, in-memory).

``STREAMING["LOG"]`` picks the backend, the way ``CACHES`` picks a cache backend.
"""

from __future__ import annotations

from streaming.conf import build_backend, streaming_settings
from streaming.streamlog.base import (
    Appended,
    LogDeleted,
    LogLost,
    LogUnreachable,
    SeqConflict,
    StreamLog,
    deleted_done,
    until_appended,
)


def build_streamlog() -> StreamLog:
    """A new log client; the runtime owns one per process."""
    log: StreamLog = build_backend(streaming_settings.LOG)
    return log


__all__ = [
    "Appended",
    "LogDeleted",
    "LogLost",
    "LogUnreachable",
    "SeqConflict",
    "StreamLog",
    "build_streamlog",
    "deleted_done",
    "until_appended",
]
