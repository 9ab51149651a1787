"""Shared fixtures: users with tokens, real Daphne processes, the vLLM emulator.

Tests that start servers use ``transactional_db`` so their rows are committed and visible
to the Daphne processes, which connect to the same test database (PostgreSQL in CI).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.support.redis import PrivateRedis, free_port
from tests.support.servers import DaphneServer, TwoProcesses, server_env

REDIS_URL = os.environ.get("REDIS_URL", "")


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    if worker != "gw0" and "tests.support.workers" not in sys.modules:
        raise pytest.UsageError(
            "parallel runs need `-p tests.support.workers` (each worker its own Redis): "
            "use `make test`, or `python -m pytest -p tests.support.workers -n 3 --dist loadscope`"
        )


@pytest.fixture(autouse=True)
def _database_threads_released() -> Iterator[None]:
    """No thread keeps a database connection past its test: the database is flushed after
    it and dropped at the end, which a connection still open would refuse. The product's
    database threads (``streaming.database``) hand theirs back, and so does the one thread
    asgiref runs a test's own ``sync_to_async`` calls in."""
    yield
    from asgiref.sync import SyncToAsync
    from django.db import connections

    from streaming import database

    database.release()
    SyncToAsync.single_thread_executor.submit(connections.close_all).result()


@dataclass
class Account:
    username: str
    password: str
    token: str
    user: Any


@pytest.fixture
def make_account(transactional_db: None) -> Callable[..., Account]:
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    counter = iter(range(1_000_000))

    def make(username: str | None = None, *, staff: bool = False) -> Account:
        name = username or f"user{next(counter)}"
        password = "test-pass-123"
        user = User.objects.create_user(name, password=password, is_staff=staff, is_superuser=staff)
        token = Token.objects.create(user=user)
        return Account(name, password, token.key, user)

    return make


@pytest.fixture
def account(make_account: Callable[..., Account]) -> Account:
    return make_account("alice")


@pytest.fixture
def other_account(make_account: Callable[..., Account]) -> Account:
    """A second user, for "another user's object answers 404" checks."""
    return make_account("mallory")


@pytest.fixture
def needs_redis() -> None:
    """Several processes share state only through Redis; without it there is nothing to test."""
    if not REDIS_URL:
        pytest.skip("needs REDIS_URL (several processes share the log through Redis)")


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    """A ``redis-server`` of the test's own: one it may kill and restart, or whose
    server-wide state (command counts, loaded scripts) no other client touches."""
    if shutil.which("redis-server") is None:
        pytest.skip("needs the redis-server binary for a private Redis")
    server = PrivateRedis(free_port()).start()
    yield server
    server.stop()


@pytest.fixture
def daphne(transactional_db: None) -> Iterator[Callable[..., DaphneServer]]:
    """Factory: ``daphne(**env)`` starts a Daphne process; all are stopped at test end."""
    servers: list[DaphneServer] = []

    def start(name: str = "daphne", send_buffer: int | None = None, **env: Any) -> DaphneServer:
        server = DaphneServer(server_env(**env), name=name, send_buffer=send_buffer).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def two_processes(
    daphne: Callable[..., DaphneServer],
) -> Callable[..., AbstractAsyncContextManager[TwoProcesses]]:
    """Factory: ``async with two_processes(**env) as (a, b, ca, cb)`` starts two Daphne
    processes with the same ``env`` (named ``"a"`` and ``"b"`` unless given) and opens an
    HTTP client on each, closed when the block ends; the processes stop at test end."""

    @contextlib.asynccontextmanager
    async def start(first: str = "a", second: str = "b", **env: Any) -> AsyncIterator[TwoProcesses]:
        a, b = daphne(first, **env), daphne(second, **env)
        async with (
            httpx.AsyncClient(base_url=a.url, timeout=30) as ca,
            httpx.AsyncClient(base_url=b.url, timeout=30) as cb,
        ):
            yield TwoProcesses(a, b, ca, cb)

    return start


@pytest.fixture
def emulator() -> Iterator[str]:
    from tests.emulator.server import run_emulator

    with run_emulator(model="test-model") as url:
        yield url
