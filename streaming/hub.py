"""Process-local fan-out of message events to the readers attached in this process.

A ``Topic`` holds the recent events of one message. When the message is generated in this
process the generation publishes into it right after each log append, so local readers get
tokens without a Redis round trip. Otherwise one follower task per message tails the
stream log and publishes for every local reader of it (one ``XREAD`` per message per
process, not per reader).

Memory: a topic keeps events only from the slowest attached reader's cursor on, plus a
short tail, and while its message is generated here what the database does not hold yet
(``stored``); anything older is read back from the log. Readers hold a cursor, never a
queue, so a reader that falls behind costs nothing here. A log that lost its tail (Redis
restarted empty) is refilled from the generating process's topic, so with the database's
copy nothing of a running answer is ever only in the log.

CPU: this is per-token code. A publish resolves the futures of the readers waiting right
now and nothing else; a reader's keep-alive deadline is one timer per idle period that
re-arms itself lazily, not a timeout scope per wait (which cost a timer per token).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator

from streaming.events import DONE, Event, up_to_done
from streaming.streamlog import StreamLog

log = logging.getLogger(__name__)

# Events kept in a topic beyond what attached readers still need, for quick resumes: a
# few, because a resume further back reads the log, one round trip, while every event
# held costs about 400 bytes for as long as its answer streams. A topic trims when it
# holds twice as many, so a trim is paid once per few publishes, not per publish.
TAIL_EVENTS = 4
# The tail of a generation that readers in other processes follow (``keep_for_followers``):
# they read the log, not this topic, and when the log loses its tail (Redis restarted
# empty) the generation puts back what its topic holds (``generation.submit_following``),
# so the tail must reach back past a follower that lags the writer.
FOLLOWED_TAIL_EVENTS = 32
# The default bound of a topic (``STREAMING["HUB_MAX_EVENTS"]``): a reader further behind
# reads back from the log, so a stalled client cannot pin a whole answer in memory.
MAX_TOPIC_EVENTS = 512


class Topic:
    __slots__ = (
        "cursors",
        "ended",
        "events",
        "first_seq",
        "follower",
        "local",
        "max_events",
        "message_id",
        "stored",
        "tail",
        "waiters",
    )

    def __init__(self, message_id: str, max_events: int = MAX_TOPIC_EVENTS) -> None:
        self.message_id = message_id
        self.max_events = max_events
        self.events: list[Event] = []
        self.waiters: list[asyncio.Future[bool]] = []
        self.cursors: dict[int, int] = {}
        self.local = False  # a generation in this process publishes here
        self.ended = False  # the newest event is a `done` and no generation runs here
        self.follower: asyncio.Task[None] | None = None
        # The seq this topic starts at while it holds no events yet (None: unknown).
        self.first_seq: int | None = None
        self.tail = TAIL_EVENTS
        # While a generation here publishes: the seq the database's copy of the message
        # reaches (its write-behind); the events after it are kept.
        self.stored: int | None = None

    def publish(self, events: list[Event]) -> None:
        if not events:
            return
        if self.events and events[0]["seq"] <= self.events[-1]["seq"]:
            last = self.events[-1]["seq"]
            events = [e for e in events if e["seq"] > last]
            if not events:
                return
        self.events.extend(events)
        self.ended = events[-1]["type"] == DONE and not self.local
        self._trim()
        self.wake()

    def wake(self) -> None:
        """Resolve the futures of the readers waiting now (with False: not a keep-alive)."""
        waiters = self.waiters
        if waiters:
            self.waiters = []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(False)

    def covers(self, cursor: int) -> bool:
        """True when every event after ``cursor`` that exists is (or will be) here."""
        if self.events:
            first: int = self.events[0]["seq"]
            return first <= cursor + 1
        return self.first_seq is not None and self.first_seq <= cursor + 1

    def after(self, cursor: int) -> list[Event]:
        events = self.events
        if not events or events[-1]["seq"] <= cursor:
            return []
        # Readers are usually near the end: scan back instead of bisecting.
        index = len(events) - 1
        while index > 0 and events[index - 1]["seq"] > cursor:
            index -= 1
        return events[index:]

    def _trim(self) -> None:
        if len(self.events) <= 2 * self.tail:
            return
        keep_from = self.events[-self.tail]["seq"]
        if self.cursors:
            keep_from = min(keep_from, min(self.cursors.values()) + 1)
        if self.stored is not None:
            keep_from = min(keep_from, self.stored + 1)
        if len(self.events) > self.max_events:
            keep_from = max(keep_from, self.events[-self.max_events]["seq"])
        drop = 0
        for event in self.events:
            if event["seq"] >= keep_from:
                break
            drop += 1
        if drop:
            del self.events[:drop]


class _IdleClock:
    """A reader's keep-alive deadline: ``idle`` seconds after its last yield.

    The timer is armed once per idle period; when it fires early (the reader was active
    meanwhile) it re-arms for the rest, and when it is due it resolves the reader's
    waiter with True (keep-alive due) - or, if the reader is busy writing, leaves it to
    the next wait.
    """

    __slots__ = ("idle", "last", "loop", "timer", "waiter")

    def __init__(self, idle: float) -> None:
        self.idle = idle
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()
        self.waiter: asyncio.Future[bool] | None = None
        self.timer: asyncio.TimerHandle | None = self.loop.call_at(self.last + idle, self._due)

    def active(self) -> None:
        self.last = self.loop.time()
        if self.timer is None:
            self.timer = self.loop.call_at(self.last + self.idle, self._due)

    def _due(self) -> None:
        due = self.last + self.idle
        if self.loop.time() < due:
            self.timer = self.loop.call_at(due, self._due)
            return
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            self.timer = None  # re-armed by active() when the keep-alive is yielded
            waiter.set_result(True)
        else:
            self.timer = self.loop.call_at(self.loop.time() + self.idle, self._due)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class Hub:
    def __init__(self, log: StreamLog, max_events: int = MAX_TOPIC_EVENTS) -> None:
        self.log = log
        self.max_events = max_events
        self.topics: dict[str, Topic] = {}
        self._ids = itertools.count()

    def _topic(self, message_id: str) -> Topic:
        topic = self.topics.get(message_id)
        if topic is None:
            topic = self.topics[message_id] = Topic(message_id, self.max_events)
        return topic

    # --- the generating side --------------------------------------------------------
    def open_local(self, message_id: str, first_seq: int) -> Topic:
        topic = self._topic(message_id)
        if topic.follower is not None:
            topic.follower.cancel()
            topic.follower = None
        if not topic.events or topic.events[-1]["seq"] < first_seq - 1:
            topic.events = []
            topic.first_seq = first_seq
        topic.local = True
        topic.ended = False
        topic.stored = first_seq - 1  # the earlier segments are stored whole
        return topic

    def publish(self, message_id: str, events: list[Event]) -> None:
        topic = self.topics.get(message_id)
        if topic is not None:
            topic.publish(events)

    def stored(self, message_id: str, seq: int) -> None:
        """The database holds the local generation's text up to ``seq``: the topic may let
        go of the events up to it."""
        topic = self.topics.get(message_id)
        if topic is not None and topic.local:
            topic.stored = max(seq, topic.stored or 0)

    def keep_for_followers(self, message_id: str) -> None:
        """Readers in other processes follow the local generation of ``message_id``: its
        topic keeps the longer tail (``FOLLOWED_TAIL_EVENTS``) from now on."""
        topic = self.topics.get(message_id)
        if topic is not None:
            topic.tail = FOLLOWED_TAIL_EVENTS

    def close_local(self, message_id: str) -> None:
        """The local generation ended. Its ``done`` is here, unless another process (a
        reaper) owned the end: then the readers still waiting follow the log for it."""
        topic = self.topics.get(message_id)
        if topic is None:
            return
        topic.local = False
        topic.stored = None
        topic.ended = bool(topic.events) and topic.events[-1]["type"] == DONE
        topic.wake()
        self._release(topic)

    # --- the reading side -----------------------------------------------------------
    def published(self, message_id: str) -> int | None:
        """The newest seq the generation of ``message_id`` in this process has published
        (the seq before its segment's first while it has published nothing), which every
        event it wrote to the log reaches once the log confirmed it; None when no
        generation here publishes it."""
        topic = self.topics.get(message_id)
        if topic is None or not topic.local:
            return None
        if topic.events:
            seq: int = topic.events[-1]["seq"]
            return seq
        return (topic.first_seq or 1) - 1

    def newer_than(self, message_id: str, seq: int) -> list[Event]:
        """The events after ``seq`` this process holds now (no log read, no wait)."""
        topic = self.topics.get(message_id)
        return topic.after(seq) if topic is not None else []

    async def read(
        self,
        message_id: str,
        after: int,
        idle_timeout: float | None = None,
        *,
        settled: int = 0,
    ) -> AsyncIterator[list[Event] | None]:
        """Yield batches of events after ``after`` up to the first ``done`` after
        ``settled``, which ends the last batch (``events.up_to_done``).

        ``settled``: the seq the message's earlier segments end at (a Continue goes on
        after them), so a reader from before it reads past their ``done`` events to the
        end of the segment streaming now. Yields ``None`` when nothing arrived for
        ``idle_timeout`` seconds, so transports can send keep-alives without a timer of
        their own.
        """
        topic = self._topic(message_id)
        reader = next(self._ids)
        topic.cursors[reader] = after
        cursor = after
        idle = _IdleClock(idle_timeout) if idle_timeout is not None else None
        try:
            while True:
                # Behind what the topic holds: read back from the log first.
                batch = [] if topic.covers(cursor) else await self._read_back(topic, cursor)
                if not batch:
                    batch = topic.after(cursor)
                if batch:
                    batch, ended = up_to_done(batch, settled)
                    cursor = batch[-1]["seq"]
                    topic.cursors[reader] = cursor
                    if idle is not None:
                        idle.active()
                    yield batch
                    if ended:
                        return
                    continue
                if topic.ended and topic.events and settled < topic.events[-1]["seq"] <= cursor:
                    return
                if not topic.local:
                    self._ensure_follower(topic, cursor)
                waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
                topic.waiters.append(waiter)
                if idle is None:
                    await waiter
                    continue
                idle.waiter = waiter
                try:
                    keep_alive = await waiter
                finally:
                    idle.waiter = None
                if keep_alive:
                    with contextlib.suppress(ValueError):
                        topic.waiters.remove(waiter)  # nothing was published: still listed
                    idle.active()
                    yield None
        finally:
            if idle is not None:
                idle.stop()
            topic.cursors.pop(reader, None)
            self._release(topic)

    async def _read_back(self, topic: Topic, cursor: int) -> list[Event]:
        """The log's events after ``cursor``. While the log cannot be read (Redis down), a
        reader from the start of a generation of this process is given what the topic
        holds instead: everything after what the database stores, so the reader's
        subscription bridges the gap from the database's copy and the reader waits with
        the generation, as one that attached before the outage does. Any other reader
        fails, and resumes from its cursor once the log answers."""
        try:
            return await self.log.read(topic.message_id, cursor, limit=self.max_events)
        except Exception:
            if not (topic.local and cursor == 0):
                raise
            log.warning("the event log is unreachable: a new reader starts from the database")
            return []

    def _ensure_follower(self, topic: Topic, cursor: int) -> None:
        if topic.local or (topic.follower is not None and not topic.follower.done()):
            return
        if topic.events and topic.events[-1]["seq"] > cursor:
            cursor = topic.events[-1]["seq"]
        topic.ended = False
        if not topic.events:
            topic.first_seq = cursor + 1
        topic.follower = asyncio.create_task(self._follow(topic, cursor))

    async def _follow(self, topic: Topic, cursor: int) -> None:
        try:
            async for batch in self.log.follow(topic.message_id, cursor):
                topic.publish(batch)
        finally:
            topic.follower = None
            if not topic.local:
                topic.ended = True
                topic.wake()

    def _release(self, topic: Topic) -> None:
        """Drop a topic nobody needs any more (no local generation, no reader)."""
        if topic.local or topic.cursors:
            return
        if topic.follower is not None and not topic.follower.done():
            topic.follower.cancel()
        if self.topics.get(topic.message_id) is topic:
            del self.topics[topic.message_id]
