"""Database calls from async code: a small pool of threads instead of one.

``sync_to_async``'s default (thread-sensitive) runs every call of the process in one
thread, so under load WebSocket handshakes, SSE lookups, message creation and write-behind
flushes queue behind each other. ``run`` spreads them over ``DATABASE_THREADS`` threads;
each call returns its connection afterwards (to the psycopg pool on PostgreSQL), so a
connection that broke while the database was away is never reused.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

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


def _with_fresh_connection(fn: Callable[..., T], args: Any, kwargs: Any) -> T:
    close_old_connections()
    try:
        return fn(*args, **kwargs)
    finally:
        connections.close_all()


async def run(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn`` in a database thread, in a copy of the caller's context (its log
    context), and await its result. A cancelled caller stops waiting; ``fn`` runs on to
    its end (its transaction commits or rolls back whole), as with ``sync_to_async``.

    ``run_in_executor`` itself, not ``sync_to_async``: nothing run here needs asgiref's
    thread-sensitive bookkeeping or calls back into the loop with ``async_to_sync``, and
    that bookkeeping cost more than the hop itself on the per-answer path."""
    context = contextvars.copy_context()
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        _threads(), context.run, _with_fresh_connection, fn, args, kwargs
    )
