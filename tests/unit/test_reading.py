"""The read service: cursors, the end of a finished message, and one reader's frames over
the hub and the in-memory log (replay, merge, end, presence, slow consumers)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from django.test import override_settings
from prometheus_client import REGISTRY

from streaming import database, events
from streaming.control.memory import MemoryControl
from streaming.errors import InvalidCursor, describe
from streaming.hub import Hub
from streaming.models import Message
from streaming.presence.memory import MemoryPresence
from streaming.reading import (
    FRAME_BURST,
    MAX_CURSOR_DIGITS,
    MessageState,
    Pacing,
    SlowConsumer,
    Subscription,
    has_more,
    parse_cursor,
    snapshot,
    wait_until_ended,
)
from streaming.registry import Generations
from streaming.streamlog import deleted_done
from streaming.streamlog.memory import MemoryStreamLog
from streaming.termination import Status
from tests.unit.scripted import add_segment, create_answer

HANG = 10.0
TRANSPORT = "sse"
ENDED = {"status": Status.COMPLETE.value, "finish_reason": "stop"}


# --- cursors --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "cursor"),
    [("0", 0), ("42", 42), (" 7 ", 7), ("0007", 7), ("9" * MAX_CURSOR_DIGITS, 10**18 - 1)],
)
def test_a_text_cursor_is_decimal_digits(raw: str, cursor: int) -> None:
    assert parse_cursor(raw, "Last-Event-ID", text=True) == cursor


@pytest.mark.parametrize(
    "raw",
    [
        "",
        " ",
        "\xa05",
        "5\x1c",
        "\x0b5",
        "-1",
        "+1",
        "1.5",
        "1e3",
        "abc",
        "0x10",
        "١٢",
        "9" * (MAX_CURSOR_DIGITS + 1),
        5,
    ],
)
def test_a_text_cursor_that_is_not_digits_is_refused(raw: Any) -> None:
    with pytest.raises(InvalidCursor) as refused:
        parse_cursor(raw, "Last-Event-ID", text=True)
    assert refused.value.field == "Last-Event-ID"
    assert describe(refused.value)["message"].startswith("Last-Event-ID: ")


@pytest.mark.parametrize("raw", [0, 1, 10**MAX_CURSOR_DIGITS - 1])
def test_a_json_cursor_is_a_non_negative_integer(raw: int) -> None:
    assert parse_cursor(raw, "after", text=False) == raw


@pytest.mark.parametrize("raw", [-1, 10**MAX_CURSOR_DIGITS, True, False, 1.0, "5", None, [1]])
def test_a_json_cursor_of_another_kind_is_refused(raw: Any) -> None:
    with pytest.raises(InvalidCursor) as refused:
        parse_cursor(raw, "after", text=False)
    assert refused.value.field == "after"
    assert refused.value.code == "invalid_cursor"


# --- the end of a finished message ------------------------------------------------------------
def state(
    status: str = Status.STREAMING.value,
    last_seq: int = 0,
    termination: dict[str, Any] | None = None,
) -> MessageState:
    return MessageState(
        id=str(uuid.uuid4()),
        status=status,
        last_seq=last_seq,
        termination=termination if termination is not None else {},
    )


async def stored(
    status: str, last_seq: int, content: str, termination: dict[str, Any]
) -> MessageState:
    """A message row holding ``content`` (what a reader reads back when the log is gone),
    and the state a reader of it starts from."""
    answer = await create_answer("tests:reading:stored", content=content, last_seq=last_seq)
    finished = state(status, last_seq=last_seq, termination=termination)
    finished.id = answer.message_id
    return finished


def test_only_a_finished_message_read_to_its_end_has_nothing_more() -> None:
    finished = state(Status.COMPLETE.value, last_seq=10)
    assert not has_more(finished, 10)
    assert not has_more(finished, 11)
    assert has_more(finished, 9)
    assert has_more(finished, 0)
    assert has_more(state(Status.STREAMING.value, last_seq=10), 10), "it may stream on"
    assert not has_more(state(Status.INTERRUPTED.value, last_seq=3), 3)


def test_a_snapshot_rebuilds_the_answer_from_the_record() -> None:
    finished = state(Status.COMPLETE.value, last_seq=9, termination=ENDED)
    assert snapshot(finished, 0, "Hello") == [
        events.start(7, message_id=finished.id, segment=0, model=""),
        events.delta(8, "Hello"),
        events.done(9, segment=-1, termination=ENDED),
    ]
    empty = state(Status.ERROR.value, last_seq=3, termination={"status": "error"})
    assert [e["type"] for e in snapshot(empty, 0, "")] == [events.START, events.DONE]


def test_a_snapshot_gives_every_part_of_the_record_as_the_log_did() -> None:
    """Reasoning, text and each tool call (whole, by its index in the record), under
    the model that wrote them: a replay from the record lost the calls (a `done` saying
    `tool_calls` with none before it) and the model."""
    ended = {**ENDED, "finish_reason": "tool_calls"}
    finished = state(Status.COMPLETE.value, last_seq=12, termination=ended)
    calls = [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
        {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    ]
    assert snapshot(finished, 0, "Hi", "think", calls, "m") == [
        events.start(7, message_id=finished.id, segment=0, model="m"),
        events.reasoning(8, "think"),
        events.delta(9, "Hi"),
        events.tool_call(10, index=0, id="call_1", name="f", arguments='{"a":1}'),
        events.tool_call(11, index=1, id="call_2", name="g", arguments="{}"),
        events.done(12, segment=-1, termination=ended),
    ]
    rebuilt = events.ToolCalls()
    for event in snapshot(finished, 0, "", "", calls):
        if event["type"] == events.TOOL_CALL:
            rebuilt.add(event)
    assert rebuilt.as_list() == calls


def test_a_snapshot_for_a_resume_says_the_log_expired() -> None:
    finished = state(Status.COMPLETE.value, last_seq=9, termination=ENDED)
    error, done = snapshot(finished, 4, "")
    assert (error["seq"], error["type"], error["error"]["code"]) == (
        8,
        events.ERROR,
        "resume_unavailable",
    )
    assert done == events.done(9, segment=-1, termination=ENDED)


# --- a subscription ---------------------------------------------------------------------------
class Parts:
    """The reading side of one process: the log, the hub and presence."""

    def __init__(self) -> None:
        self.log = MemoryStreamLog()
        self.hub = Hub(self.log)
        self.presence = MemoryPresence(
            worker_id="tests:reading:1", listener=Generations(MemoryControl())
        )

    def subscribe(self, message: MessageState, after: int, send_buffer: Any = None) -> Subscription:
        return Subscription(
            self.hub, self.log, self.presence, message, after, TRANSPORT, send_buffer
        )

    def attaches(self) -> asyncio.Event:
        """An event set each time a reader has attached (and so read where the answer is):
        what a test awaits before it moves the answer on."""
        attached = asyncio.Event()
        attach = self.presence.attach

        async def attaching(*args: Any, **kwargs: Any) -> Any:
            shared = await attach(*args, **kwargs)
            attached.set()
            return shared

        self.presence.attach = attaching  # type: ignore[method-assign]
        return attached


@pytest.fixture
def parts() -> Iterator[Parts]:
    # No write spacing: which events share a frame then depends only on what had arrived.
    with override_settings(STREAMING={"MIN_WRITE_INTERVAL": 0}):
        yield Parts()


async def frames_of(
    subscription: Subscription, ping_interval: float | None = None
) -> list[list[events.Event]]:
    """The frames a reader is given, keep-alives left out."""
    got: list[list[events.Event]] = []
    async for frame in subscription.frames(ping_interval):
        if frame is not None:
            got.append(frame)
    return got


def opening(message_id: str) -> list[events.Event]:
    return [
        events.start(1, message_id=message_id, segment=0, model="m"),
        events.delta(2, "a"),
        events.delta(3, "b"),
        events.delta(4, "c"),
    ]


async def test_a_reader_replays_from_its_cursor_merges_and_ends_at_done(parts: Parts) -> None:
    message = state()
    mid = message.id
    await parts.log.append(mid, opening(mid))
    subscription = parts.subscribe(message, 2)
    frames = subscription.frames(None)

    assert await anext(frames) == [events.delta(4, "bc")], "what was missed, in one frame"
    assert await parts.presence.count(mid) == 1
    assert not parts.presence.idle.is_set()
    waiting = asyncio.ensure_future(anext(frames))
    await parts.log.append(mid, [events.delta(5, "d")])
    await parts.log.append(mid, [events.delta(6, "e"), events.delta(7, "f")])
    assert await asyncio.wait_for(waiting, HANG) == [events.delta(7, "def")]
    done = events.done(8, segment=0, termination=ENDED)
    await parts.log.append(mid, [done])
    assert await asyncio.wait_for(anext(frames), HANG) == [done]
    with pytest.raises(StopAsyncIteration):
        await anext(frames)
    assert subscription.cursor == 8
    assert subscription.ended_status == Status.COMPLETE
    assert await parts.presence.count(mid) == 0
    assert parts.presence.idle.is_set()


async def test_a_cursor_past_every_event_of_a_live_answer_gets_nothing_of_it(
    parts: Parts,
) -> None:
    """A seq no reader was given (another message's, made up) would skip what lies in
    between once the answer got past it: the reader gets nothing, and its stream ends
    with the answer (its reconnect then finds the message finished)."""
    message = state()
    mid = message.id
    await parts.log.append(mid, opening(mid))
    attached = parts.attaches()
    reading = asyncio.create_task(frames_of(parts.subscribe(message, 6)))
    await asyncio.wait_for(attached.wait(), HANG)
    await parts.log.append(mid, [events.delta(5, "d"), events.delta(6, "e")])
    await parts.log.append(mid, [events.delta(7, "f"), events.delta(8, "g")])
    await parts.log.append(mid, [events.done(9, segment=0, termination=ENDED)])
    assert await asyncio.wait_for(reading, HANG) == []

    # A cursor the answer has reached is followed as ever, from the log or this process.
    later = state()
    await parts.log.append(later.id, opening(later.id))
    following = asyncio.create_task(frames_of(parts.subscribe(later, 4)))
    done = events.done(5, segment=0, termination=ENDED)
    await parts.log.append(later.id, [done])
    assert await asyncio.wait_for(following, HANG) == [[done]]


async def test_a_cursor_past_a_local_answer_that_has_not_reached_the_log_gets_nothing(
    parts: Parts,
) -> None:
    """Asked for right after the post, in the process generating it, before its `start`
    reached the log: the log holds nothing, which says nothing, but the generation here
    knows it has published nothing past the cursor. The reader was given every event
    after it, the ones before it silently missing."""
    attached = parts.attaches()

    async def read_local(published: int, after: int) -> list[list[events.Event]]:
        """A reader from ``after`` of an answer generated here that has published its
        first ``published`` events (none of them in the log yet), while the answer goes
        on to its end."""
        message = state()
        mid = message.id
        parts.hub.open_local(mid, 1)
        parts.hub.publish(mid, opening(mid)[:published])
        attached.clear()
        reading = asyncio.create_task(frames_of(parts.subscribe(message, after)))
        await asyncio.wait_for(attached.wait(), HANG)
        rest = opening(mid)[published:]
        rest += [events.delta(5, "d"), events.done(6, segment=0, termination=ENDED)]
        await parts.log.append(mid, [*opening(mid)[:published], *rest])
        parts.hub.publish(mid, rest)
        parts.hub.close_local(mid)
        return await asyncio.wait_for(reading, HANG)

    assert await read_local(0, 3) == []
    # A cursor the answer here has published is followed, though the log holds nothing
    # (restarted empty: the generation puts its events back).
    frames = await read_local(3, 2)
    assert "".join(e.get("text", "") for frame in frames for e in frame) == "bcd"
    assert frames[-1][-1]["type"] == events.DONE


async def test_a_frame_keeps_the_order_of_events_it_merges(parts: Parts) -> None:
    message = state()
    mid = message.id
    failure = events.error(5, message="boom", type="EngineError", code=502)
    done = events.done(6, segment=0, termination={"status": Status.ERROR.value})
    await parts.log.append(mid, [*opening(mid), failure, done])
    assert await frames_of(parts.subscribe(message, 0)) == [
        [opening(mid)[0], events.delta(4, "abc"), failure, done]
    ]


@pytest.mark.django_db(transaction=True)
async def test_a_finished_message_whose_log_is_gone_is_read_from_its_record(
    parts: Parts,
) -> None:
    finished = await stored(Status.COMPLETE.value, 9, "Hello", ENDED)
    subscription = parts.subscribe(finished, 0)
    frames = subscription.frames(None)
    assert await anext(frames) == snapshot(finished, 0, "Hello")
    assert await parts.presence.count(finished.id) == 1, "counted while it reads"
    with pytest.raises(StopAsyncIteration):
        await anext(frames)
    assert await parts.presence.count(finished.id) == 0
    assert parts.presence.idle.is_set()


@pytest.mark.django_db(transaction=True)
async def test_a_message_deleted_after_it_was_read_ends_its_reader_as_deleted(
    parts: Parts,
) -> None:
    """Its record was read as the reader subscribed; its conversation was deleted before
    its text was (no log to replay): the reader ends as the delete's followers do."""
    gone = state(Status.COMPLETE.value, last_seq=9, termination=ENDED)  # no row any more
    assert await frames_of(parts.subscribe(gone, 0)) == [[deleted_done(0)]]


async def test_a_resume_of_a_finished_message_without_its_log(parts: Parts) -> None:
    finished = state(Status.COMPLETE.value, last_seq=9, termination=ENDED)
    [frame] = await frames_of(parts.subscribe(finished, 5))
    assert [e["type"] for e in frame] == [events.ERROR, events.DONE]
    assert await frames_of(parts.subscribe(finished, 8)) == [[snapshot(finished, 8, "")[-1]]]
    assert await frames_of(parts.subscribe(finished, 9)) == [], "it has read everything"


async def test_a_finished_message_is_replayed_from_its_log(parts: Parts) -> None:
    finished = state(Status.COMPLETE.value, last_seq=5, termination=ENDED)
    done = events.done(5, segment=0, termination=ENDED)
    await parts.log.append(finished.id, [*opening(finished.id), done])
    assert await frames_of(parts.subscribe(finished, 1)) == [[events.delta(4, "abc"), done]]


async def test_a_finished_message_read_ends_at_its_done_when_a_continue_follows(
    parts: Parts,
) -> None:
    """The message was read as finished, then continued (elsewhere) before its log was
    replayed: the stream ends with the `done` it was opened for, not the next one."""
    finished = state(Status.CANCELLED.value, last_seq=5, termination=ENDED)
    mid = finished.id
    done = events.done(5, segment=0, termination=ENDED)
    after = [events.start(6, message_id=mid, segment=1, model="m"), events.delta(7, "d")]
    await parts.log.append(mid, [*opening(mid), done, *after])
    assert await frames_of(parts.subscribe(finished, 1)) == [[events.delta(4, "abc"), done]]


def delivered() -> float:
    value = REGISTRY.get_sample_value(
        "chat_stream_delta_events_delivered_total", {"transport": TRANSPORT}
    )
    return value or 0.0


async def test_a_merged_frame_counts_every_delta_event_it_carries(parts: Parts) -> None:
    finished = state(Status.COMPLETE.value, last_seq=5, termination=ENDED)
    done = events.done(5, segment=0, termination=ENDED)
    await parts.log.append(finished.id, [*opening(finished.id), done])
    before = delivered()
    with override_settings(STREAMING={"LOG_READ_EVENTS": 2}):  # pages end mid-run
        frames = await frames_of(parts.subscribe(finished, 0))
    assert "".join(e["text"] for f in frames for e in f if e["type"] == events.DELTA) == "abc"
    assert delivered() - before == 3, "three deltas in the log, however they were framed"


async def test_a_reader_of_a_local_generation_gets_its_publishes(parts: Parts) -> None:
    message = state()
    mid = message.id
    parts.hub.open_local(mid, 1)
    reading = asyncio.create_task(frames_of(parts.subscribe(message, 0)))
    for batch in ([*opening(mid)], [events.done(5, segment=0, termination=ENDED)]):
        await parts.log.append(mid, batch)
        parts.hub.publish(mid, batch)
    parts.hub.close_local(mid)
    frames = await asyncio.wait_for(reading, HANG)
    merged = events.merge([e for frame in frames for e in frame])
    assert merged == events.merge([*opening(mid), events.done(5, segment=0, termination=ENDED)])


async def test_a_reader_from_the_start_of_a_continued_answer_reads_to_the_new_end(
    parts: Parts,
) -> None:
    """The message streams its second segment; its stored seq is the first one's `done`."""
    message = state(last_seq=5)
    mid = message.id
    cut = events.done(5, segment=0, termination={"status": Status.CANCELLED.value})
    await parts.log.append(mid, [*opening(mid), cut])
    parts.hub.open_local(mid, 6)
    frames = parts.subscribe(message, 0).frames(None)
    assert await anext(frames) == [opening(mid)[0], events.delta(4, "abc"), cut]
    waiting = asyncio.ensure_future(anext(frames))
    second = [
        events.start(6, message_id=mid, segment=1, model="m"),
        events.delta(7, "d"),
        events.done(8, segment=1, termination=ENDED),
    ]
    await parts.log.append(mid, second)
    parts.hub.publish(mid, second)
    parts.hub.close_local(mid)
    assert await asyncio.wait_for(waiting, HANG) == second
    with pytest.raises(StopAsyncIteration):
        await anext(frames)


# --- slow consumers ---------------------------------------------------------------------------
class Unsent:
    """The connection's unsent bytes, as the server would report them: a script of
    readings, the last one repeated."""

    def __init__(self, *readings: int | None) -> None:
        self.readings = list(readings)

    def pending(self) -> int | None:
        if len(self.readings) > 1:
            return self.readings.pop(0)
        return self.readings[0]


def slow_closes() -> float:
    value = REGISTRY.get_sample_value("chat_slow_consumer_closes_total", {"transport": TRANSPORT})
    return value or 0.0


async def test_a_client_that_stops_reading_is_closed() -> None:
    with override_settings(STREAMING={"SEND_BUFFER_LIMIT": 1000, "SLOW_CONSUMER_TIMEOUT": 0.01}):
        parts = Parts()
        message = state()
        await parts.log.append(message.id, opening(message.id))
        subscription = parts.subscribe(message, 0, Unsent(10**6))
        before = slow_closes()
        with pytest.raises(SlowConsumer):
            await asyncio.wait_for(frames_of(subscription), HANG)
    assert subscription.ended_status == "slow_consumer"
    assert subscription.cursor == 0, "nothing was written: the client resumes from 0"
    assert slow_closes() == before + 1
    assert await parts.presence.count(message.id) == 0, "detached on the way out"


async def test_a_client_that_catches_up_keeps_reading() -> None:
    with override_settings(STREAMING={"SEND_BUFFER_LIMIT": 1000, "SLOW_CONSUMER_TIMEOUT": 60.0}):
        parts = Parts()
        message = state()
        done = events.done(5, segment=0, termination=ENDED)
        await parts.log.append(message.id, [*opening(message.id), done])
        # Over the limit, then below it but above half of it (still paused), then drained.
        unsent = Unsent(10**6, 10**6, 700, 100)
        frames = await frames_of(parts.subscribe(message, 0, unsent))
    assert frames[-1][-1] == done
    assert unsent.readings == [100]


async def test_an_unknown_send_buffer_never_pauses(parts: Parts) -> None:
    with override_settings(STREAMING={"SEND_BUFFER_LIMIT": 0, "SLOW_CONSUMER_TIMEOUT": 0}):
        message = state()
        done = events.done(5, segment=0, termination=ENDED)
        await parts.log.append(message.id, [*opening(message.id), done])
        frames = await frames_of(parts.subscribe(message, 0, Unsent(None)))
    assert frames[-1][-1] == done


# --- waiting for the end ----------------------------------------------------------------------
async def test_waiting_for_a_local_generation_ends_when_it_finishes() -> None:
    hub = Hub(MemoryStreamLog())
    finished = asyncio.Event()
    order: list[str] = []

    async def waiter() -> None:
        await wait_until_ended(hub, str(uuid.uuid4()), None, finished)
        order.append("returned")

    async def generation_ends() -> None:
        order.append("finished")
        finished.set()

    waiting = asyncio.create_task(waiter())  # runs first, and waits
    ending = asyncio.create_task(generation_ends())
    await asyncio.wait_for(asyncio.gather(waiting, ending), HANG)
    assert order == ["finished", "returned"]


async def test_waiting_for_a_local_generation_returns_after_the_limit() -> None:
    await wait_until_ended(Hub(MemoryStreamLog()), str(uuid.uuid4()), 0.01, asyncio.Event())


@pytest.fixture
async def streaming_answer() -> AsyncIterator[str]:
    answer = await create_answer("tests:reading:elsewhere", last_seq=4)
    yield answer.message_id


@pytest.mark.django_db(transaction=True)
async def test_waiting_for_a_generation_elsewhere_follows_the_log(streaming_answer: str) -> None:
    log = MemoryStreamLog()
    hub = Hub(log)
    waiting = asyncio.create_task(wait_until_ended(hub, streaming_answer, None))
    await log.append(streaming_answer, [events.delta(5, "x")])
    await log.append(streaming_answer, [events.done(6, segment=0, termination=ENDED)])
    await asyncio.wait_for(waiting, HANG)


@pytest.mark.django_db(transaction=True)
async def test_waiting_for_a_generation_elsewhere_returns_after_the_limit(
    streaming_answer: str,
) -> None:
    await asyncio.wait_for(wait_until_ended(Hub(MemoryStreamLog()), streaming_answer, 0.01), HANG)


@pytest.mark.django_db(transaction=True)
async def test_waiting_for_a_message_that_already_ended_returns_at_once() -> None:
    from streaming import database
    from streaming.models import Message

    answer = await create_answer("tests:reading:elsewhere")
    await database.run(
        lambda: Message.objects.filter(id=answer.message_id).update(status=Status.COMPLETE)
    )
    # No log, no limit: only the record can end this wait.
    await asyncio.wait_for(wait_until_ended(Hub(MemoryStreamLog()), answer.message_id, None), HANG)


@pytest.mark.django_db(transaction=True)
async def test_waiting_for_a_segment_a_continue_followed_returns_at_once() -> None:
    """The segment a Stop's caller saw streaming ended, and a Continue streams the next:
    the record says so, and the wait is for the stopped segment, not the new one."""
    answer = await create_answer("tests:reading:elsewhere", last_seq=4)
    await add_segment(answer.message_id, 1, 5, "tests:reading:elsewhere")
    hub = Hub(MemoryStreamLog())  # nothing will come: only the record can end the wait
    await asyncio.wait_for(wait_until_ended(hub, answer.message_id, None, segment=0), HANG)


@pytest.mark.django_db(transaction=True)
async def test_waiting_for_the_latest_segment_follows_the_log_to_its_done(
    streaming_answer: str,
) -> None:
    log = MemoryStreamLog()
    waiting = asyncio.create_task(wait_until_ended(Hub(log), streaming_answer, None, segment=0))
    await log.append(streaming_answer, [events.done(5, segment=0, termination=ENDED)])
    await asyncio.wait_for(waiting, HANG)


# --- a log that does not reach back to the reader ---------------------------------------------
@pytest.mark.django_db(transaction=True)
async def test_a_reader_from_the_start_gets_the_stored_text_for_what_the_log_lost(
    parts: Parts,
) -> None:
    # The database holds the text up to seq 6; the log (after a Redis restart) from seq 5.
    answer = await create_answer("tests:reading:gap", content="Hello wor", last_seq=6)
    message = state(last_seq=6)
    message.id = answer.message_id
    tail = [events.delta(5, "o wor"), events.delta(6, "ld"), events.delta(7, "!")]
    await parts.log.append(message.id, [*tail, events.done(8, segment=0, termination=ENDED)])
    got = [e for frame in await frames_of(parts.subscribe(message, 0)) for e in frame]
    assert got[0] == events.start(1, message_id=message.id, segment=0, model="")
    text = "".join(e["text"] for e in got if e["type"] == events.DELTA)
    assert text == "Hello wor!", "the stored text up to seq 6, then the log after it"
    assert [e["seq"] for e in got] == sorted({e["seq"] for e in got})
    assert got[-1]["type"] == events.DONE


@pytest.mark.django_db(transaction=True)
async def test_a_gap_the_stored_text_does_not_cover_is_said(parts: Parts) -> None:
    answer = await create_answer("tests:reading:hole", content="He", last_seq=2)
    message = state(last_seq=2)
    message.id = answer.message_id
    await parts.log.append(
        message.id, [events.delta(6, "end"), events.done(7, segment=0, termination=ENDED)]
    )
    got = [e for frame in await frames_of(parts.subscribe(message, 0)) for e in frame]
    assert got[0]["type"] == events.ERROR
    assert got[0]["error"]["code"] == "resume_gap"
    assert "1-5" in got[0]["error"]["message"]
    # A resume past the start cannot be bridged from the whole text: it is told too.
    resumed = [e for frame in await frames_of(parts.subscribe(message, 3)) for e in frame]
    assert resumed[0]["error"]["code"] == "resume_gap" and "4-5" in resumed[0]["error"]["message"]


@pytest.mark.django_db(transaction=True)
async def test_a_finished_message_whose_log_lost_its_start_is_rebuilt_from_the_record(
    parts: Parts,
) -> None:
    finished = await stored(Status.COMPLETE.value, 9, "Hello", ENDED)
    await parts.log.append(
        finished.id, [events.delta(8, "lo"), events.done(9, segment=0, termination=ENDED)]
    )
    assert await frames_of(parts.subscribe(finished, 0)) == [
        events.merge(snapshot(finished, 0, "Hello"))
    ]


async def test_a_long_finished_answer_is_replayed_page_by_page() -> None:
    """Three segments, 3,000 deltas: read 100 events at a time, merged per page, through
    the intermediate segments' ends to the last one."""
    with override_settings(STREAMING={"MIN_WRITE_INTERVAL": 0, "LOG_READ_EVENTS": 100}):
        parts = Parts()
        mid = str(uuid.uuid4())
        seq, logged = 0, []
        for segment in range(3):
            seq += 1
            logged.append(events.start(seq, message_id=mid, segment=segment, model="m"))
            for i in range(1000):
                seq += 1
                logged.append(events.delta(seq, f"{segment}.{i} "))
            seq += 1
            logged.append(events.done(seq, segment=segment, termination=ENDED))
        await parts.log.append(mid, logged)
        text = "".join(e["text"] for e in logged if e["type"] == events.DELTA)
        finished = state(Status.COMPLETE.value, last_seq=seq, termination=ENDED)
        finished.id = mid
        frames = await frames_of(parts.subscribe(finished, 0))
    assert len(frames) >= len(logged) // 100
    got = [e for frame in frames for e in frame]
    assert "".join(e["text"] for e in got if e["type"] == events.DELTA) == text
    assert [e["seq"] for e in got if e["type"] == events.DONE] == [1002, 2004, 3006]
    longest = max(len(e["text"]) for e in logged if e["type"] == events.DELTA)
    for frame in frames:  # a frame merges at most one page of deltas
        assert sum(len(e["text"]) for e in frame if e["type"] == events.DELTA) <= 100 * longest


def test_pacing_lets_a_stream_at_the_interval_through_whatever_its_jitter() -> None:
    """Tokens one interval apart reach a reader early or late by a few ms: none of them
    waits (spacing each write by the interval held every early one back)."""
    pacing = Pacing(0.02)
    for ready in (0.0, 0.019, 0.041, 0.058, 0.083, 0.099, 0.121, 0.139):
        assert pacing.delay(ready) == 0.0, ready
        pacing.wrote(ready)


def test_pacing_lets_two_frames_go_back_to_back_and_holds_the_third() -> None:
    pacing = Pacing(0.02)
    for _ in range(FRAME_BURST):
        assert pacing.delay(1.0) == 0.0
        pacing.wrote(1.0)
    assert pacing.delay(1.0) == pytest.approx(0.02)
    assert pacing.delay(1.02) == 0.0


def test_pacing_gives_a_fast_stream_one_frame_per_interval() -> None:
    """Events every 2 ms for a second: what is ready while a frame is held goes in the
    next one, so the reader writes about one frame per interval, not 500."""
    pacing = Pacing(0.02)
    frames, held_until = 0, 0.0
    for step in range(500):
        now = step * 0.002
        if now < held_until:
            continue  # merged into the frame being held
        wait = pacing.delay(now)
        held_until = now + wait
        pacing.wrote(held_until)
        frames += 1
    assert 50 <= frames <= 1.0 / 0.02 + FRAME_BURST


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("ping_interval", [0.05, None])
@pytest.mark.parametrize(("logged", "done_seq"), [(4, 5), (7, 8)])
async def test_a_reader_whose_done_never_comes_ends_as_the_record_says(
    parts: Parts, ping_interval: float | None, logged: int, done_seq: int
) -> None:
    """The record is final and its ``done`` never reached the log (the process killed
    between the two, or Redis away for too long, or a log restarted empty under this
    reader): once nothing came for a keep-alive's interval, the reader ends with the
    record's ``done``, after whatever it was sent (a WebSocket's reader, which gets no
    keep-alives of its own, as well)."""
    answer = await create_answer("tests:reading:unheard", content="abc", last_seq=5)
    await database.run(
        lambda: Message.objects.filter(id=answer.message_id).update(
            status=Status.COMPLETE.value, termination=ENDED
        )
    )
    live = state()
    live.id = answer.message_id
    await parts.log.append(live.id, opening(live.id))
    await parts.log.append(live.id, [events.delta(seq, "x") for seq in range(5, logged + 1)])
    with override_settings(STREAMING={"MIN_WRITE_INTERVAL": 0, "PING_INTERVAL": 0.05}):
        got = [
            e for frame in await frames_of(parts.subscribe(live, 0), ping_interval) for e in frame
        ]
    assert [e["seq"] for e in got][-1] == done_seq
    assert got[-1]["type"] == events.DONE and got[-1]["status"] == ENDED["status"]
