from __future__ import annotations

import functools
from typing import Any

import psycopg
from django.conf import settings
from django.db.backends.postgresql import base
from django_prometheus.db.backends.postgresql import base as instrumented_base
from psycopg import _queries
from psycopg import connection as psycopg_connection
from psycopg import errors as psycopg_errors

from chatsite.backends import instrumented

# psycopg keeps how it parsed a statement's text (an LRU cache of 128) only for statements
# of at most 4,096 bytes and 50 parameters. An answer's writes are one statement of about
# 60 (streaming/statements.py), so it was parsed again on every answer, which cost more CPU
# than the rest of its execution. The length bound, which bounds the cache's memory, stays.
CACHED_STATEMENT_PARAMS = 256
_queries.MAX_CACHED_STATEMENT_PARAMS = max(
    _queries.MAX_CACHED_STATEMENT_PARAMS, CACHED_STATEMENT_PARAMS
)


@functools.cache
def answered_within(seconds: float) -> type[psycopg.Connection[Any]]:
    """A connection class whose every wait for PostgreSQL (a statement, a pipeline's sync,
    a fetch) ends after ``seconds`` (``DATABASE_WAIT_TIMEOUT``; 0: never).

    A connection that stays open while nothing answers on it (a frozen proxy or pooler, a
    host that stopped without closing its sockets) otherwise held its request, and the
    thread and connection serving it, until TCP gave up, minutes later; a server-side
    ``statement_timeout`` cannot help, as the server never sees the statement. Past the
    bound the connection is closed (its state is unknown: a statement may be running),
    and the call fails with an ``OperationalError``, which every entry point answers as
    ``503 unavailable`` and the pool replaces. A wait its caller bounded itself (a
    cancellation's, notifications') keeps the caller's bound."""

    class BoundedConnection(psycopg.Connection[Any]):
        def wait(
            self,
            gen: Any,
            interval: float = psycopg_connection._WAIT_INTERVAL,
            timeout: float | None = None,
        ) -> Any:
            if timeout is not None or not seconds:
                return super().wait(gen, interval, timeout)
            try:
                return super().wait(gen, interval, seconds)
            except psycopg_errors._WaitTimeout:
                self.pgconn.finish()
                raise psycopg.OperationalError(
                    f"PostgreSQL did not answer within {seconds:g} s "
                    "(DATABASE_WAIT_TIMEOUT): the connection was closed"
                ) from None

    return BoundedConnection


class DatabaseWrapper(instrumented_base.DatabaseWrapper):
    def __init__(self, settings_dict: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        pool = settings_dict["OPTIONS"].get("pool")
        if pool is True:
            pool = settings_dict["OPTIONS"]["pool"] = {}
        if isinstance(pool, dict):
            pool.setdefault("connection_class", answered_within(settings.DATABASE_WAIT_TIMEOUT))
        super().__init__(settings_dict, *args, **kwargs)

    def _configure_connection(self, connection: Any) -> bool:
        """Django's, and the server's own bound on a statement just under the client's
        (``statement_timeout``, nine tenths of ``DATABASE_WAIT_TIMEOUT``): a statement that
        runs or waits on a lock that long is cancelled by the server, which answers the
        call with an error on a connection still good. Without it, the client gave up
        first and closed the connection while the server went on waiting on the lock, one
        backend more for every try, past the pool's size."""
        changed = bool(super()._configure_connection(connection))
        wait = settings.DATABASE_WAIT_TIMEOUT
        if not wait:
            return changed
        with connection.cursor() as cursor:
            cursor.execute(f"SET statement_timeout = {max(1, int(wait * 900))}")
        return True

    def get_connection_params(self) -> dict[str, Any]:
        params = base.DatabaseWrapper.get_connection_params(self)
        params["cursor_factory"] = instrumented(params["cursor_factory"], self.alias, self.vendor)
        return params
