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
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import psycopg
import psycopg.sql
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


def _call(fn: Callable[..., T], args: Any, kwargs: Any) -> T:
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
    """End the threads (after the calls in progress) and hand their connections back, and
    close the loops' idle connections (one in use closes after its statement). Calls made
    afterwards start new threads and connections."""
    global _executor, _era
    _era += 1
    idle = [held for pool in _on_loops.values() for held, _ in pool.idle]
    _on_loops.clear()
    for held in idle:
        # Not in use (a statement in flight closes its own): libpq's close needs no loop.
        held.pgconn.finish()
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


# --- statements on the event loop ---------------------------------------------------------
# A call through ``run`` costs its thread several times the CPU of its statements once the
# event loop keeps the GIL busy: every wait on the socket hands the GIL over and back
# (docs/performance.md). A single statement that needs nothing of Django's connection but
# its settings goes on the loop instead, through psycopg's async connection, which waits
# on the socket with the loop's own readiness callbacks. PostgreSQL only.


@dataclass(frozen=True, slots=True)
class Rows:
    """A statement's result: its columns' names and its rows (none without a result)."""

    columns: list[str]
    rows: list[tuple[Any, ...]]


class _LoopConnections:
    """The connections one event loop sends its statements on, each one statement at a
    time: the idle ones with the time each may be kept until, and a bound on how many
    are open."""

    def __init__(self, size: int) -> None:
        self.idle: list[tuple[psycopg.AsyncConnection[Any], float]] = []
        self.free = asyncio.Semaphore(size)


_on_loops: dict[asyncio.AbstractEventLoop, _LoopConnections] = {}
# Bumped by ``release``: a connection taken before it is closed after its statement.
_era = 0


def on_loop(alias: str = "default") -> bool:
    """Whether ``statement`` can send to ``alias``'s database (else: ``run``)."""
    return connections[alias].vendor == "postgresql"


async def _connect(alias: str) -> psycopg.AsyncConnection[Any]:
    """A connection as Django would make it for ``alias``: its parameters, adapters,
    binding and time zone, in autocommit."""
    wrapper = connections[alias]
    params = wrapper.get_connection_params()
    server_binding = params.pop("cursor_factory", None) is not psycopg.ClientCursor
    params.pop("autocommit", None)
    connection = await psycopg.AsyncConnection.connect(
        autocommit=True,
        cursor_factory=psycopg.AsyncCursor if server_binding else psycopg.AsyncClientCursor,
        **params,
    )
    zone = wrapper.timezone_name
    if zone and connection.info.parameter_status("TimeZone") != zone:
        await connection.execute(psycopg.sql.SQL("SET TIME ZONE {}").format(zone))
    return connection


def _reusable(connection: psycopg.AsyncConnection[Any]) -> bool:
    from psycopg.pq import ConnStatus, TransactionStatus

    info = connection.info
    return info.status == ConnStatus.OK and info.transaction_status == TransactionStatus.IDLE


async def _send(alias: str, sql: str, params: Sequence[Any], pool: _LoopConnections) -> Rows:
    # Django's exceptions, as from a call through ``run`` (the wrapper only maps them).
    with connections[alias].wrap_database_errors:
        async with pool.free:
            era = _era
            now = time.monotonic()
            connection, until = pool.idle.pop() if pool.idle else (None, 0.0)
            if connection is not None and now >= until:
                await connection.close()
                connection = None
            if connection is None:
                connection, until = await _connect(alias), now + KEEP_SECONDS
            kept = False
            try:
                cursor = await connection.execute(sql, params)
                described = cursor.description
                rows = (
                    Rows([], [])
                    if described is None
                    else Rows([column.name for column in described], await cursor.fetchall())
                )
                kept = era == _era and _reusable(connection)
                return rows
            finally:
                if kept:
                    pool.idle.append((connection, until))
                else:
                    await connection.close()


async def statement(sql: str, params: Sequence[Any], alias: str = "default") -> Rows:
    """Send one statement to ``alias``'s database (PostgreSQL: ``on_loop``) on the running
    loop, in autocommit, and return its result. At most
    ``DATABASE_LOOP_CONNECTIONS`` connections per loop, each kept as a database thread
    keeps its own (idle, for at most ``KEEP_SECONDS``). As with ``run``, a cancelled
    caller stops waiting and the statement runs on to its end. Errors are Django's, as
    from ``run``."""
    loop = asyncio.get_running_loop()
    pool = _on_loops.get(loop)
    if pool is None:
        pool = _on_loops[loop] = _LoopConnections(settings.DATABASE_LOOP_CONNECTIONS)
    return await asyncio.shield(loop.create_task(_send(alias, sql, params, pool)))
