"""What a database thread keeps between calls (``streaming.database``): its connection while
that is as a new one would be, and nothing after an error, an open transaction or
``KEEP_SECONDS``; ``release`` hands every kept connection back.

One thread (``DATABASE_THREADS`` 1), so consecutive calls share it. A call that takes a
connection (from the pool on PostgreSQL, a new one on SQLite) is told by Django's
``connection_created`` signal, sent on every connect.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
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


async def test_release_waits_no_longer_than_told_for_a_call_that_does_not_end() -> None:
    """At shutdown a call on a database that cannot answer may wait for the pool's
    timeout: ``release`` stops waiting for it after ``wait`` s, and its thread, a daemon,
    keeps no process from exiting. The call still ends, and its caller hears of it."""

    started, go = threading.Event(), threading.Event()

    def blocked() -> bool:
        started.set()
        return go.wait()

    call = asyncio.ensure_future(database.run(blocked))
    assert await asyncio.to_thread(started.wait, 10)
    threads = [t for t in threading.enumerate() if t.name.startswith("db_")]
    assert threads and all(t.daemon for t in threads)
    assert not await asyncio.to_thread(database.release, 0.05), "a thread is still in a call"
    go.set()
    assert await asyncio.wait_for(call, 10)
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive(), "it ends once its call has"
