"""A caller that leaves while the answer it asked for is being made.

A post that makes an answer locks its owner's row first, for the count of the answers
they have streaming (``statements.post_reads``). ``held_owner`` holds that lock from a
PostgreSQL connection of its own, so that a post of the owner's waits on it: the test
sends its request over a real socket, awaits the server's wait on the lock
(``Held.waited_on``), closes its client, makes sure the server has seen it go
(``seen_gone``), and only then lets the post go on, as the block ends. The answer is
then made for a caller that is no longer there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from tests.support.servers import DaphneServer, database_url


class Held:
    """The owner's row, locked by ``holder`` (``held_owner``)."""

    def __init__(self, holder: psycopg.AsyncConnection[Any], watcher: psycopg.AsyncConnection[Any]):
        self.holder = holder
        self.watcher = watcher

    async def waited_on(self) -> None:
        """Return once a server's statement waits on the lock. PostgreSQL tells no one
        when a backend starts to wait, so its activity is asked until one does."""
        pid = self.holder.info.backend_pid
        async with asyncio.timeout(30):
            while True:
                cursor = await self.watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                    [pid],
                )
                row = await cursor.fetchone()
                if row is not None and row[0]:
                    return
                await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def held_owner(user_id: int) -> AsyncIterator[Held]:
    """Hold the lock on ``user_id``'s row for the block; released (rolled back) as it ends."""
    table = get_user_model()._meta.db_table
    holder = await psycopg.AsyncConnection.connect(database_url())
    watcher = await psycopg.AsyncConnection.connect(database_url(), autocommit=True)
    try:
        await holder.execute(f'SELECT 1 FROM "{table}" WHERE id = %s FOR UPDATE', [user_id])
        yield Held(holder, watcher)
    finally:
        await holder.rollback()
        await holder.close()
        await watcher.close()


@dataclass
class Caller:
    """A client's connection with its request sent (``send_request``)."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def chunked_response(self) -> bytes:
        """The whole response, read to the end of its chunked body."""
        async with asyncio.timeout(30):
            return await self.reader.readuntil(b"\r\n0\r\n\r\n")


async def send_request(
    server: DaphneServer,
    method: str,
    path: str,
    headers: dict[str, str],
    body: dict[str, Any],
) -> Caller:
    """Send a whole HTTP request with a JSON ``body`` over a connection of its own, and
    read nothing yet: the caller closes the connection (``leave``) to go away, or reads
    its answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    data = json.dumps(body).encode()
    head = {
        "Host": f"127.0.0.1:{server.port}",
        "Content-Type": "application/json",
        "Content-Length": str(len(data)),
        **headers,
    }
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items()), "", ""]
    writer.write("\r\n".join(lines).encode("latin-1") + data)
    await writer.drain()
    return Caller(reader, writer)


async def leave(caller: Caller) -> None:
    """Close the client's connection, as a caller giving up does."""
    caller.writer.close()
    await caller.writer.wait_closed()


async def seen_gone(api: httpx.AsyncClient) -> None:
    """Return once the server has handled a client's leaving: a request sent after the
    client closed its connection, answered. The server read the closed connection's end
    before this request's bytes (it was there first) and handles what it read in order,
    on one event loop; the answer to this request takes many more of the loop's turns
    than the disconnect's handling, which each read schedules at once."""
    response = await api.get("/healthz")
    assert response.status_code == 200, response.text


async def ended_status(conversation: str, limit: float = 30.0) -> str:
    """The status of the conversation's answer once it exists and has ended, read from
    the database (the caller's credentials may be gone): a state reached in the server,
    with no event of its own to await."""
    from streaming.models import Message

    def status() -> str | None:
        answers = Message.objects.filter(conversation_id=conversation, role="assistant")
        return answers.values_list("status", flat=True).first()

    async with asyncio.timeout(limit):
        while True:
            found = await sync_to_async(status)()
            if found not in (None, "streaming"):
                return str(found)
            await asyncio.sleep(0.05)
