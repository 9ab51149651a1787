"""Presence: one contract, two backends (in memory; Redis at ``REDIS_URL``).

The listener is the real registry of generations, so "told" means: a generation running
here sees its reader count (and is abandoned when it drops to zero with no grace), and a
generation running elsewhere gets a control message over the channel layer, which the
tests read from a channel of their own in the group of all processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from django.test import override_settings

from streaming.control.memory import MemoryControl
from streaming.generation import Backends, Generation
from streaming.hub import Hub
from streaming.presence.base import Presence
from streaming.presence.memory import MemoryPresence
from streaming.registry import READERS, Generations
from streaming.streamlog.memory import MemoryStreamLog
from streaming.termination import Status
from tests.unit.scripted import (
    Gate,
    Received,
    ScriptedEngine,
    Wire,
    chunk,
    create_answer,
    load_message,
    plan_for,
)

REDIS_URL = os.environ.get("REDIS_URL", "")
needs_redis = pytest.mark.skipif(not REDIS_URL, reason="needs REDIS_URL")
HANG = 10.0


class Presences:
    """Makes presence clients of one backend and removes what they left in Redis."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.made: list[Presence] = []
        self.message_ids: list[str] = []

    def make(self, listener: Generations | None = None, worker: str | None = None) -> Presence:
        worker = worker or f"tests:presence:{uuid.uuid4().hex}"
        if listener is None:  # (an empty registry is falsy: it has a length)
            listener = Generations(MemoryControl())
        presence: Presence
        if self.kind == "memory":
            presence = MemoryPresence(worker_id=worker, listener=listener)
        else:
            from streaming.presence.redis import RedisPresence

            presence = RedisPresence(location=REDIS_URL, worker_id=worker, listener=listener)
        self.made.append(presence)
        return presence

    def message_id(self) -> str:
        message_id = str(uuid.uuid4())
        self.message_ids.append(message_id)
        return message_id

    async def close(self) -> None:
        if self.kind == "redis":
            from streaming.presence.redis import READERS_PREFIX, RedisPresence, worker_key

            keys = [READERS_PREFIX + m for m in self.message_ids]
            keys += [worker_key(p.worker_id) for p in self.made]
            first = self.made[0] if self.made else None
            if isinstance(first, RedisPresence) and keys:
                await first.redis.delete(*keys)
        for presence in self.made:
            await presence.close()


@pytest.fixture(params=["memory", pytest.param("redis", marks=needs_redis)])
async def presences(request: pytest.FixtureRequest) -> AsyncIterator[Presences]:
    made = Presences(request.param)
    yield made
    await made.close()


@pytest.fixture
async def redis_presences() -> AsyncIterator[Presences]:
    if not REDIS_URL:
        pytest.skip("needs REDIS_URL")
    made = Presences("redis")
    yield made
    await made.close()


async def generating_here(
    presences: Presences, grace: float = 0.0
) -> tuple[Presence, Generation, Generations]:
    """A presence client whose process runs a generation waiting on its engine."""
    generations = Generations(MemoryControl())
    presence = presences.make(generations)
    answer = await create_answer(presence.worker_id)
    presences.message_ids.append(answer.message_id)
    log = MemoryStreamLog()
    gate = Gate()
    engine = ScriptedEngine([chunk("a"), gate])
    backends = Backends(log, Hub(log), presence, engine)
    generation = generations.launch(plan_for(answer, grace=grace), backends)
    await asyncio.wait_for(gate.reached.wait(), HANG)
    return presence, generation, generations


async def status_at_end(generation: Generation) -> str:
    await asyncio.wait_for(generation.finished.wait(), HANG)
    return (await load_message(generation.message_id)).status


# --- the contract ------------------------------------------------------------------------
async def test_attach_and_detach_count_this_process_readers(presences: Presences) -> None:
    presence = presences.make()
    one, two = presences.message_id(), presences.message_id()
    assert presence.idle.is_set()
    assert await presence.count(one) == 0
    assert await presence.attach(one)
    assert not presence.idle.is_set()
    assert await presence.attach(one)
    assert not await presence.attach(two, live=False), "a finished message's: not shared"
    assert (await presence.count(one), await presence.count(two)) == (2, 1)
    await presence.detach(one, shared=True)
    assert await presence.count(one) == 1
    await presence.detach(one, shared=True, ended=True)
    assert await presence.count(one) == 0
    assert not presence.idle.is_set(), "a reader of another message is still attached"
    await presence.detach(two, shared=False)
    assert await presence.count(two) == 0
    assert presence.idle.is_set()
    await presence.attach(two)
    assert not presence.idle.is_set()


