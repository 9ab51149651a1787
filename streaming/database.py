"""Database calls from async code: a small pool of threads instead of one.

``sync_to_async``'s default (thread-sensitive) runs every call of the process in one
thread, so under load WebSocket handshakes, SSE lookups, message creation and write-behind
flushes queue behind each other. ``run`` spreads them over ``DATABASE_THREADS`` threads.

Each thread keeps its connection from one call to the next, for at most ``KEEP_SECONDS``:
taking a connection from the pool and handing it back costs a call about as much client
CPU as a statement, and every answer makes two or three calls. A connection is kept only
while it is as a new one would be: idle (no transaction open or failed), autocommit on,
and without an error that may have broken it (Django counts every database error but a
refused row's, ``IntegrityError`` and ``DataError``). Otherwise it goes back to the pool
after the call, as every connection did, so a connection that broke while the database
was away serves one call at most. Every ``KEEP_SECONDS`` it goes back anyway, so the
pool's own limits (a connection's lifetime) still apply. ``release`` ends the threads and
hands their connections back: at shutdown, and after each test.
"""

from __future__ import annotations

import asyncio
import contextvars
import select
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

P = ParamSpec("P")
T = TypeVar("T")

KEEP_SECONDS = 60.0

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()
# The connections the threads keep, by thread, for ``release`` (which runs in another
# thread once they have ended), and until when each thread keeps them.
_kept: dict[int, list[BaseDatabaseWrapper]] = {}
_held = threading.local()


def _threads() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(
                max_workers=settings.DATABASE_THREADS, thread_name_prefix="db"
            )
        return _executor


def _idle(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` is as a new one would be: nothing a later call could trip
    on (an open or failed transaction, autocommit off, an error that may have broken it)."""
    raw = connection.connection
    if raw is None or connection.errors_occurred or connection.in_atomic_block:
        return False
    if connection.needs_rollback or not connection.get_autocommit():
        return False
    if connection.vendor == "postgresql":
        from psycopg.pq import ConnStatus, TransactionStatus

        info = raw.info
        return info.status == ConnStatus.OK and info.transaction_status == TransactionStatus.IDLE
    return not getattr(raw, "in_transaction", True)


def _keep_or_close() -> None:
    """After a call: keep this thread's connections that are idle and young enough."""
    now = time.monotonic()
    until: float | None = getattr(_held, "until", None)
    expired = until is not None and now >= until
    kept = []
    for connection in connections.all(initialized_only=True):
        if connection.connection is None:
            continue
        if expired or not _idle(connection):
            connection.close()
        else:
            kept.append(connection)
    if not kept:
        _held.until = None
    elif until is None:
        _held.until = now + KEEP_SECONDS
    _kept[threading.get_ident()] = kept


def _ended(connection: BaseDatabaseWrapper) -> bool:
    """Whether a kept PostgreSQL connection was ended by its server while it was kept (a
    restart, a terminated backend, a proxy's idle timeout), without a round trip: the
    server says so before it goes (a last message, or the kernel an end of file), where
    a connection at rest has nothing to read. Anything to read makes it suspect, and it
    is replaced rather than trusted."""
    raw = connection.connection
    if raw is None or connection.vendor != "postgresql":
        return False
    from psycopg.pq import ConnStatus

    pgconn = raw.pgconn
    if pgconn.status != ConnStatus.OK:
        return True
    readable, _, _ = select.select([pgconn.socket], [], [], 0)
    return bool(readable)


def _drop_ended() -> None:
    """Before a call: close this thread's kept connections that ``_ended``; the call takes
    a live one from the pool (checked as it leaves it: ``CONN_HEALTH_CHECKS``) instead of
    failing on its first statement, which was a 500 for every request served by such a
    connection until each had failed once."""
    for connection in _kept.get(threading.get_ident(), ()):
        if _ended(connection):
            connection.connection.close()  # closed: the pool discards it
            connection.close()


def _call(fn: Callable[..., T], args: Any, kwargs: Any) -> T:
    _drop_ended()
    try:
        return fn(*args, **kwargs)
    finally:
        _keep_or_close()


async def run(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn`` in a database thread, in a copy of the caller's context (its log
    context), and await its result. A cancelled caller stops waiting; ``fn`` runs on to
    its end (its transaction commits or rolls back whole), as with ``sync_to_async``.

    ``run_in_executor`` itself, not ``sync_to_async``: nothing run here needs asgiref's
    thread-sensitive bookkeeping or calls back into the loop with ``async_to_sync``, and
    that bookkeeping cost more than the hop itself on the per-answer path."""
    context = contextvars.copy_context()
    loop = asyncio.get_running_loop()
    try:
        done = loop.run_in_executor(_threads(), context.run, _call, fn, args, kwargs)
    except RuntimeError:  # released since ``_threads`` returned them: new ones
        done = loop.run_in_executor(_threads(), context.run, _call, fn, args, kwargs)
    return await done


def release() -> None:
    """End the threads (after the calls in progress) and hand their connections back.
    Calls made afterwards start new threads."""
    global _executor
    with _executor_lock:
        executor, _executor = _executor, None
    if executor is None:
        return
    executor.shutdown(wait=True)
    kept = [connection for held in _kept.values() for connection in held]
    _kept.clear()
    for connection in kept:
        # Its thread has ended: nothing else uses it.
        connection.inc_thread_sharing()
        try:
            connection.close()
        finally:
            connection.dec_thread_sharing()
