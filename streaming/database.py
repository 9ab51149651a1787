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
import contextlib
import contextvars
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
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
    close the loops' idle connections (one in use closes after its use). Calls made
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
# (docs/performance.md). Statements that need nothing of Django's connection but its
# settings go on the loop instead, through psycopg's async connection, which waits on the
# socket with the loop's own readiness callbacks: one at a time (``statement``), or a
# transaction's in two round trips (``transaction``). PostgreSQL only.


@dataclass(frozen=True, slots=True)
class Rows:
    """A statement's result: its columns' names and its rows (none without a result)."""

    columns: list[str]
    rows: list[tuple[Any, ...]]


class _LoopConnections:
    """The connections one event loop sends its statements on, each used by one caller at
    a time: the idle ones with the time each may be kept until, and a bound on how many
    are open."""

    def __init__(self, size: int) -> None:
        self.idle: list[tuple[psycopg.AsyncConnection[Any], float]] = []
        self.free = asyncio.Semaphore(size)


_on_loops: dict[asyncio.AbstractEventLoop, _LoopConnections] = {}
# Bumped by ``release``: a connection taken before it is closed after its use.
_era = 0


def on_loop(alias: str = "default") -> bool:
    """Whether ``statement`` and ``transaction`` can reach ``alias``'s database (else:
    ``run``)."""
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


def _idle_now(connection: psycopg.AsyncConnection[Any]) -> bool:
    from psycopg.pq import ConnStatus, TransactionStatus

    info = connection.info
    return info.status == ConnStatus.OK and info.transaction_status == TransactionStatus.IDLE


@contextlib.asynccontextmanager
async def _borrowed(alias: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection of the running loop's for the block (at most
    ``DATABASE_LOOP_CONNECTIONS`` at once), kept afterwards as a database thread keeps its
    own: while idle, for at most ``KEEP_SECONDS``, never after a database error, a
    cancellation or a ``release``."""
    loop = asyncio.get_running_loop()
    pool = _on_loops.get(loop)
    if pool is None:
        pool = _on_loops[loop] = _LoopConnections(settings.DATABASE_LOOP_CONNECTIONS)
    async with pool.free:
        era = _era
        now = time.monotonic()
        connection, until = pool.idle.pop() if pool.idle else (None, 0.0)
        if connection is not None and now >= until:
            await connection.close()
            connection = None
        if connection is None:
            connection, until = await _connect(alias), now + KEEP_SECONDS
        broken = True
        try:
            yield connection
            broken = False
        except psycopg.Error:
            raise
        except Exception:
            broken = False  # the caller's own (a refusal): the connection may be idle
            raise
        finally:
            if not broken and era == _era and _idle_now(connection):
                pool.idle.append((connection, until))
            else:
                await connection.close()


async def _rows(cursor: psycopg.AsyncCursor[Any]) -> Rows:
    """The result of a statement that returns rows. Rows first: in a pipeline, fetching
    is what brings the result (and its columns)."""
    rows = await cursor.fetchall()
    described = cursor.description
    assert described is not None
    return Rows([column.name for column in described], rows)


async def _statement(alias: str, sql: str, params: Sequence[Any]) -> Rows:
    # Django's exceptions, as from a call through ``run`` (the wrapper only maps them).
    with connections[alias].wrap_database_errors:
        async with _borrowed(alias) as connection:
            cursor = await connection.execute(sql, params)
            return Rows([], []) if cursor.description is None else await _rows(cursor)


async def statement(sql: str, params: Sequence[Any], alias: str = "default") -> Rows:
    """Send one statement to ``alias``'s database (PostgreSQL: ``on_loop``) on the running
    loop, in autocommit, and return its result. As with ``run``, a cancelled caller
    stops waiting and the statement runs on to its end; errors are Django's."""
    loop = asyncio.get_running_loop()
    return await asyncio.shield(loop.create_task(_statement(alias, sql, params)))


class Transaction:
    """A transaction on a loop connection (``transaction``): ``read`` sends the ``BEGIN``
    with its statements, ``write`` holds a statement back to go with the ``COMMIT``."""

    def __init__(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self._connection = connection
        self._writes: list[tuple[str, Sequence[Any], Callable[[Rows], None]]] = []

    async def read(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[Rows]:
        """Run ``statements`` (the first reads go with the ``BEGIN``) and return their
        results, in one round trip."""
        cursors = []
        for sql, params in statements:
            cursors.append(await self._connection.cursor().execute(sql, params))
        return [await _rows(cursor) for cursor in cursors]

    def write(self, sql: str, params: Sequence[Any], done: Callable[[Rows], None]) -> None:
        """Send ``sql`` with the ``COMMIT``; once committed, ``done`` gets its result."""
        self._writes.append((sql, params, done))


@contextlib.asynccontextmanager
async def transaction(alias: str = "default") -> AsyncIterator[Transaction]:
    """A transaction on the running loop (PostgreSQL: ``on_loop``), in two round trips:
    the ``BEGIN`` with the first reads, the writes with the ``COMMIT`` when the block
    ends (psycopg's pipeline mode). An error, in the block or from the database, rolls
    it back; errors are Django's. Unlike ``statement``, the caller shields the block
    from its own cancellation when it must run to its end."""
    from psycopg.pq import TransactionStatus

    with connections[alias].wrap_database_errors:
        async with _borrowed(alias) as connection:
            tx = Transaction(connection)
            written: list[tuple[psycopg.AsyncCursor[Any], Callable[[Rows], None]]] = []
            committed = False
            try:
                async with connection.pipeline():
                    await connection.execute(b"BEGIN", prepare=False)
                    yield tx
                    for sql, params, done in tx._writes:
                        written.append((await connection.cursor().execute(sql, params), done))
                    await connection.execute(b"COMMIT", prepare=False)
                committed = True
            finally:
                status = connection.info.transaction_status
                if not committed and status in (
                    TransactionStatus.INTRANS,
                    TransactionStatus.INERROR,
                ):
                    await connection.rollback()
            for cursor, done in written:
                done(await _rows(cursor))
