"""The per-process fan-out: readers see every event once, in order, and a lagging reader
falls back to the log instead of pinning memory."""

from __future__ import annotations

import asyncio

import pytest

from streaming import events
from streaming.hub import FOLLOWED_TAIL_EVENTS, MAX_TOPIC_EVENTS, TAIL_EVENTS, Hub
from streaming.streamlog.memory import MemoryStreamLog

pytestmark = pytest.mark.asyncio


async def emit(hub: Hub, mid: str, batch: list[dict]) -> None:
    await hub.log.append(mid, batch)
    hub.publish(mid, batch)


async def emit_stored(hub: Hub, mid: str, batch: list[dict]) -> None:
    """``emit``, with the database's copy keeping up (the write-behind ran after it)."""
    await emit(hub, mid, batch)
    hub.stored(mid, batch[-1]["seq"])


async def collect(hub: Hub, mid: str, after: int, settled: int = 0) -> list[dict]:
    out: list[dict] = []
    async for batch in hub.read(mid, after, settled=settled):
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


async def test_a_topic_keeps_a_short_tail_past_its_readers_and_what_they_still_need():
    hub = Hub(MemoryStreamLog())
    mid = "m-tail"
    hub.open_local(mid, 1)
    topic = hub.topics[mid]
    behind = hub.read(mid, 0)
    reading = asyncio.ensure_future(anext(behind))
    await emit_stored(hub, mid, [events.delta(1, "x")])
    assert [e["seq"] for e in await reading] == [1]  # attached at cursor 1, not reading on
    for seq in range(2, 100):
        await emit_stored(hub, mid, [events.delta(seq, "x")])
    # Everything after the reader's cursor is still here for it.
    assert topic.events[0]["seq"] == 2
    rest = await anext(behind)
    assert [e["seq"] for e in rest] == list(range(2, 100))
    for seq in range(100, 200):
        await emit_stored(hub, mid, [events.delta(seq, "x")])
        assert len(topic.events) <= 2 * TAIL_EVENTS + 99, "only what the reader needs, then"
    more = await anext(behind)  # caught up again: the topic trims to a short tail
    assert [e["seq"] for e in more] == list(range(100, 200))
    await emit_stored(hub, mid, [events.delta(200, "x")])
    assert len(topic.events) <= 2 * TAIL_EVENTS
    # A reader from the start reads back from the log what the topic let go.
    late = asyncio.create_task(collect(hub, mid, 0))
    await emit(hub, mid, [events.done(201, segment=0, termination={"status": "complete"})])
    hub.close_local(mid)
    assert [e["seq"] for e in await late] == list(range(1, 202))
    await behind.aclose()


@pytest.mark.parametrize("followed", [False, True], ids=["read-here", "followed-elsewhere"])
async def test_a_topic_followed_from_other_processes_keeps_the_longer_tail(followed):
    hub = Hub(MemoryStreamLog())
    mid = "m-followed"
    hub.open_local(mid, 1)
    if followed:
        hub.keep_for_followers(mid)
    tail = FOLLOWED_TAIL_EVENTS if followed else TAIL_EVENTS
    for seq in range(1, 200):
        await emit_stored(hub, mid, [events.delta(seq, "x")])
        held = [e["seq"] for e in hub.topics[mid].events]
        assert held == list(range(max(1, seq - len(held) + 1), seq + 1)), "the newest, whole"
        assert min(seq, tail) <= len(held) <= 2 * tail
    hub.close_local(mid)


async def test_a_generating_topic_keeps_what_the_database_does_not_hold():
    """Nothing of a running answer is only in the log: a log that loses its tail is
    refilled from here, and the database's copy covers what the topic let go."""
    hub = Hub(MemoryStreamLog())
    mid = "m-stored"
    hub.open_local(mid, 1)
    topic = hub.topics[mid]
    for seq in range(1, 50):
        await emit(hub, mid, [events.delta(seq, "x")])
    assert [e["seq"] for e in topic.events] == list(range(1, 50)), "nothing stored yet"
    hub.stored(mid, 40)
    await emit(hub, mid, [events.delta(50, "x")])
    assert [e["seq"] for e in topic.events] == list(range(41, 51))
    hub.stored(mid, 50)
    await emit(hub, mid, [events.delta(51, "x")])
    assert len(topic.events) <= 2 * TAIL_EVENTS and topic.events[-1]["seq"] == 51
    hub.close_local(mid)
    hub.stored(mid, 60)  # no generation here: nothing to keep for it
    assert topic.stored is None


