"""The reaper: a segment left ``streaming`` by a dead process is rebuilt from the log,
recorded ``interrupted`` and closed with exactly one ``done``; live processes (this one
first) are never reaped, and a death is confirmed for a heartbeat timeout first."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any, cast

import pytest
from django.test import override_settings
from django.utils import timezone

from streaming import database, events, signals
from streaming.control.memory import MemoryControl
from streaming.generation import Generation
from streaming.hub import Hub
from streaming.models import Message, Segment
from streaming.presence.base import Presence
from streaming.presence.memory import MemoryPresence
from streaming.reaper import Reaper
from streaming.registry import Generations
from streaming.streamlog.memory import MemoryStreamLog
from streaming.termination import Status
from tests.unit.scripted import Answer, create_answer, load_message, load_segments, texts

pytestmark = pytest.mark.django_db(transaction=True)

REDIS_URL = os.environ.get("REDIS_URL", "")
HANG = 10.0


def dead_worker() -> str:
    return f"tests:reaper:gone:{uuid.uuid4().hex}"


def reaper_of(presence: Presence | None = None) -> Reaper:
    log = MemoryStreamLog()
    if presence is None:
        presence = MemoryPresence(
            worker_id="tests:reaper:me", listener=Generations(MemoryControl())
        )
    return Reaper(log, Hub(log), presence)


@pytest.fixture
def interrupted() -> Iterator[list[tuple[Any, str]]]:
    """What ``answer_interrupted`` was sent with."""
    got: list[tuple[Any, str]] = []

    def receiver(sender: Any, message_id: str, **kwargs: Any) -> None:
        got.append((sender, message_id))

    signals.answer_interrupted.connect(receiver, weak=False, dispatch_uid="tests.reaper")
    yield got
    signals.answer_interrupted.disconnect(dispatch_uid="tests.reaper")


async def stream_of(reaper: Reaper, answer: Answer, *parts: str) -> None:
    """What the dead process had appended to the (shared) log."""
    batch = [events.start(1, message_id=answer.message_id, segment=0, model="m")]
    batch += [events.delta(seq, part) for seq, part in enumerate(parts, start=2)]
    await reaper.log.append(answer.message_id, batch)


async def collect(hub: Hub, message_id: str) -> list[events.Event]:
    got: list[events.Event] = []
    async for batch in hub.read(message_id, 0):
        got.extend(batch or [])
    return got


async def test_a_dead_process_segment_is_finished_from_the_log(
    interrupted: list[tuple[Any, str]],
) -> None:
    worker = dead_worker()
    # The dead process flushed "Hel" before it died; the log holds more.
    answer = await create_answer(worker, content="Hel", last_seq=2)
    reaper = reaper_of()
    await stream_of(reaper, answer, "Hel", "lo", " world")
    reader = asyncio.create_task(collect(reaper.hub, answer.message_id))

    assert await reaper.reap(confirm=False) == 1

    message = await load_message(answer.message_id)
    assert (message.content, message.status, message.last_seq) == (
        "Hello world",
        Status.INTERRUPTED,
        5,
    )
    assert message.termination["error_type"] == "Interrupted"
    assert "worker" not in message.termination
    [segment] = await load_segments(answer.message_id)
    assert segment.worker == worker
    assert (segment.status, segment.end_offset) == (Status.INTERRUPTED, len("Hello world"))
    logged = await reaper.log.read(answer.message_id)
    done = logged[-1]
    assert (done["seq"], done["type"], done["status"], done["segment"]) == (
        5,
        events.DONE,
        Status.INTERRUPTED,
        0,
    )
    assert message.termination == {k: done[k] for k in message.termination}
    got = await asyncio.wait_for(reader, HANG)
    assert got == logged, "an attached reader finishes with the reaper's done"
    assert interrupted == [(Reaper, answer.message_id)]

    assert await reaper.reap(confirm=False) == 0, "a second pass finds nothing"
    logged_again = await reaper.log.read(answer.message_id)
    assert [e["type"] for e in logged_again].count(events.DONE) == 1
    assert interrupted == [(Reaper, answer.message_id)]


async def test_a_record_that_committed_unheard_still_gets_its_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The final record commits but its answer never comes (the connection lost after the
    commit): the next pass no longer finds the segment streaming, and tries the same
    write again (the same ``ended_at``), which finds it its own and ends the log."""
    from django.db import OperationalError

    from streaming import reaper as reaper_module

    answer = await create_answer(dead_worker())
    reaper = reaper_of()
    await stream_of(reaper, answer, "Hel", "lo")
    reader = asyncio.create_task(collect(reaper.hub, answer.message_id))
    write = reaper_module.finalize_segment

    def committed_unheard(**kwargs: Any) -> bool:
        write(**kwargs)
        raise OperationalError("the answer never came")

    monkeypatch.setattr(reaper_module, "finalize_segment", committed_unheard)
    assert await reaper.reap(confirm=False) == 0
    assert (await load_message(answer.message_id)).status == Status.INTERRUPTED
    monkeypatch.setattr(reaper_module, "finalize_segment", write)

    assert await reaper.reap(confirm=False) == 1
    logged = await reaper.log.read(answer.message_id)
    assert [e["type"] for e in logged][-1] == events.DONE
    assert await asyncio.wait_for(reader, HANG) == logged
    assert reaper.unsettled == {}
    assert await reaper.reap(confirm=False) == 0, "a third pass finds nothing"


