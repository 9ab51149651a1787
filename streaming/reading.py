"""The read service: one reader of one message's events, the part every transport shares.

A ``Subscription`` replays what the reader missed, follows live, merges everything new
since the last write into one frame (merge-on-read), paces writes to one per
``MIN_WRITE_INTERVAL`` (``Pacing``), pauses while the connection's send buffer is over
``SEND_BUFFER_LIMIT`` and gives up on a client that stays over it for
``SLOW_CONSUMER_TIMEOUT`` (``SlowConsumer``: the transport closes, the client resumes from
its cursor). It holds a cursor, never a queue, so per-reader memory does not grow with
what the reader has not read yet. ``wait_until_ended`` is the other reader: it only
waits for a message's end. Both read through the hub's and the log's public API.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from streaming import database, events, metrics
from streaming.conf import streaming_settings
from streaming.errors import InvalidCursor
from streaming.hub import Hub
from streaming.models import Message, Segment
from streaming.presence import Presence
from streaming.streamlog import StreamLog, deleted_done
from streaming.termination import FINAL_STATUSES, Status

# How often a paused reader re-checks the send buffer.
DRAIN_POLL = 0.05
# How long a reader of a just-finished message waits for its `done` to reach the log.
FINAL_DONE_WAIT = 2.0


# Frames a reader may write back to back before pacing holds one back (``Pacing``).
FRAME_BURST = 2


class Pacing:
    """When a reader's next frame may go: one per ``interval`` on average, up to
    ``burst`` back to back (the generic cell rate algorithm of ATM networks, as a
    rate limiter).

    A generation's tokens reach a reader with jitter (a log round trip, the loop's other
    work), so a stream at about one event per interval brings some of them early: with
    writes simply spaced by the interval, such a token waited for the rest of it, up to
    a whole interval of latency and a timer, and nothing was merged into its frame. The
    burst absorbs that jitter; a stream that stays faster than the interval still gets
    one frame per interval, each merging what came meanwhile."""

    __slots__ = ("burst_span", "interval", "next_at")

    def __init__(self, interval: float, burst: int = FRAME_BURST) -> None:
        self.interval = interval
        self.burst_span = (burst - 1) * interval
        # When the next frame would be due if every frame went at the average rate.
        self.next_at = float("-inf")

    def delay(self, now: float) -> float:
        """How long a frame ready at ``now`` waits (0: it goes at once)."""
        return max(0.0, self.next_at - self.burst_span - now)

    def wrote(self, now: float) -> None:
        """A frame went at ``now``."""
        self.next_at = max(self.next_at, now) + self.interval


# What may pad a text cursor (HTTP's optional whitespace around a header's value); not
# str.strip's whitespace, which would take NBSP or \x1c before a number too.
PADDING = " \t"
# A cursor is a seq: below 10**18, so it fits every store's integer and every client's.
MAX_CURSOR_DIGITS = 18


def parse_cursor(value: Any, name: str, *, text: bool) -> int:
    """A reader's cursor from ``value``: decimal digits when ``text`` (a header, a query
    parameter), a JSON integer otherwise; ``InvalidCursor`` naming ``name`` if it is not a
    non-negative integer of at most ``MAX_CURSOR_DIGITS`` digits."""
    if text and isinstance(value, str):
        raw = value.strip(PADDING)
        if raw.isascii() and raw.isdigit() and len(raw) <= MAX_CURSOR_DIGITS:
            return int(raw)
    elif (
        not text
        and isinstance(value, int)
        and not isinstance(value, bool)
        and 0 <= value < 10**MAX_CURSOR_DIGITS
    ):
        return value
    raise InvalidCursor("must be a non-negative integer event id", field=name)


class SlowConsumer(Exception):
    """The client did not read for too long; close and let it resume."""


class SendBuffer(Protocol):
    """The connection's unsent bytes in the server (``None`` when it cannot be known)."""

    def pending(self) -> int | None: ...


async def drained(probe: SendBuffer | None, deadline: float | None = None) -> bool:
    """Return once the connection may be written to: at once while its unsent bytes are
    at most ``SEND_BUFFER_LIMIT`` (or cannot be known), else once they are back to half
    of it, so a client that does not read is written no more. False when the
    ``time.monotonic()`` ``deadline`` passed first (None: no deadline)."""
    if probe is None:
        return True
    limit = streaming_settings.SEND_BUFFER_LIMIT
    pending = probe.pending()
    if pending is None or pending <= limit:
        return True
    while (pending := probe.pending()) is not None and pending > limit // 2:
        if deadline is not None and time.monotonic() > deadline:
            return False
        await asyncio.sleep(DRAIN_POLL)
    return True


