"""The same replay/follow contract for both stream log backends."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from streaming import events
from streaming.conf import streaming_settings
from streaming.streamlog import LogDeleted, LogLost, SeqConflict, StreamLog
from streaming.streamlog.memory import MemoryStreamLog
from tests.support.redis import PrivateRedis

pytestmark = pytest.mark.asyncio


@pytest.fixture(params=["memory", "redis"])
async def log(request: pytest.FixtureRequest) -> AsyncIterator[StreamLog]:
    if request.param == "memory":
        yield MemoryStreamLog()
        return
    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("needs REDIS_URL")
    from streaming.streamlog.redis import RedisStreamLog

    # A short block: how long an idle follower takes to notice a deletion.
    backend = RedisStreamLog(url, follow_block_ms=200)
    yield backend
    await backend.close()


def deltas(first: int, count: int) -> list[dict]:
    return [events.delta(seq, f"t{seq} ") for seq in range(first, first + count)]


async def test_replay_after_a_cursor(log: StreamLog):
    mid = str(uuid.uuid4())
    await log.append(mid, [events.start(1, message_id=mid, segment=0, model="m")])
    await log.append(mid, deltas(2, 5))
    assert [e["seq"] for e in await log.read(mid, 0)] == [1, 2, 3, 4, 5, 6]
    assert [e["seq"] for e in await log.read(mid, 4)] == [5, 6]
    assert await log.read(mid, 6) == []
    assert await log.last_seq(mid) == 6
    assert (await log.read(mid, 1))[0] == {"seq": 2, "type": "delta", "text": "t2 "}


async def test_a_read_is_bounded_by_its_limit(log: StreamLog):
    mid = str(uuid.uuid4())
    await log.append(mid, deltas(1, 10))
    assert [e["seq"] for e in await log.read(mid, 0, limit=4)] == [1, 2, 3, 4]
    assert [e["seq"] for e in await log.read(mid, 4, limit=4)] == [5, 6, 7, 8]
    assert [e["seq"] for e in await log.read(mid, 8, limit=4)] == [9, 10]


async def test_follow_replays_then_follows_live_until_done(log: StreamLog):
    mid = str(uuid.uuid4())
    await log.append(mid, deltas(1, 3))
    received: list[dict] = []
    first_batch = asyncio.Event()

    async def follow() -> None:
        async for batch in log.follow(mid, 1):
            received.extend(batch)
            first_batch.set()

    task = asyncio.create_task(follow())
    await first_batch.wait()
    assert [e["seq"] for e in received] == [2, 3]
    await log.append(mid, deltas(4, 2))
    await log.append(mid, [events.done(6, segment=0, termination={"status": "complete"})])
    await asyncio.wait_for(task, 10)
    assert [e["seq"] for e in received] == [2, 3, 4, 5, 6]
    assert received[-1]["type"] == "done"


@pytest.mark.parametrize("ahead", [0, 1, 500])
async def test_a_follower_at_or_past_the_end_learns_when_the_log_ends(log: StreamLog, ahead: int):
    """A cursor ahead of the log (a client's, made up) must not wait for a seq that never
    comes: the follow starts at the log's last event, which it yields again."""
    mid = str(uuid.uuid4())
    await log.append(mid, deltas(1, 3))
    received: list[dict] = []
    first_batch = asyncio.Event()

    async def follow() -> None:
        async for batch in log.follow(mid, 3 + ahead):
            received.extend(batch)
            first_batch.set()

    task = asyncio.create_task(follow())
    await first_batch.wait()
    assert [e["seq"] for e in received] == [3]
    await log.append(mid, [events.done(4, segment=0, termination={"status": "complete"})])
    await asyncio.wait_for(task, 10)
    assert [e["seq"] for e in received] == [3, 4]


async def test_a_follower_past_an_ended_log_ends_with_its_done(log: StreamLog):
    mid = str(uuid.uuid4())
    await log.append(mid, deltas(1, 2))
    await log.append(mid, [events.done(3, segment=0, termination={"status": "complete"})])
    got = [e async for batch in log.follow(mid, 50) for e in batch]
    assert [(e["type"], e["seq"]) for e in got] == [("done", 3)]


async def test_duplicate_or_older_seq_is_rejected(log: StreamLog):
    mid = str(uuid.uuid4())
    await log.append(mid, deltas(1, 2))
    with pytest.raises(SeqConflict):
        await log.append(mid, [events.done(2, segment=0, termination={"status": "x"})])
    assert await log.last_seq(mid) == 2


async def test_a_contiguous_append_is_refused_where_the_log_lost_its_tail(log: StreamLog):
    """The writer's check against a store that restarted empty or came back behind: the
    refusal says what the log holds and adds nothing, and an append of another message
    sharing the same round trip is unaffected."""
    lost, kept = str(uuid.uuid4()), str(uuid.uuid4())
    await log.append(lost, deltas(1, 3))
    await log.append(kept, deltas(1, 3))
    await log.append(lost, deltas(4, 1), contiguous=True)
    results = await asyncio.gather(
        log.append(lost, deltas(7, 2), contiguous=True),
        log.append(kept, deltas(4, 2), contiguous=True),
        return_exceptions=True,
    )
    assert isinstance(results[0], LogLost) and results[0].have == 4
    assert results[1] is None
    assert await log.last_seq(lost) == 4
    assert [e["seq"] for e in await log.read(kept, 0)] == [1, 2, 3, 4, 5]
    emptied = str(uuid.uuid4())  # as a Redis restarted empty holds it
    with pytest.raises(LogLost) as refused:
        await log.append(emptied, deltas(9, 1), contiguous=True)
    assert refused.value.have == 0
    assert await log.read(emptied, 0) == []
    await log.append(emptied, deltas(5, 5))  # what the writer still holds, then the rest
    assert [e["seq"] for e in await log.read(emptied, 0)] == [5, 6, 7, 8, 9]


async def test_a_deleted_logs_writer_is_told_so_and_adds_nothing(log: StreamLog):
    """A log deleted with its conversation refuses its writer's next append as deleted,
    not lost: the writer stops rather than putting its events back (which made the log
    again, with no expiry, under an answer no one can read)."""
    mid = str(uuid.uuid4())
    await log.append(mid, deltas(1, 3))
    await log.delete(mid)
    with pytest.raises(LogDeleted):
        await log.append(mid, deltas(4, 2), contiguous=True)
    assert await log.read(mid, 0) == []
    assert await log.last_seq(mid) == 0


async def test_submit_tells_each_append_later_and_a_writer_that_raises_stops_no_other(
    log: StreamLog,
):
    """A writer's callback runs after ``submit`` returned, once per append, with its own
    outcome; one that raises (a writer's bug) keeps neither the appends beside it nor the
    later ones from being told."""
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    told: list[tuple[str, BaseException | None]] = []
    both_told = asyncio.Event()

    def raising(error: BaseException | None) -> None:
        told.append(("first", error))
        raise RuntimeError("a writer's bug")

    def noting(error: BaseException | None) -> None:
        told.append(("second", error))
        both_told.set()

    log.submit(first, deltas(1, 2), raising)
    log.submit(second, deltas(5, 1), noting, contiguous=True)  # seq 4 was never there
    assert told == [], "never told from within submit"
    await asyncio.wait_for(both_told.wait(), 5)
    assert told[0] == ("first", None)
    assert told[1][0] == "second" and isinstance(told[1][1], LogLost)
    await asyncio.wait_for(log.append(first, deltas(3, 1)), 5)
    assert [e["seq"] for e in await log.read(first, 0)] == [1, 2, 3]
    assert await log.read(second, 0) == []


async def test_concurrent_appends_keep_order_per_message(log: StreamLog):
    ids = [str(uuid.uuid4()) for _ in range(20)]

    async def write(mid: str) -> None:
        for seq in range(1, 31):
            await log.append(mid, [events.delta(seq, str(seq))])

    await asyncio.gather(*(write(mid) for mid in ids))
    for mid in ids:
        assert [e["seq"] for e in await log.read(mid, 0)] == list(range(1, 31))


async def _expires_in(log: StreamLog, mid: str) -> float | None:
    """Seconds until the log of ``mid`` expires (None: it does not)."""
    if isinstance(log, MemoryStreamLog):
        at = log._entries[mid].expires_at
        return None if at is None else at - time.time()
    from streaming.streamlog.redis import stream_key

    left = await log._redis.ttl(stream_key(mid))  # type: ignore[attr-defined]
    return float(left)


async def test_a_done_starts_the_expiry_and_a_continue_makes_the_log_live(log: StreamLog):
    mid = str(uuid.uuid4())
    ttl = streaming_settings.LOG_TTL
    await log.append(mid, [events.start(1, message_id=mid, segment=0, model="m"), *deltas(2, 2)])
    live = await _expires_in(log, mid)
    assert live is None or live > ttl, "a live log outlives a finished one"
    await log.append(mid, [events.done(4, segment=0, termination={"status": "complete"})])
    assert ttl - 5 < (await _expires_in(log, mid) or 0) <= ttl
    await log.append(mid, [events.start(5, message_id=mid, segment=1, model="m")])
    again = await _expires_in(log, mid)
    assert again is None or again > ttl
    assert [e["seq"] for e in await log.read(mid, 0)] == [1, 2, 3, 4, 5]


async def test_delete(log: StreamLog):
    mid = str(uuid.uuid4())
    await log.append(mid, deltas(1, 2))
    assert len(await log.read(mid, 0)) == 2
    await log.delete(mid)
    assert await log.read(mid, 0) == []
    assert await log.last_seq(mid) == 0


async def test_a_conversations_logs_go_at_once_each_leaving_its_tombstone(log: StreamLog):
    """``delete_many`` (a conversation's messages, more than one round trip's worth on
    Redis): every log goes, and a follower starting late on any ends at once."""
    mids = [str(uuid.uuid4()) for _ in range(1_200)]
    for mid in mids[:3]:
        await log.append(mid, deltas(1, 2))
    await log.delete_many(mids)
    for mid in (*mids[:3], mids[-1]):
        assert await log.read(mid, 0) == []
        late = [e async for batch in log.follow(mid, 0) for e in batch]
        assert [(e["type"], e["error_type"]) for e in late] == [("done", "Deleted")]


async def test_followers_of_a_deleted_log_end_with_a_terminal_event(log: StreamLog):
    mid = str(uuid.uuid4())
    await log.append(mid, deltas(1, 3))

    following = asyncio.Event()

    async def follow_all() -> list[dict]:
        got: list[dict] = []
        async for batch in log.follow(mid, 0):
            got.extend(batch)
            following.set()
        return got

    waiting = asyncio.create_task(follow_all())
    await following.wait()  # it has the deltas and waits for more (or is about to)
    await log.delete(mid)
    got = await asyncio.wait_for(waiting, 10)
    assert [e["seq"] for e in got] == [1, 2, 3, 4]
    assert (got[-1]["type"], got[-1]["status"], got[-1]["error_type"]) == (
        "done",
        "cancelled",
        "Deleted",
    )
    late = await asyncio.wait_for(follow_all(), 10)
    assert [(e["type"], e["seq"]) for e in late] == [("done", 1)]
    assert await log.read(mid, 0) == []


async def test_appends_go_on_when_redis_forgot_the_append_script(
    private_redis: PrivateRedis,
) -> None:
    """A restarted Redis has no scripts: the append is sent whole, once, and then by SHA.
    On a Redis of its own: the scripts it flushes are the server's."""
    from streaming.streamlog.redis import RedisStreamLog

    backend = RedisStreamLog(private_redis.url)
    mid = str(uuid.uuid4())
    try:
        await backend.append(mid, deltas(1, 2))
        await backend._redis.script_flush()
        await backend.append(mid, deltas(3, 2), contiguous=True)
        await backend.append(mid, deltas(5, 1), contiguous=True)
        assert [e["seq"] for e in await backend.read(mid, 0)] == [1, 2, 3, 4, 5]
    finally:
        await backend.delete(mid)
        await backend.close()


async def _evalsha_calls(backend: object) -> int:
    stats = await backend._redis.info("commandstats")  # type: ignore[attr-defined]
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_a_batch_makes_one_script_call_per_key_group(private_redis: PrivateRedis) -> None:
    """Appends given together go in one batch: one call per key group, each over keys of
    one Redis Cluster hash slot (their hash tag), and every append lands. On a Redis of
    its own: the count of script calls is the server's."""
    from streaming.streamlog.redis import RedisStreamLog, key_group, stream_key

    backend = RedisStreamLog(private_redis.url, key_groups=4, group_commit_window=0.05)
    mids = [str(uuid.uuid4()) for _ in range(24)]
    groups = {key_group(mid, 4) for mid in mids}
    assert len(groups) > 1
    try:
        await backend.append(str(uuid.uuid4()), deltas(1, 1))  # the script is loaded
        before = await _evalsha_calls(backend)
        await asyncio.gather(*(backend.append(mid, deltas(1, 3)) for mid in mids))
        assert await _evalsha_calls(backend) - before == len(groups)
        for mid in mids:
            key = stream_key(mid, 4)
            assert key == f"chat:log:{{{key_group(mid, 4)}}}:{mid}"
            assert await backend._redis.exists(key)
            assert [e["seq"] for e in await backend.read(mid, 0)] == [1, 2, 3]
    finally:
        for mid in mids:
            await backend.delete(mid)
        await backend.close()


async def test_every_group_of_a_batch_is_appended_when_redis_forgot_the_script(
    private_redis: PrivateRedis,
) -> None:
    """On a Redis of its own: the scripts it flushes are the server's."""
    from streaming.streamlog.redis import RedisStreamLog

    backend = RedisStreamLog(private_redis.url, key_groups=4, group_commit_window=0.05)
    mids = [str(uuid.uuid4()) for _ in range(12)]
    try:
        await asyncio.gather(*(backend.append(mid, deltas(1, 1)) for mid in mids))
        await backend._redis.script_flush()
        await asyncio.gather(*(backend.append(mid, deltas(2, 2), contiguous=True) for mid in mids))
        for mid in mids:
            assert [e["seq"] for e in await backend.read(mid, 0)] == [1, 2, 3]
    finally:
        for mid in mids:
            await backend.delete(mid)
        await backend.close()


@pytest.mark.parametrize("groups", [0, -1, 1.5, "4"])
async def test_key_groups_must_be_a_whole_number_of_at_least_one(groups: object) -> None:
    from streaming.streamlog.redis import RedisStreamLog

    with pytest.raises(ValueError, match="KEY_GROUPS"):
        RedisStreamLog("redis://127.0.0.1:6379/0", key_groups=groups)  # type: ignore[arg-type]


async def test_appends_given_up_after_the_hold_say_so_without_the_servers_address() -> None:
    """Redis unreachable for longer than the log holds appends: the writer is told in the
    product's words; the client library's error (with the address) is the log's."""
    from streaming.streamlog import LogUnreachable
    from streaming.streamlog.redis import RedisStreamLog
    from tests.support.redis import free_port

    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    backend = RedisStreamLog(nowhere, unavailable_retry_seconds=0.2)
    try:
        with pytest.raises(LogUnreachable) as raised:
            await backend.append(str(uuid.uuid4()), deltas(1, 1))
    finally:
        await backend.close()
    assert str(raised.value) == "the event log could not be reached for 0.2 s"
    assert "127.0.0.1" not in str(raised.value)