class UnreachableLog(MemoryStreamLog):
    """A log whose reads fail, as Redis's do while it is down."""

    async def read(self, message_id: str, after: int = 0, limit: int | None = None) -> list:
        raise ConnectionError("the log is unreachable")


async def test_a_new_reader_of_a_local_answer_waits_through_a_log_outage():
    """While the log cannot be read, a reader from the start of a generation of this
    process gets what the topic holds (its subscription bridges the rest from the
    database); a resuming reader, whose gap the database cannot fill, fails."""
    hub = Hub(UnreachableLog())
    mid = "m-outage"
    hub.open_local(mid, 1)
    for seq in range(1, 30):
        await emit_stored(hub, mid, [events.delta(seq, "x")])
    first_held = hub.topics[mid].events[0]["seq"]
    assert first_held > 2, "the topic let go of what the database holds"
    fresh = hub.read(mid, 0)
    assert [e["seq"] for e in await anext(fresh)] == list(range(first_held, 30))
    await fresh.aclose()
    with pytest.raises(ConnectionError):
        await anext(hub.read(mid, 1))
    hub.close_local(mid)


@pytest.mark.parametrize("local", [True, False], ids=["generated-here", "generated-elsewhere"])
async def test_a_read_from_before_a_continue_goes_on_past_the_earlier_segments_end(local):
    """A reader from seq 0 of a continued answer, subscribed before the new segment wrote
    anything: the first segment's `done` (at ``settled``) does not end its read."""
    hub = Hub(MemoryStreamLog())
    mid = "m3"
    first = [
        events.start(1, message_id=mid, segment=0, model="x"),
        events.delta(2, "a"),
        events.done(3, segment=0, termination={"status": "cancelled"}),
    ]
    await hub.log.append(mid, first)
    if local:
        hub.open_local(mid, 4)
    reading = asyncio.ensure_future(collect(hub, mid, 0, settled=3))
    second = [
        events.start(4, message_id=mid, segment=1, model="x"),
        events.delta(5, "b"),
        events.done(6, segment=1, termination={"status": "complete"}),
    ]
    for event in second:
        await asyncio.sleep(0)  # the reader waits for each event: none is there yet
        assert not reading.done()
        await emit(hub, mid, [event]) if local else await hub.log.append(mid, [event])
    if local:
        hub.close_local(mid)
    assert [e["seq"] for e in await asyncio.wait_for(reading, 10)] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("local", [True, False], ids=["generated-here", "generated-elsewhere"])
async def test_a_read_ends_at_its_segments_done_when_the_next_segment_comes_with_it(local):
    """A Continue started the moment a segment ended (in another process, say): the
    `done` and the next segment's first events reach a reader in one batch, and its read
    ends at that `done`, not at the next segment's."""
    hub = Hub(MemoryStreamLog())
    mid = "m4"
    if local:
        hub.open_local(mid, 1)
    await hub.log.append(mid, [events.start(1, message_id=mid, segment=0, model="x")])
    reading = asyncio.ensure_future(collect(hub, mid, 1))
    await asyncio.sleep(0)
    together = [
        events.delta(2, "a"),
        events.done(3, segment=0, termination={"status": "cancelled"}),
        events.start(4, message_id=mid, segment=1, model="x"),
        events.delta(5, "b"),
    ]
    await emit(hub, mid, together) if local else await hub.log.append(mid, together)
    assert [e["seq"] for e in await asyncio.wait_for(reading, 10)] == [2, 3]
    if local:
        hub.close_local(mid)