class CountingPresence(MemoryPresence):
    """Memory presence that records which workers each pass asks about."""

    asked: list[list[str]]

    async def dead(self, workers: list[str]) -> list[str]:
        self.asked.append(list(workers))
        return await super().dead(workers)


async def test_a_pass_asks_about_each_streaming_process_once() -> None:
    busy, other = dead_worker(), dead_worker()
    for worker in (busy, busy, busy, other):
        await create_answer(worker)
    presence = CountingPresence(worker_id="tests:reaper:me", listener=Generations(MemoryControl()))
    presence.asked = []
    assert await reaper_of(presence).reap() == 0  # missing, not yet for a heartbeat timeout
    [asked] = presence.asked
    assert sorted(asked) == sorted([busy, other])


async def test_another_reaper_cannot_finish_it_twice() -> None:
    worker = dead_worker()
    answer = await create_answer(worker)
    log = MemoryStreamLog()
    first = Reaper(
        log, Hub(log), MemoryPresence(worker_id="a", listener=Generations(MemoryControl()))
    )
    second = Reaper(
        log, Hub(log), MemoryPresence(worker_id="b", listener=Generations(MemoryControl()))
    )
    await stream_of(first, answer, "only once")
    assert await asyncio.gather(first.reap(confirm=False), second.reap(confirm=False)) in (
        [1, 0],
        [0, 1],
    )
    assert [e["type"] for e in await log.read(answer.message_id)].count(events.DONE) == 1


async def test_a_continued_answer_keeps_the_text_before_the_segment() -> None:
    worker = dead_worker()
    answer = await create_answer(worker)
    reaper = reaper_of()
    first = [
        events.start(1, message_id=answer.message_id, segment=0, model="m"),
        events.delta(2, "Once upon"),
        events.done(3, segment=0, termination={"status": Status.TRUNCATED.value}),
    ]
    second = [
        events.start(4, message_id=answer.message_id, segment=1, model="m"),
        events.delta(5, " a"),
        events.delta(6, " time"),
    ]
    await reaper.log.append(answer.message_id, first + second)

    def continued() -> None:
        Segment.objects.filter(message_id=answer.message_id, index=0).update(
            status=Status.TRUNCATED, end_offset=9
        )
        Segment.objects.create(
            message_id=answer.message_id, index=1, first_seq=4, start_offset=9, worker=worker
        )
        Message.objects.filter(id=answer.message_id).update(content="Once upon a", last_seq=5)

    await database.run(continued)
    assert await reaper.reap(confirm=False) == 1
    message = await load_message(answer.message_id)
    assert (message.content, message.last_seq) == ("Once upon a time", 7)
    segments = await load_segments(answer.message_id)
    assert [(s.status, s.start_offset, s.end_offset) for s in segments] == [
        (Status.TRUNCATED, 0, 9),
        (Status.INTERRUPTED, 9, 16),
    ]
    logged = await reaper.log.read(answer.message_id, 3)
    assert texts(logged) == [" a", " time"]
    assert logged[-1]["segment"] == 1


