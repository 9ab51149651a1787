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
pool's own limits (a connection's lifetime) still apply. ``release`` ends the threads, each
handing its connections back as it ends: at shutdown, and after each test.

The threads are daemon threads (``_Threads``), so the interpreter's exit never waits for a
call in progress: while the database cannot be reached a call waits for the pool's
timeout (``DATABASE_POOL_TIMEOUT``, 30 s) on every try, and a stopping process whose
threads were a ``ThreadPoolExecutor``'s stayed up until the database was back. A call cut
short by the exit loses its transaction whole, as on a crash.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import select
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar

from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

P = ParamSpec("P")
T = TypeVar("T")

KEEP_SECONDS = 60.0

_executor: _Threads | None = None
_executor_lock = threading.Lock()
# The connections the threads keep, by thread, and until when each thread keeps them.
_kept: dict[int, list[BaseDatabaseWrapper]] = {}
_held = threading.local()


@dataclass(slots=True)
class _Work(Generic[T]):
    future: Future[T]
    fn: Callable[..., T]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)


class _Threads(Executor):
    """Up to ``size`` threads taking calls in order from one queue, one more started for a
    call that finds none idle, as ``ThreadPoolExecutor`` does. Unlike its threads, these
    are daemon threads: the interpreter's exit does not join them (see the module's
    docstring). Each hands its connections back as it ends."""

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._calls: queue.SimpleQueue[_Work[Any] | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._shut = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new calls after shutdown")
            future: Future[T] = Future()
            self._calls.put(_Work(future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
            return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more calls; the threads end once they have run those given them."""
        with self._lock:
            self._shut = True
            if cancel_futures:
                while True:
                    try:
                        work = self._calls.get_nowait()
                    except queue.Empty:
                        break
                    if work is not None:
                        work.future.cancel()
            self._calls.put(None)  # the end, passed on from thread to thread
        if wait:
            self.join(None)

    def join(self, timeout: float | None) -> bool:
        """Wait for the threads to end, up to ``timeout`` s in all; whether they all did."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def _work(self) -> None:
        try:
            while (work := self._calls.get()) is not None:
                work.run()
                del work  # its result is the caller's, not this thread's to keep alive
                self._idle.release()
            self._calls.put(None)
        finally:
            _hand_back()


def _threads() -> _Threads:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = _Threads(settings.DATABASE_THREADS, "db")
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


def _hand_back() -> None:
    """A thread's end: it hands its connections back (nothing else uses them)."""
    _kept.pop(threading.get_ident(), None)
    for connection in connections.all(initialized_only=True):
        connection.close()


def release(wait: float | None = None) -> bool:
    """End the threads: they take no more calls, and each ends once it has run those it
    was given, handing its connections back. Calls made afterwards start new threads.

    Waits for them to end, for as long as that takes, or up to ``wait`` s: at shutdown a
    call on a database that cannot be reached may not end for the pool's timeout, try
    after try, and the process must stop all the same. Threads still in a call then end
    on their own, or with the process. Returns whether every thread had ended."""
    global _executor
    with _executor_lock:
        executor, _executor = _executor, None
    if executor is None:
        return True
    executor.shutdown(wait=False)
    return executor.join(wait)