@dataclass(slots=True)
class MessageState:
    """What the reader needs to know about the message before it subscribes.

    Not its content: a reader holds it for as long as it is connected, and an answer can
    be megabytes. The stored text is read only where a reader needs it (a snapshot, a gap
    in the log)."""

    id: str
    status: str
    last_seq: int
    termination: dict[str, Any]

    # The columns ``of`` reads: what a lookup for a reader loads (``Message.only``).
    FIELDS = ("id", "status", "last_seq", "termination")

    @classmethod
    def of(cls, message: Any) -> MessageState:
        """From a ``Message`` row (as read, or as just created)."""
        return cls(
            id=str(message.id),
            status=message.status,
            last_seq=message.last_seq,
            termination=message.termination,
        )

    @classmethod
    def streaming(cls, message_id: str, settled: int) -> MessageState:
        """A message whose generation streams in this process, as its record reads until
        it ends: ``settled``, the seq its earlier segments end at (where a Continue's
        segment starts), which this segment's ``done`` is after."""
        return cls(id=message_id, status=Status.STREAMING.value, last_seq=settled, termination={})

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES


def has_more(state: MessageState, after: int) -> bool:
    """False when a reader at ``after`` has already seen the end of a finished message."""
    return not (state.final and after >= state.last_seq)


def snapshot(
    state: MessageState,
    after: int,
    content: str,
    reasoning: str = "",
    tool_calls: Sequence[dict[str, Any]] = (),
    model: str = "",
) -> list[events.Event]:
    """Events rebuilt from the database when the log of a finished message expired: for
    a reader from the beginning, everything its record holds (``content``,
    ``reasoning``, ``tool_calls`` in OpenAI's shape, the ``model`` that wrote it), as the
    log would have given it; a reader resuming mid-way is told the log is gone."""
    seq = state.last_seq
    if after > 0:
        return [
            events.error(
                seq - 1,
                message="the event log of this message expired; fetch the message instead",
                type="ResumeUnavailable",
                code="resume_unavailable",
            ),
            events.done(seq, segment=-1, termination=state.termination),
        ]
    # The calls come last, as a model makes them after its text; each takes a seq of the
    # log's (every call had one piece at least there, so they fit below the `done`).
    calls = [
        events.tool_call(
            0,
            index=index,
            id=call.get("id", ""),
            name=call.get("function", {}).get("name", ""),
            arguments=call.get("function", {}).get("arguments", ""),
        )
        for index, call in enumerate(tool_calls)
    ]
    texts = stored_texts(content, reasoning, seq - 1 - len(calls))
    for offset, call in enumerate(calls):
        call["seq"] = seq - len(calls) + offset
    body = [*texts, *calls]
    first = body[0]["seq"] if body else seq
    start = events.start(max(first - 1, 0), message_id=state.id, segment=0, model=model)
    return [start, *body, events.done(seq, segment=-1, termination=state.termination)]


def stored_texts(content: str, reasoning: str, last_seq: int) -> list[events.Event]:
    """A message's stored reasoning and text as the events that end at ``last_seq``: the
    whole of each in one event (reasoning first, as a model writes it)."""
    texts = []
    if reasoning:
        texts.append(events.reasoning(0, reasoning))
    if content:
        texts.append(events.delta(0, content))
    for offset, event in enumerate(texts):
        event["seq"] = last_seq - len(texts) + 1 + offset
    return texts


