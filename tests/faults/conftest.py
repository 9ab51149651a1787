"""Fault fixtures: a private Redis server that a test may kill and restart, and a TCP
proxy in front of PostgreSQL that a test may cut and restore.

Both are real processes/sockets on loopback; neither touches the shared services the
rest of the suite uses. A test names them before its servers' fixture (``daphne``,
``two_processes``): fixtures are torn down in the reverse order, so the servers stop while
the database and Redis they were given still answer, instead of retrying their final
writes against a fault the test no longer holds.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.faults.tcpproxy import TcpProxy
from tests.support.redis import PrivateRedis, free_port


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("needs the redis-server binary for a private, restartable Redis")
    server = PrivateRedis(free_port()).start()
    yield server
    server.stop()


@pytest.fixture
def postgres_proxy(transactional_db: None) -> Iterator[TcpProxy]:
    """A proxy in front of the test database's PostgreSQL server (skips on SQLite)."""
    from django.db import connection

    settings = connection.settings_dict
    if not settings["ENGINE"].endswith("postgresql"):
        pytest.skip("needs PostgreSQL (DATABASE_URL): the fault is a database unreachable")
    proxy = TcpProxy(settings.get("HOST") or "127.0.0.1", int(settings.get("PORT") or 5432))
    proxy.start()
    yield proxy
    proxy.stop()
