"""A reconnecting SSE reader for fault tests: it behaves like EventSource (reconnects with
``Last-Event-ID`` when a stream ends before ``done``) and lets a test wait until it has
seen a number of deltas."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support.clients import auth, create_conversation, iter_sse, post_message

RECONNECT_DELAY = 0.2
MAX_RECONNECTS = 50


@dataclass
class Reader:
    client: httpx.AsyncClient
    token: str
    message_id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    reconnects: int = 0
    _waiters: list[tuple[int, asyncio.Event]] = field(default_factory=list)

    @property
    def deltas(self) -> int:
        return sum(1 for e in self.events if e["type"] == "delta")

    def seen(self, deltas: int) -> asyncio.Event:
        """An event set once this reader has received ``deltas`` deltas."""
        ready = asyncio.Event()
        self._waiters.append((deltas, ready))
        self._notify()
        return ready

    def _notify(self) -> None:
        for wanted, ready in self._waiters:
            if self.deltas >= wanted:
                ready.set()

    async def run(self) -> list[dict[str, Any]]:
        url = f"/api/messages/{self.message_id}/stream/"
        while True:
            headers = auth(self.token)
            if self.events:
                headers["Last-Event-ID"] = str(self.events[-1]["seq"])
            try:
                async with self.client.stream("GET", url, headers=headers) as response:
                    if response.status_code == 204:
                        return self.events
                    if response.status_code == 200:
                        async for item in iter_sse(response):
                            if isinstance(item, str):
                                continue
                            self.events.append(item.data)
                            self._notify()
                            if item.data["type"] == "done":
                                return self.events
            except httpx.TransportError:
                pass
            self.reconnects += 1
            assert self.reconnects <= MAX_RECONNECTS, "the stream never came back"
            await asyncio.sleep(RECONNECT_DELAY)  # EventSource's retry delay, not a sync


def assert_exact(events: list[dict[str, Any]], persisted: dict[str, Any]) -> None:
    """Strictly increasing seqs ending in ``done`` whose deltas spell the stored content."""
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(set(seqs)), "no duplicated or reordered events"
    assert events[-1]["type"] == "done"
    assert events[-1]["seq"] == persisted["last_seq"]
    text = "".join(e["text"] for e in events if e["type"] == "delta")
    assert text == persisted["content"], "every token reached the reader exactly once"


async def answer_being_read(
    asked: httpx.AsyncClient,
    read: httpx.AsyncClient,
    token: str,
    simulation: dict[str, Any],
    seen: int,
) -> tuple[dict[str, Any], Reader, asyncio.Task[list[dict[str, Any]]]]:
    """A new conversation's answer asked for on ``asked`` (the simulated engine's
    ``simulation``), read on ``read`` by a ``Reader`` running in its task, once it has
    seen ``seen`` deltas: the answer, the reader and its task."""
    conversation = await create_conversation(asked, token)
    message = await post_message(asked, token, conversation, "hi", simulation=simulation)
    reader = Reader(read, token, message["id"])
    task = asyncio.create_task(reader.run())
    async with asyncio.timeout(30):
        await reader.seen(seen).wait()
    return message, reader, task