@pytest.mark.django_db(transaction=True)
async def test_a_generation_here_is_told_its_readers(presences: Presences) -> None:
    presence, generation, _ = await generating_here(presences, grace=0.0)
    mid = generation.message_id
    assert not generation.readers_seen
    assert not await presence.attach(mid), "the generation is here: counted here only"
    assert generation.readers_seen
    await presence.attach(mid)
    await presence.detach(mid, shared=False)
    assert generation.cancel_reason is None, "one reader is left"
    await presence.detach(mid, shared=False)
    assert await status_at_end(generation) == Status.ABANDONED


@pytest.mark.django_db(transaction=True)
async def test_a_reader_that_saw_the_end_does_not_abandon(presences: Presences) -> None:
    presence, generation, _ = await generating_here(presences, grace=0.0)
    mid = generation.message_id
    shared = await presence.attach(mid)
    await presence.detach(mid, shared=shared, ended=True)
    assert generation.cancel_reason is None
    assert await presence.count(mid) == 0
    await generation.recount_readers()
    assert await status_at_end(generation) == Status.ABANDONED


@contextlib.asynccontextmanager
async def heard_elsewhere(
    presences: Presences,
) -> AsyncIterator[tuple[Presence, str, Callable[[], Awaitable[list[dict[str, Any]]]]]]:
    """A presence client, a message of its, and ``told()``: the control messages about
    that message sent so far, as another process hears them."""
    wire = Wire(presences.kind, REDIS_URL)
    try:
        registry = Generations(wire.control())
        received = Received()
        await wire.listen(received)
        mid = presences.message_id()
        yield presences.make(registry), mid, lambda: received.about(registry.control, mid)
    finally:
        await wire.close()


async def test_a_generation_elsewhere_is_told_when_this_process_count_crosses_zero(
    presences: Presences,
) -> None:
    async with heard_elsewhere(presences) as (presence, mid, told):
        await presence.attach(mid)  # 0 -> 1
        await presence.attach(mid)  # 1 -> 2: the total cannot have crossed zero
        await presence.detach(mid, shared=True)  # 2 -> 1
        await presence.detach(mid, shared=True)  # 1 -> 0
        await presence.attach(mid, live=False)
        await presence.detach(mid, shared=False)
        await presence.attach(mid)  # 0 -> 1
        await presence.detach(mid, shared=True, ended=True)  # saw the end: no one wants it
        got = await told()
    readers = {"type": READERS, "mid": mid}
    # In memory there is one process, so no generation runs anywhere else to be told.
    expected = [] if presences.kind == "memory" else [readers, readers, readers]
    assert got == expected


async def test_readers_joining_at_the_same_moment_tell_the_generation_elsewhere(
    redis_presences: Presences,
) -> None:
    """Two readers attach at once: the first took this process's count from zero, though
    by the time its count is shared the second has raised it to two. The process
    generating the answer is told (once), and told again when both have left."""
    async with heard_elsewhere(redis_presences) as (presence, mid, told):
        assert await asyncio.gather(presence.attach(mid), presence.attach(mid)) == [True, True]
        joined = await told()
        await asyncio.gather(presence.detach(mid, shared=True), presence.detach(mid, shared=True))
        left = await told()
    readers = {"type": READERS, "mid": mid}
    assert joined == [readers]
    assert left == [readers, readers]


async def test_no_heartbeat_is_dead_and_never_this_process(presences: Presences) -> None:
    presence = presences.make()
    other = f"tests:presence:other:{uuid.uuid4().hex}"
    await presence.beat()
    assert await presence.dead([presence.worker_id]) == []
    assert await presence.dead([other, presence.worker_id]) == [other]
    await presence.ping()
    await presence.leave()
    assert await presence.dead([presence.worker_id]) == [], "not even after leaving"


# --- Redis: several processes ------------------------------------------------------------
async def test_beat_and_leave_make_a_worker_alive_and_dead(redis_presences: Presences) -> None:
    from streaming.presence.redis import RedisPresence, worker_key

    with override_settings(STREAMING={"HEARTBEAT_TIMEOUT": 7.0}):
        here, there = redis_presences.make(), redis_presences.make()
        assert isinstance(here, RedisPresence)
        assert await here.dead([there.worker_id]) == [there.worker_id]
        await there.beat()
        assert await here.dead([there.worker_id]) == []
        ttl = await here.redis.pttl(worker_key(there.worker_id))
        assert 0 < ttl <= 7000, "a heartbeat lasts HEARTBEAT_TIMEOUT"
        await there.leave()
        assert await here.dead([there.worker_id]) == [there.worker_id]


