"""Database calls from async code: a small pool of threads instead of one.

``sync_to_async``'s default (thread-sensitive) runs every call of the process in one
thread, so under load WebSocket handshakes, SSE lookups, message creation and write-behind
flushes queue behind each other. ``run`` spreads them over ``DATABASE_THREADS`` threads;
each call returns its connection afterwards (to the psycopg pool on PostgreSQL), so a
connection that broke while the database was away is never reused.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, connections

P = ParamSpec("P")
T = TypeVar("T")

_executor: ThreadPoolExecutor | None = None


def _threads() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(
            max_workers=settings.DATABASE_THREADS, thread_name_prefix="db"
        )
    return _executor


def _with_fresh_connection(fn: Callable[P, T]) -> Callable[P, T]:
    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    return call


async def run(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn`` in a database thread and await its result."""
    wrapped: Callable[..., Any] = sync_to_async(
        _with_fresh_connection(fn), thread_sensitive=False, executor=_threads()
    )
    return await wrapped(*args, **kwargs)
