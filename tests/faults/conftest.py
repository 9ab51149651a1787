"""Fault fixtures: TCP proxies in front of PostgreSQL and Redis that a test may cut and
restore for the processes it gives them to (and, from ``tests/conftest.py``,
``private_redis``: a Redis a test may kill and restart).

Both are real processes/sockets on loopback; neither touches the shared services the
rest of the suite uses. A test names them before its servers' fixture (``daphne``,
``two_processes``): fixtures are torn down in the reverse order, so the servers stop while
the database and Redis they were given still answer, instead of retrying their final
writes against a fault the test no longer holds.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.faults.tcpproxy import TcpProxy


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


@pytest.fixture
def redis_proxy(needs_redis: None) -> Iterator[TcpProxy]:
    """A proxy in front of the test run's Redis (``REDIS_URL``)."""
    url = urlsplit(os.environ["REDIS_URL"])
    proxy = TcpProxy(url.hostname or "127.0.0.1", url.port or 6379)
    proxy.start()
    yield proxy
    proxy.stop()