class Subscription:
    def __init__(
        self,
        hub: Hub,
        log: StreamLog,
        presence: Presence,
        state: MessageState,
        after: int,
        transport: str,
        send_buffer: SendBuffer | None = None,
    ) -> None:
        self.hub = hub
        self.log = log
        self.presence = presence
        self.state = state
        self.cursor = after
        self.transport = transport
        self.send_buffer = send_buffer
        self.metrics = metrics.for_transport(transport)
        self.accepted_at = time.monotonic()
        # Only a fresh reader of a running generation measures time to first token: a
        # resume has seen tokens already, and a finished message is history, not a wait.
        self.first_delta_written = after > 0 or state.final
        self.first_reasoning_written = self.first_delta_written
        self.last_delta_at: float | None = None
        self.ended_status: str | None = None
        # A `done` after this seq ends the stream; the ones at or below it end earlier
        # segments. A streaming message's stored seq covers its earlier segments (a
        # Continue starts after it) and never its current segment's `done` (the record
        # turns final with it); a finished message ends with its last `done`.
        self.ends_after = state.last_seq - 1 if state.final else state.last_seq
        # This reader's count in presence while it is attached (``attach``'s answer), one
        # taken over from the reader it replaces, and whether it was handed on in turn.
        self.attached: bool | None = None
        self.taken: bool | None = None
        self.handed_over = False
        # Whether this reader was ever counted in presence (its leaving then told it).
        self.counted = False

    def take_over(self, previous: Subscription) -> None:
        """Count as ``previous``'s reader from now (one socket subscribing again to the
        same message): ``previous`` will not detach, nor this one attach. The count fell
        to none between the two, and with no grace for a reader to come back (a grace of
        0) the answer ended ``abandoned`` under the reader asking for it again. Call
        before cancelling ``previous``, and ``release`` this one if it will not run."""
        if previous.attached is not None and not previous.handed_over:
            previous.handed_over = True
            self.taken = previous.attached

    async def release(self) -> None:
        """Give up a count taken over and not yet used (this reader will not run)."""
        if self.taken is not None:
            taken, self.taken = self.taken, None
            await self.presence.detach(self.state.id, shared=taken)

    async def frames(self, ping_interval: float | None) -> AsyncIterator[list[events.Event] | None]:
        """Merged batches to write, or ``None`` when a keep-alive is due."""
        message_id = self.state.id
        resumed = self.cursor > 0
        recorded = self.metrics
        if resumed:
            recorded.resumes.inc()
        try:
            beyond = await self._beyond_the_end()
        except BaseException:
            await self.release()
            raise
        if self.taken is not None:
            shared, self.taken = self.taken, None
        else:
            shared = await self.presence.attach(message_id, live=not self.state.final)
        self.attached = shared
        self.counted = True
        recorded.streams_active.inc()
        replaying = resumed
        try:
            source: AsyncIterator[list[events.Event] | None]
            if self.state.final:
                source = self._finished()
            else:
                idle = ping_interval or streaming_settings.PING_INTERVAL
                source = self.hub.read(
                    message_id, self.cursor, idle_timeout=idle, settled=self.ends_after
                )
            pacing = Pacing(streaming_settings.MIN_WRITE_INTERVAL)
            async for batch in source:
                if batch is None:
                    unheard = await self._ended_unheard()
                    if unheard is None:
                        if ping_interval:
                            yield None
                        continue
                    batch = unheard
                if beyond:
                    continue  # nothing from past a cursor no reader was given; then closed
                batch = [e for e in batch if e["seq"] > self.cursor]
                if not batch:
                    continue
                batch, _ = events.up_to_done(batch, self.ends_after)
                if batch[0]["seq"] > self.cursor + 1 and not _says_missing(batch[0]):
                    batch = await self._bridge(batch)
                # Merged before waiting on the client: a reader that stops reading holds
                # one frame, not the events it was made of.
                merged = events.merge(batch)
                del batch
                await self._wait_for_client()
                wait = pacing.delay(time.monotonic())
                if wait > 0 and merged[-1]["type"] == events.DELTA:
                    await asyncio.sleep(wait)
                    # More may have arrived meanwhile: it goes out in this same frame.
                    newer = self.hub.newer_than(message_id, merged[-1]["seq"])
                    if newer:
                        newer, _ = events.up_to_done(newer, self.ends_after)
                        merged = events.merge(merged + newer)
                delivered = _delta_events(merged, self.cursor)
                if replaying:
                    recorded.events_replayed.inc(merged[-1]["seq"] - self.cursor)
                    replaying = False
                recorded.tokens_delivered.inc(delivered)
                self.cursor = merged[-1]["seq"]
                self._observe(merged)
                pacing.wrote(time.monotonic())
                yield merged
                if self._ends(merged[-1]):
                    self.ended_status = merged[-1].get("status")
                    return
        finally:
            recorded.streams_active.dec()
            metrics.STREAM_ENDS.labels(
                transport=self.transport, status=self.ended_status or "disconnected"
            ).inc()
            ended = self.ended_status is not None
            self.attached = None
            if not self.handed_over:
                await self.presence.detach(message_id, shared=shared, ended=ended)

    async def _ended_unheard(self) -> list[events.Event] | None:
        """The end of an answer whose ``done`` did not come, as its record tells it,
        asked when nothing came for a while; None while the record says it streams.

        The record is written before the ``done`` is appended, and a ``done`` can fail to
        reach the log after it: its process killed in between, Redis away for longer than
        appends are held, or a log restarted empty under a reader holding seqs past the
        one the reaper's ``done`` took. A reader that only followed the log waited for
        ever (its keep-alives kept the connection, so it never reconnected to be told).
        Its ``done`` is the record's, after whatever this reader was sent."""
        try:
            record = await database.run(_record, self.state.id)
        except Exception:
            return None  # the database cannot say now: keep following the log
        if record is None:
            return [deleted_done(self.cursor)]
        status, last_seq, termination = record
        if status not in FINAL_STATUSES:
            return None
        return [events.done(max(last_seq, self.cursor + 1), segment=-1, termination=termination)]

    async def _beyond_the_end(self) -> bool:
        """Whether a live message's cursor is past every event it has: a seq no reader
        was given (another message's, or made up). Followed, it would skip what lies in
        between once the answer got there, with nothing to say so; such a reader gets
        nothing and its stream closes when the answer ends (the reconnect then gets its
        end, as one past a finished message's). Every event a reader was given is in
        the log first (the outbox publishes after the append), or still in this
        process's topic. A log that holds nothing is no word of its own (Redis restarted
        empty, or the answer's first append is still on its way): then a generation in
        this process says how far it has got, and elsewhere the cursor is taken as is."""
        if self.state.final or self.cursor <= self.state.last_seq:
            return False
        if self.hub.newer_than(self.state.id, self.cursor - 1):
            return False
        try:
            newest = await self.log.last_seq(self.state.id)
        except Exception:
            return False  # the log cannot say now (Redis away): read as before
        if newest == 0:
            # A reader asking right after the post, on the process that was asked, came
            # before the `start` reached the log, and was given what came after its
            # made-up cursor with the events before it silently missing.
            published = self.hub.published(self.state.id)
            return published is not None and published < self.cursor
        return newest < self.cursor

    async def _bridge(self, batch: list[events.Event]) -> list[events.Event]:
        """The log does not go back to the reader's cursor (Redis lost data, or a finished
        segment's log expired before a Continue): seqs are contiguous, so the events in
        between are gone from the log. The database's copy covers them when it reaches
        that far and the reader starts from the beginning (its text is the message's
        whole content); otherwise the reader is told plainly that text is missing."""
        first = batch[0]["seq"]
        if self.cursor == 0:
            stored = await database.run(_persisted, self.state.id)
            if stored is None:
                return [deleted_done(self.cursor)]
            content, reasoning, last_seq, tool_calls, model = stored
            if self.state.final:
                return snapshot(self.state, 0, content, reasoning, tool_calls, model)
            texts = stored_texts(content, reasoning, last_seq)
            if last_seq >= first - 1 and texts and texts[0]["seq"] >= 2:
                start = events.start(1, message_id=self.state.id, segment=0, model="")
                return [start, *texts] + [e for e in batch if e["seq"] > last_seq]
        gap = events.error(
            first - 1,
            message=f"events {self.cursor + 1}-{first - 1} of this answer are gone from the "
            "event log, so text is missing here; fetch the message for its stored text",
            type="ResumeGap",
            code="resume_gap",
        )
        return [gap, *batch]

    async def _finished(self) -> AsyncIterator[list[events.Event] | None]:
        """Replay a finished message from its log a page at a time, so a long answer is
        never loaded whole and every page goes through the send-buffer bound like live
        events (a page of ``LOG_READ_EVENTS`` events also bounds a merged frame)."""
        log = self.log
        page = streaming_settings.LOG_READ_EVENTS
        message_id = self.state.id
        logged = await log.read(message_id, self.cursor, limit=page)
        if not logged:
            if has_more(self.state, self.cursor):
                record: tuple[Any, ...] = ("", "", 0, [], "")
                if self.cursor == 0:
                    stored = await database.run(_persisted, message_id)
                    if stored is None:
                        yield [deleted_done(self.cursor)]
                        return
                    record = stored
                content, reasoning, _, tool_calls, model = record
                yield snapshot(self.state, self.cursor, content, reasoning, tool_calls, model)
            return
        cursor = self.cursor
        # The record is committed before its `done` is appended, so a reader can find the
        # record final and the log one event short: wait briefly for the `done`, then take
        # the record's word for how the message ended.
        deadline: float | None = None
        while True:
            if logged:
                cursor = logged[-1]["seq"]
                ended, full = self._ends(logged[-1]), len(logged) == page
                # Handed over from a one-slot holder, so this suspended generator keeps no
                # reference to the page while the reader waits on its client.
                holder, logged = [logged], []
                yield holder.pop()
                if ended:
                    return
                if full:
                    logged = await log.read(message_id, cursor, limit=page)
                    continue
            now = time.monotonic()
            deadline = now + FINAL_DONE_WAIT if deadline is None else deadline
            if now > deadline:
                yield [
                    events.done(self.state.last_seq, segment=-1, termination=self.state.termination)
                ]
                return
            await asyncio.sleep(DRAIN_POLL)
            logged = await log.read(message_id, cursor, limit=page)

    def _ends(self, event: events.Event) -> bool:
        """Whether ``event`` ends this reader's stream: the ``done`` of the segment
        streaming when it subscribed, or a finished message's last, never an earlier
        segment's."""
        return event["type"] == events.DONE and int(event["seq"]) > self.ends_after

    async def _wait_for_client(self) -> None:
        deadline = time.monotonic() + streaming_settings.SLOW_CONSUMER_TIMEOUT
        if not await drained(self.send_buffer, deadline):
            self.metrics.slow_consumer_closes.inc()
            self.ended_status = "slow_consumer"
            raise SlowConsumer(
                f"over {streaming_settings.SEND_BUFFER_LIMIT} bytes unread for too long"
            )

    def _observe(self, merged: list[events.Event]) -> None:
        now = time.monotonic()
        recorded = self.metrics
        for event in merged:
            kind = event["type"]
            if kind not in events.TEXT_TYPES:
                continue
            if kind == events.REASONING and not self.first_reasoning_written:
                self.first_reasoning_written = True
                recorded.reasoning_ttft.observe(now - self.accepted_at)
            elif kind == events.DELTA and not self.first_delta_written:
                self.first_delta_written = True
                recorded.ttft.observe(now - self.accepted_at)
            elif self.last_delta_at is not None:
                recorded.write_gap.observe(now - self.last_delta_at)
            self.last_delta_at = now
        recorded.frames_written.inc()


