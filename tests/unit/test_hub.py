"""The per-process fan-out: readers see every event once, in order, and a lagging reader
falls back to the log instead of pinning memory."""

from __future__ import annotations

import asyncio

import pytest

from streaming import events
from streaming.hub import MAX_TOPIC_EVENTS, Hub
from streaming.streamlog.memory import MemoryStreamLog

pytestmark = pytest.mark.asyncio


async def emit(hub: Hub, mid: str, batch: list[dict]) -> None:
    await hub.log.append(mid, batch)
    hub.publish(mid, batch)


async def collect(hub: Hub, mid: str, after: int) -> list[dict]:
    out: list[dict] = []
    async for batch in hub.read(mid, after):
        assert batch is not None
        out.extend(batch)
    return out


async def test_local_readers_get_every_event_once():
    hub = Hub(MemoryStreamLog())
    mid = "m1"
    hub.open_local(mid, 1)
    readers = [asyncio.create_task(collect(hub, mid, 0)) for _ in range(3)]
    await emit(hub, mid, [events.start(1, message_id=mid, segment=0, model="x")])
    for seq in range(2, 200):
        await emit(hub, mid, [events.delta(seq, str(seq))])
    await emit(hub, mid, [events.done(200, segment=0, termination={"status": "complete"})])
    hub.close_local(mid)
    results = await asyncio.gather(*readers)
    for result in results:
        assert [e["seq"] for e in result] == list(range(1, 201))
    assert mid not in hub.topics, "a topic nobody needs is dropped"


async def test_a_reader_far_behind_reads_back_from_the_log():
    hub = Hub(MemoryStreamLog())
    mid = "m2"
    hub.open_local(mid, 1)
    stalled = hub.read(mid, 0)
    reading = asyncio.ensure_future(anext(stalled))
    await emit(hub, mid, [events.delta(1, "x")])
    first = await reading  # attached at cursor 1 from now on, and stops reading
    total = MAX_TOPIC_EVENTS * 3
    for seq in range(2, total + 1):
        await emit(hub, mid, [events.delta(seq, "x")])
    assert len(hub.topics[mid].events) <= MAX_TOPIC_EVENTS
    await emit(hub, mid, [events.done(total + 1, segment=0, termination={"status": "complete"})])
    rest: list[dict] = []
    async for batch in stalled:
        assert batch is not None
        rest.extend(batch)
    assert [e["seq"] for e in first + rest] == list(range(1, total + 2))
