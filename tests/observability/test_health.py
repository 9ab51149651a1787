"""``/healthz`` and ``/readyz`` of a real Daphne process, with dependencies really down."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import httpx
import pytest

pytestmark = pytest.mark.asyncio


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A local port bound but never listening: connections to it are refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


async def readyz(url: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        response = await client.get("/readyz")
    assert response.headers["cache-control"] == "no-store"
    return response


async def test_ready_when_everything_is_up(daphne):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        alive = await client.get("/healthz")
    assert alive.status_code == 200
    response = await readyz(server.url)
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ok"
    expected = {"database", "engine"} | ({"redis"} if os.environ.get("REDIS_URL") else set())
    assert body["checks"] == dict.fromkeys(expected, "ok")
    assert "down" not in body


async def test_redis_unreachable_is_named(daphne, closed_port):
    server = daphne(REDIS_URL=f"redis://127.0.0.1:{closed_port}/0")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        alive = await client.get("/healthz")
    assert alive.status_code == 200  # the process itself is fine
    response = await readyz(server.url)
    body = response.json()
    assert response.status_code == 503, body
    assert body["down"] == ["redis"]
    assert str(closed_port) in body["checks"]["redis"]
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["engine"] == "ok"


async def test_engine_unreachable_is_named(daphne, closed_port):
    server = daphne(ENGINE_URL=f"http://127.0.0.1:{closed_port}", ENGINE_MODEL="test-model")
    response = await readyz(server.url)
    body = response.json()
    assert response.status_code == 503, body
    assert body["down"] == ["engine"]
    assert body["checks"]["database"] == "ok"


async def test_engine_that_answers_unhealthy_is_named(daphne, emulator):
    server = daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model")
    assert (await readyz(server.url)).status_code == 200
    async with httpx.AsyncClient(base_url=emulator, timeout=5) as client:
        (await client.post("/_emulator/health", json={"healthy": False})).raise_for_status()
    response = await readyz(server.url)
    assert response.status_code == 503
    assert response.json()["down"] == ["engine"]


async def test_database_unreachable_is_named(daphne, closed_port):
    server = daphne(DATABASE_URL=f"postgres://postgres@127.0.0.1:{closed_port}/chat")
    response = await readyz(server.url)
    body = response.json()
    assert response.status_code == 503, body
    assert body["down"] == ["database"]
    assert body["checks"]["engine"] == "ok"