def _delta_events(merged: list[events.Event], cursor: int) -> int:
    """How many of the log's delta events a merged frame after ``cursor`` carries: seqs
    are contiguous, so a merged delta stands for every seq since the event before it."""
    count, previous = 0, cursor
    for event in merged:
        if event["type"] == events.DELTA:
            count += event["seq"] - previous
        previous = event["seq"]
    return count


# The error codes of events that already tell a reader its text is incomplete.
MISSING_CODES = ("resume_unavailable", "resume_gap")


def _says_missing(event: events.Event) -> bool:
    return event["type"] == events.ERROR and event["error"].get("code") in MISSING_CODES


def _columns(message_id: str, *names: str) -> tuple[Any, ...] | None:
    """The message's ``names`` columns; None once it is deleted (with its conversation,
    after a reader read it)."""
    return next(iter(Message.objects.values_list(*names).filter(id=message_id)), None)


def _record(message_id: str) -> tuple[Any, ...] | None:
    """The message's status, last seq and termination record."""
    return _columns(message_id, "status", "last_seq", "termination")


def _persisted(message_id: str) -> tuple[Any, ...] | None:
    """The message's stored text and reasoning, and the seq they reach (written together,
    write-behind); then its tool calls and model, which only a finished message's record
    holds whole (a replay from the record gives them)."""
    return _columns(message_id, "content", "reasoning", "last_seq", "tool_calls", "model")