async def test_without_a_log_what_was_flushed_is_kept() -> None:
    answer = await create_answer(dead_worker(), content="flushed so far", last_seq=7)
    reaper = reaper_of()  # a fresh in-memory log: the dead process took its log along
    assert await reaper.reap(confirm=False) == 1
    message = await load_message(answer.message_id)
    assert (message.content, message.status, message.last_seq) == (
        "flushed so far",
        Status.INTERRUPTED,
        8,
    )
    [done] = await reaper.log.read(answer.message_id)
    assert (done["seq"], done["type"]) == (8, events.DONE)
    # What came after the stored copy, if anything, went with the log: the record says so.
    assert "text after event 7 may be missing" in message.termination["error_message"]


async def written_long_ago(*answers: Answer) -> None:
    """The answers' segments written an hour ago: old enough for any call's wait to be
    over. (Shrinking ``DATABASE_WAIT_TIMEOUT`` instead set a millisecond's
    ``statement_timeout`` on any connection opened meanwhile, which outlived the test
    and cancelled the statements of the tests after it.)"""
    ids = [answer.message_id for answer in answers]
    an_hour_ago = timezone.now() - timedelta(hours=1)
    await database.run(
        lambda: Segment.objects.filter(message_id__in=ids).update(started_at=an_hour_ago)
    )


async def test_this_process_segments_are_reaped_only_when_no_generation_here_streams_them(
    interrupted: list[tuple[Any, str]],
) -> None:
    """A segment this process streams is never reaped. One left streaming with no
    generation here (its post failed after its rows committed, or its final record could
    not be written) is, once two passes in a row found it so: the pass for dead
    processes never would, and it held its owner's slot for ever."""
    reaper = reaper_of()
    listener = reaper.presence.listener
    assert isinstance(listener, Generations)
    live = await create_answer(reaper.presence.worker_id)
    stray = await create_answer(reaper.presence.worker_id)
    await written_long_ago(live, stray)
    await stream_of(reaper, live, "still going")
    await stream_of(reaper, stray, "left ", "behind")
    listener.running[live.message_id] = cast(Generation, object())  # streamed here
    try:
        assert await reaper.reap(confirm=False) == 0, "a first pass only takes note"
        assert await reaper.reap() == 1
        assert await reaper.reap() == 0
    finally:
        del listener.running[live.message_id]
    assert (await load_message(live.message_id)).status == Status.STREAMING
    assert texts(await reaper.log.read(live.message_id)) == ["still going"]
    message = await load_message(stray.message_id)
    assert (message.status, message.content) == (Status.INTERRUPTED, "left behind")
    assert (await reaper.log.read(stray.message_id))[-1]["type"] == events.DONE
    assert interrupted == [(Reaper, stray.message_id)]


async def test_a_segment_registered_between_two_passes_is_not_reaped() -> None:
    """A start is registered a turn of the loop after its rows commit: a pass between
    the two finds it unregistered once, and the next finds it streamed here."""
    reaper = reaper_of()
    listener = reaper.presence.listener
    assert isinstance(listener, Generations)
    answer = await create_answer(reaper.presence.worker_id)
    await written_long_ago(answer)
    assert await reaper.reap() == 0
    listener.running[answer.message_id] = cast(Generation, object())
    try:
        assert await reaper.reap() == 0
    finally:
        del listener.running[answer.message_id]
    assert (await load_message(answer.message_id)).status == Status.STREAMING


@override_settings(DATABASE_WAIT_TIMEOUT=30)
async def test_a_segment_whose_start_may_still_be_heard_is_not_reaped() -> None:
    """Its rows are visible once they commit, but the thread that wrote them registers
    its start only when it hears the commit's answer, which may take a database call's
    whole wait: a segment younger than that is left alone, however many passes find it."""
    reaper = reaper_of()
    answer = await create_answer(reaper.presence.worker_id)
    for _ in range(3):
        assert await reaper.reap() == 0
    assert (await load_message(answer.message_id)).status == Status.STREAMING


@override_settings(DATABASE_WAIT_TIMEOUT=0)
async def test_without_a_bound_on_a_calls_wait_none_is_reaped_here() -> None:
    reaper = reaper_of()
    answer = await create_answer(reaper.presence.worker_id)
    for _ in range(3):
        assert await reaper.reap() == 0
    assert (await load_message(answer.message_id)).status == Status.STREAMING


