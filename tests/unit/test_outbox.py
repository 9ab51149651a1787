"""The outbox: what goes out together, in which order, and what a failed write leaves."""

from __future__ import annotations

import asyncio

import pytest

from streaming import events
from streaming.events import Event
from streaming.outbox import Outbox
from streaming.streamlog import Appended

HANG = 5.0


class Writes:
    """The log's side: each write waits here until the test ends it."""

    def __init__(self) -> None:
        self.started: list[tuple[list[Event], Appended]] = []
        self.published: list[list[Event]] = []
        self.failures: list[BaseException] = []
        self.arrived = asyncio.Event()

    def write(self, batch: list[Event], appended: Appended) -> None:
        self.started.append((batch, appended))
        self.arrived.set()

    def publish(self, batch: list[Event]) -> None:
        self.published.append(batch)

    def outbox(self, window: float = 0.0) -> Outbox:
        return Outbox(
            self.write, self.publish, first_seq=3, window=window, failed=self.failures.append
        )

    async def next(self, count: int) -> list[Event]:
        """The batch of write number ``count`` (from 1), once it started."""
        while len(self.started) < count:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), HANG)
        return self.started[count - 1][0]

    def end(self, count: int, error: BaseException | None = None) -> None:
        self.started[count - 1][1](error)


async def turns(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def texts(batch: list[Event]) -> list[tuple[int, str]]:
    return [(e["seq"], e.get("text", e["type"])) for e in batch]


async def test_what_one_turn_adds_goes_out_as_one_write_numbered_from_the_first_seq() -> None:
    writes = Writes()
    outbox = writes.outbox()
    outbox.add(events.start(0, message_id="m", segment=0, model="x"), urgent=True)
    outbox.add(events.delta(0, "Hel"))
    outbox.add(events.delta(0, "lo"))
    assert writes.started == [], "nothing is written from within add"
    assert texts(await writes.next(1)) == [(3, "start"), (4, "Hello")]
    assert all(isinstance(e, events.Logged) for e in writes.started[0][0])
    assert outbox.seq == 4


async def test_what_comes_during_a_write_goes_in_the_next_merged_and_only_after_it() -> None:
    writes = Writes()
    outbox = writes.outbox()
    outbox.add(events.delta(0, "a"))
    await writes.next(1)
    for text in "bcd":
        outbox.add(events.delta(0, text))
    await turns()
    assert len(writes.started) == 1, "one write in flight at a time"
    assert writes.published == [], "published only once the log holds it"
    writes.end(1)
    assert texts(writes.published[0]) == [(3, "a")]
    assert texts(await writes.next(2)) == [(4, "bcd")]
    drained = asyncio.ensure_future(outbox.drain())
    await turns()
    assert not drained.done(), "drain waits for the write in flight"
    writes.end(2)
    await asyncio.wait_for(drained, HANG)
    assert [texts(b) for b in writes.published] == [[(3, "a")], [(4, "bcd")]]


async def test_the_window_holds_a_write_back_until_an_urgent_event_or_a_drain() -> None:
    writes = Writes()
    outbox = writes.outbox(window=3600.0)
    outbox.add(events.delta(0, "a"))
    await writes.next(1)
    writes.end(1)
    outbox.add(events.delta(0, "b"))
    await turns()
    assert len(writes.started) == 1, "within the window of the last write"
    outbox.add(events.reasoning(0, "thinking"), urgent=True)
    assert texts(await writes.next(2)) == [(4, "b"), (5, "thinking")]
    writes.end(2)
    outbox.add(events.delta(0, "c"))
    drained = asyncio.ensure_future(outbox.drain())
    assert texts(await writes.next(3)) == [(6, "c")], "a drain does not wait out the window"
    writes.end(3)
    await asyncio.wait_for(drained, HANG)


async def test_a_failed_write_stops_the_outbox_and_keeps_its_seqs() -> None:
    writes = Writes()
    outbox = writes.outbox()
    outbox.add(events.delta(0, "a"))
    await writes.next(1)
    writes.end(1)
    outbox.add(events.delta(0, "b"))
    await writes.next(2)
    outbox.add(events.delta(0, "c"))
    drained = asyncio.ensure_future(outbox.drain())
    await turns()
    failure = ConnectionError("the log is gone")
    writes.end(2, failure)
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(drained, HANG)
    assert writes.failures == [failure]
    assert outbox.seq == 4, "the failed batch may be in the log: what follows goes after it"
    outbox.add(events.delta(0, "d"))
    await turns()
    assert len(writes.started) == 2, "nothing more is written after a failure"
    assert [texts(b) for b in writes.published] == [[(3, "a")]]


async def test_a_publish_that_raises_does_not_stop_the_writes_after_it() -> None:
    writes = Writes()
    calls = 0

    def publish(batch: list[Event]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a reader's bug")

    outbox = Outbox(writes.write, publish, first_seq=1, window=0.0)
    outbox.add(events.delta(0, "a"))
    await writes.next(1)
    outbox.add(events.delta(0, "b"))
    with pytest.raises(RuntimeError):
        writes.end(1)  # the log logs it; the outbox goes on
    assert texts(await writes.next(2)) == [(2, "b")]
    writes.end(2)
    await asyncio.wait_for(outbox.drain(), HANG)
    assert calls == 2


async def test_a_write_that_raises_as_it_starts_fails_the_outbox_instead_of_hanging_it() -> None:
    writes = Writes()

    def refuse(batch: list[Event], appended: Appended) -> None:
        raise ValueError("not a log")

    outbox = Outbox(refuse, writes.publish, first_seq=1, window=0.0, failed=writes.failures.append)
    outbox.add(events.delta(0, "a"))
    with pytest.raises(ValueError):
        await asyncio.wait_for(outbox.drain(), HANG)
    assert outbox.seq == 0 and writes.published == []
    assert [type(f) for f in writes.failures] == [ValueError]