async def test_readers_count_in_live_processes_only(redis_presences: Presences) -> None:
    here, there = redis_presences.make(), redis_presences.make()
    mid = redis_presences.message_id()
    await there.attach(mid)
    await there.attach(mid)
    assert await here.count(mid) == 0, "the other process has no heartbeat: dead"
    await there.beat()
    assert await here.count(mid) == 2
    finished = redis_presences.message_id()
    await there.attach(finished, live=False)
    assert await here.count(finished) == 0, "readers of a finished message count locally"
    await there.leave()
    assert await here.count(mid) == 0


@pytest.mark.django_db(transaction=True)
async def test_readers_in_another_live_process_keep_a_generation(
    redis_presences: Presences,
) -> None:
    from streaming.presence.redis import READERS_PREFIX, RedisPresence

    presence, generation, _ = await generating_here(redis_presences, grace=0.0)
    mid = generation.message_id
    there = redis_presences.make()
    await there.beat()
    await there.attach(mid)
    assert not await presence.attach(mid)
    assert isinstance(presence, RedisPresence)
    counts = await presence.redis.hgetall(READERS_PREFIX + mid)
    assert counts == {there.worker_id.encode(): b"1"}, "the reader here is counted here only"
    await presence.detach(mid, shared=False)
    assert generation.cancel_reason is None, "a reader is attached in another process"
    await there.leave()  # that process died: its count no longer keeps the answer alive
    await generation.recount_readers()
    assert await status_at_end(generation) == Status.ABANDONED


async def test_counts_lost_with_redis_are_written_again_by_the_next_beat(
    redis_presences: Presences,
) -> None:
    """Redis restarted empty: every count and heartbeat gone. The next beat of each
    process finds its heartbeat gone and writes its counts whole, including the changes
    made meanwhile, which landed on nothing (a reader leaving: a count of -1)."""
    from streaming.presence.redis import READERS_PREFIX, RedisPresence, worker_key

    here, there = redis_presences.make(), redis_presences.make()
    assert isinstance(there, RedisPresence)
    mid, other = redis_presences.message_id(), redis_presences.message_id()
    await there.beat()
    for message_id in (mid, mid, mid, other):
        await there.attach(message_id)
    assert await here.count(mid) == 3
    await there.redis.delete(
        READERS_PREFIX + mid, READERS_PREFIX + other, worker_key(there.worker_id)
    )
    await there.detach(mid, shared=True)  # lands on nothing: the field is -1
    await there.detach(other, shared=True)
    assert await here.count(mid) == 0
    await there.beat()
    assert await here.count(mid) == 2
    assert await here.count(other) == 0
    assert await there.redis.hgetall(READERS_PREFIX + mid) == {there.worker_id.encode(): b"2"}
    await there.beat()  # the heartbeat was there: nothing written again
    await there.detach(mid, shared=True)
    assert await here.count(mid) == 1


async def test_changes_made_while_counts_are_restored_count_once(
    redis_presences: Presences,
) -> None:
    """Readers attaching and leaving while a beat writes the counts whole: each change
    is in the whole count or lands after it, never both, never neither."""
    from streaming.presence.redis import READERS_PREFIX, RedisPresence, worker_key

    here, there = redis_presences.make(), redis_presences.make()
    assert isinstance(there, RedisPresence)
    mid = redis_presences.message_id()
    await there.beat()
    for _ in range(10):
        await there.attach(mid)
    await there.redis.delete(READERS_PREFIX + mid, worker_key(there.worker_id))
    changes = [there.attach(mid) for _ in range(20)]
    changes += [there.detach(mid, shared=True) for _ in range(15)]
    # The beat in the middle of the changes, some sent before it, some after.
    await asyncio.gather(*changes[:12], there.beat(), *changes[12:])
    assert await here.count(mid) == 10 + 20 - 15
    assert await there.redis.hgetall(READERS_PREFIX + mid) == {there.worker_id.encode(): b"15"}


async def test_a_burst_past_the_connection_bound_waits_its_turn() -> None:
    """Many readers attaching at once on a small pool queue for a connection; none fails
    (an exhausted pool used to raise at once, ending those readers' streams)."""
    if not REDIS_URL:
        pytest.skip("needs REDIS_URL")
    from streaming.presence.redis import RedisPresence

    presence = RedisPresence(
        location=REDIS_URL,
        worker_id=f"tests:presence:{uuid.uuid4().hex}",
        listener=Generations(MemoryControl()),
        max_connections=2,
    )
    message_ids = [str(uuid.uuid4()) for _ in range(50)]
    try:
        await asyncio.wait_for(
            asyncio.gather(*(presence.attach(m, live=True) for m in message_ids)), HANG
        )
        counts = await asyncio.gather(*(presence.count(m) for m in message_ids))
        assert counts == [1] * len(message_ids)
    finally:
        for message_id in message_ids:
            await presence.detach(message_id, shared=True, ended=True)
        await presence.close()