async def test_a_death_is_confirmed_for_a_heartbeat_timeout_first() -> None:
    worker = dead_worker()
    answer = await create_answer(worker)
    reaper = reaper_of()
    with override_settings(STREAMING={"HEARTBEAT_TIMEOUT": 3600.0}):
        assert await reaper.reap() == 0, "first seen missing: it may just be restarting"
        assert await reaper.reap() == 0
        assert worker in reaper.missing
    assert (await load_message(answer.message_id)).status == Status.STREAMING
    with override_settings(STREAMING={"HEARTBEAT_TIMEOUT": 0.0}):
        assert await reaper.reap() == 1, "missing for the whole timeout: reaped"
        assert await reaper.reap() == 0
    assert (await load_message(answer.message_id)).status == Status.INTERRUPTED
    assert reaper.missing == {}, "a worker with nothing left to reap is forgotten"


@pytest.fixture
async def redis_presence() -> AsyncIterator[Any]:
    if not REDIS_URL:
        pytest.skip("needs REDIS_URL")
    from streaming.presence.redis import RedisPresence, worker_key

    made: list[RedisPresence] = []

    def make(worker: str) -> RedisPresence:
        presence = RedisPresence(
            location=REDIS_URL, worker_id=worker, listener=Generations(MemoryControl())
        )
        made.append(presence)
        return presence

    yield make
    for presence in made:
        await presence.redis.delete(worker_key(presence.worker_id))
        await presence.close()


async def test_a_worker_that_beats_again_is_not_reaped(redis_presence: Any) -> None:
    worker = dead_worker()
    answer = await create_answer(worker)
    reaper = reaper_of(redis_presence(f"tests:reaper:me:{uuid.uuid4().hex}"))
    restarted = redis_presence(worker)  # the same process, back after a Redis restart
    with override_settings(STREAMING={"HEARTBEAT_TIMEOUT": 3600.0}):
        assert await reaper.reap() == 0
        assert worker in reaper.missing
        await restarted.beat()
        assert await reaper.reap() == 0
        assert worker not in reaper.missing, "seen alive: the confirmation starts over"
    with override_settings(STREAMING={"HEARTBEAT_TIMEOUT": 0.0}):
        assert await reaper.reap() == 0, "alive: never reaped"
        await restarted.leave()
        assert await reaper.reap() == 1
    assert (await load_message(answer.message_id)).status == Status.INTERRUPTED


async def test_a_log_that_lost_its_start_is_spliced_with_the_stored_text() -> None:
    """After a Redis restart the log starts late; the stored text reaches seq 3."""
    worker = dead_worker()
    answer = await create_answer(worker, content="Hello", last_seq=3)
    reaper = reaper_of()
    await reaper.log.append(answer.message_id, [events.delta(3, "lo"), events.delta(4, " you")])
    assert await reaper.reap(confirm=False) == 1
    message = await load_message(answer.message_id)
    assert (message.content, message.last_seq) == ("Hello you", 5)
    assert "lost" not in message.termination["error_message"]


async def test_a_hole_between_the_stored_text_and_the_log_is_recorded() -> None:
    worker = dead_worker()
    answer = await create_answer(worker, content="Hel", last_seq=2)
    reaper = reaper_of()
    await reaper.log.append(answer.message_id, [events.delta(6, " tail")])
    assert await reaper.reap(confirm=False) == 1
    message = await load_message(answer.message_id)
    assert message.content == "Hel tail"
    assert "events 3-5 were lost" in message.termination["error_message"]


@pytest.mark.skipif(
    os.environ.get("DATABASE_URL", "").split(":")[0] not in ("postgres", "postgresql"),
    reason="PostgreSQL's plan, as deployed",
)
def test_a_pass_reads_only_the_segments_streaming_now() -> None:
    """Both of a pass's reads are served by the index of the segments streaming now,
    which holds nothing else (the plan a big table gets: a test's few rows would be
    scanned whole)."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from streaming.reaper import _orphans, _streaming_workers

    with CaptureQueriesContext(connection) as ran:
        _orphans([*_streaming_workers(), "host:1:1"])
    assert len(ran.captured_queries) == 2
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        plans = []
        for query in ran.captured_queries:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {query['sql']}")
            plans.append(str(cursor.fetchone()[0]))
    assert all("segment_streaming_worker" in plan for plan in plans), plans
