"""Durable per-message event log: one interface, two backends (Redis Streams, in-memory).

``settings.REDIS_URL`` picks the backend, the way ``CACHES`` picks a cache backend.
"""

from __future__ import annotations

from django.conf import settings

from streaming.streamlog.base import SeqConflict, StreamLog


def build_streamlog() -> StreamLog:
    """A new log client; the runtime owns one per process (per event loop)."""
    if settings.REDIS_URL:
        from streaming.streamlog.redis import RedisStreamLog

        return RedisStreamLog(settings.REDIS_URL)
    from streaming.streamlog.memory import MemoryStreamLog

    return MemoryStreamLog()


__all__ = ["SeqConflict", "StreamLog", "build_streamlog"]