async def wait_until_ended(
    hub: Hub,
    message_id: str,
    limit: float | None,
    finished: asyncio.Event | None = None,
    segment: int | None = None,
) -> None:
    """Return when the message's current segment has ended, or after ``limit`` seconds.
    ``segment``: when that segment has ended (a later one's start says so too): a Stop's
    caller waits for the end of what it stopped, not of a Continue started meanwhile.

    ``finished``: the local generation's event, when it runs in this process (of
    ``segment``); otherwise the message's log is followed until its next ``done`` (the
    generating process may be remote), which is ``segment``'s while the record shows
    that segment the latest."""
    if finished is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(finished.wait(), limit)
        return
    last, status, latest = await database.run(_position, message_id, segment is not None)
    if status != Status.STREAMING or (segment is not None and latest > segment):
        return
    try:
        async with asyncio.timeout(limit):
            async for batch in hub.read(message_id, last):
                if batch and batch[-1]["type"] == events.DONE:
                    return
    except TimeoutError:
        return


def _position(message_id: str, of_segments: bool) -> tuple[int, str, int]:
    """The message's last seq, its status and (``of_segments``) its latest segment's
    index (else -1)."""
    last, status = Message.objects.values_list("last_seq", "status").get(id=message_id)
    latest = -1
    if of_segments:
        indexes = Segment.objects.filter(message_id=message_id).values_list("index", flat=True)
        latest = max(indexes, default=-1)
    return last, status, latest
