"""What a database thread keeps between calls (``streaming.database``): its connection while
that is as a new one would be, and nothing after an error, an open transaction or
``KEEP_SECONDS``; ``release`` hands every kept connection back.

One thread (``DATABASE_THREADS`` 1), so consecutive calls share it. A call that takes a
connection (from the pool on PostgreSQL, a new one on SQLite) is told by Django's
``connection_created`` signal, sent on every connect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError, ProgrammingError, connection, transaction
from django.db.backends.signals import connection_created

from streaming import database

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def one_thread(settings: Any) -> Iterator[None]:
    database.release()
    settings.DATABASE_THREADS = 1
    yield
    database.release()


@pytest.fixture
def connects() -> Iterator[list[object]]:
    made: list[object] = []

    def count(sender: object, connection: object, **kwargs: object) -> None:
        made.append(connection)

    connection_created.connect(count)
    yield made
    connection_created.disconnect(count)


def query() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def fails() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM no_such_table")


def leaves_a_transaction_open() -> None:
    transaction.set_autocommit(False)
    query()


async def test_a_thread_keeps_its_connection_between_calls(connects: list[object]) -> None:
    for _ in range(3):
        await database.run(query)
    assert len(connects) == 1


async def test_a_connection_that_saw_an_error_is_not_kept(connects: list[object]) -> None:
    await database.run(query)
    with pytest.raises(DatabaseError):
        await database.run(fails)
    await database.run(query)
    assert len(connects) == 2


async def test_a_connection_left_in_a_transaction_is_not_kept(connects: list[object]) -> None:
    await database.run(leaves_a_transaction_open)
    await database.run(query)
    assert len(connects) == 2
    assert await database.run(connection.get_autocommit)


async def test_a_connection_goes_back_once_kept_long_enough(
    monkeypatch: pytest.MonkeyPatch, connects: list[object]
) -> None:
    monkeypatch.setattr(database, "KEEP_SECONDS", 0.0)
    await database.run(query)  # kept from now until now + 0
    await database.run(query)  # finds it expired: uses it, then hands it back
    assert len(connects) == 1
    await database.run(query)
    assert len(connects) == 2


async def test_release_hands_the_kept_connections_back(connects: list[object]) -> None:
    await database.run(query)
    kept = [c for held in database._kept.values() for c in held]
    assert kept and all(c.connection is not None for c in kept)
    await asyncio.to_thread(database.release)  # Django closes connections from sync code only
    assert all(c.connection is None for c in kept)
    assert not database._kept
    await database.run(query)  # a new thread, with a connection of its own
    assert len(connects) == 2


# --- statements on the event loop ---------------------------------------------------------
on_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="statements go on the loop on PostgreSQL only"
)
PID = "SELECT pg_backend_pid()"


async def one(sql: str, params: list[Any] | None = None) -> Any:
    """The one value of ``sql``'s one row."""
    result = await database.statement(sql, params or [])
    assert len(result.rows) == 1 and len(result.rows[0]) == 1
    return result.rows[0][0]


@on_postgresql
async def test_the_loop_keeps_its_connection_between_statements(settings: Any) -> None:
    settings.DATABASE_LOOP_CONNECTIONS = 1
    pids = {await one(PID) for _ in range(3)}
    assert len(pids) == 1


@on_postgresql
async def test_a_statement_reads_and_writes_as_django_does() -> None:
    """Django's adapters and time zone: JSON comes back as text (for the field to parse, as
    Django's own loaders give it), times are aware."""
    from psycopg.types.json import Jsonb

    result = await database.statement(
        "SELECT %s::jsonb AS d, now() AS t, current_setting('TimeZone') AS z",
        [Jsonb({"a": "é"})],
    )
    assert result.columns == ["d", "t", "z"]
    [(document, now, zone)] = result.rows
    assert document == '{"a": "é"}' and now.tzinfo is not None and zone == "UTC"
    assert await database.statement("SET LOCAL work_mem = '4MB'", []) == database.Rows([], [])


@on_postgresql
async def test_a_statement_that_fails_raises_and_the_next_one_runs(settings: Any) -> None:
    settings.DATABASE_LOOP_CONNECTIONS = 1
    with pytest.raises(ProgrammingError):  # Django's, as from ``run``
        await database.statement("SELECT * FROM no_such_table", [])
    assert await one("SELECT 1") == 1


@on_postgresql
async def test_a_cancelled_caller_leaves_its_statement_to_end(settings: Any) -> None:
    """As with ``run``: the caller stops waiting, the statement commits all the same."""
    settings.DATABASE_LOOP_CONNECTIONS = 1  # the read below waits for the write's connection
    await database.statement("CREATE TEMP TABLE IF NOT EXISTS t (n int)", [])
    write = asyncio.create_task(database.statement("INSERT INTO t SELECT 7 FROM pg_sleep(0.2)", []))
    await asyncio.sleep(0)  # one turn: the write is handed to a task of its own
    write.cancel()
    with pytest.raises(asyncio.CancelledError):
        await write
    assert await one("SELECT count(*) FROM t WHERE n = 7") == 1


@on_postgresql
async def test_a_loop_connection_goes_back_once_kept_long_enough(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.DATABASE_LOOP_CONNECTIONS = 1
    monkeypatch.setattr(database, "KEEP_SECONDS", 0.0)
    first = await one(PID)
    assert await one(PID) != first


@on_postgresql
async def test_release_closes_the_loops_connections(settings: Any) -> None:
    settings.DATABASE_LOOP_CONNECTIONS = 1
    pid = await one(PID)
    database.release()
    assert await one(PID) != pid
    assert await one("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]) == 0
