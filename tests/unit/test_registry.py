"""The registry of this process's generations: membership, and where cancels and reader
counts go (a call for a local generation, a control message to every process for any
other).

Control is real: in memory (every process is this one) and, with ``REDIS_URL``, Redis
pub/sub on a channel of the test's own, listened to by a handler that keeps what it gets.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from streaming.control.base import Control
from streaming.control.memory import MemoryControl
from streaming.generation import Backends, Generation
from streaming.hub import FOLLOWED_TAIL_EVENTS, TAIL_EVENTS, Hub
from streaming.presence.memory import MemoryPresence
from streaming.registry import CANCEL, READERS, Generations
from streaming.streamlog.memory import MemoryStreamLog
from streaming.termination import Status
from tests.unit.scripted import (
    Answer,
    Gate,
    Received,
    ScriptedEngine,
    Wire,
    add_segment,
    chunk,
    create_answer,
    load_message,
    plan_for,
)

REDIS_URL = os.environ.get("REDIS_URL", "")
WORKER = "tests:registry:1"
HANG = 10.0


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.skipif(not REDIS_URL, reason="needs REDIS_URL")),
    ]
)
async def wire(request: pytest.FixtureRequest) -> AsyncIterator[Wire]:
    made = Wire(request.param, REDIS_URL)
    yield made
    await made.close()


@dataclass
class Process:
    """The parts of one serving process that the registry deals with."""

    generations: Generations
    presence: MemoryPresence
    backends_for: Any

    def launch(self, answer: Answer, engine: ScriptedEngine, grace: float = 60.0) -> Generation:
        return self.generations.launch(plan_for(answer, grace=grace), self.backends_for(engine))


def process(control: Control | None = None) -> Process:
    log = MemoryStreamLog()
    hub = Hub(log)
    generations = Generations(MemoryControl() if control is None else control)
    presence = MemoryPresence(worker_id=WORKER, listener=generations)

    def backends_for(engine: ScriptedEngine) -> Backends:
        return Backends(log, hub, presence, engine)

    return Process(generations, presence, backends_for)


async def running(here: Process, answer: Answer, grace: float = 60.0) -> tuple[Generation, Gate]:
    """A generation of ``answer`` waiting on its engine."""
    gate = Gate()
    generation = here.launch(answer, ScriptedEngine([chunk("a"), gate, chunk("b")]), grace)
    await asyncio.wait_for(gate.reached.wait(), HANG)
    return generation, gate


async def ended(generation: Generation) -> str:
    await asyncio.wait_for(generation.finished.wait(), HANG)
    return (await load_message(generation.message_id)).status


# --- membership ------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
async def test_a_generation_is_registered_until_it_ends() -> None:
    here = process()
    answer = await create_answer(WORKER)
    generation, gate = await running(here, answer)
    registry = here.generations
    assert registry.get(answer.message_id) is generation
    assert registry.streaming(answer.message_id) is generation
    assert len(registry) == 1 and list(registry) == [generation]
    assert registry.generating(answer.message_id)
    gate.open()
    await asyncio.wait_for(generation.finished.wait(), HANG)
    # Left the registry before `finished` was set: a waiter never sees it registered.
    assert registry.get(answer.message_id) is None
    assert registry.streaming(answer.message_id) is None
    assert len(registry) == 0 and list(registry) == []
    assert not registry.generating(answer.message_id)
    assert (await load_message(answer.message_id)).status == Status.COMPLETE


@pytest.mark.django_db(transaction=True)
async def test_a_later_generation_of_the_message_keeps_its_place() -> None:
    """The end of an earlier generation of a message removes only itself."""
    here = process()
    answer = await create_answer(WORKER)
    generation, gate = await running(here, answer)
    registry = here.generations
    newer = Generation(generation.plan, generation.backends)
    registry.running[answer.message_id] = newer
    gate.open()
    await asyncio.wait_for(generation.finished.wait(), HANG)
    assert registry.get(answer.message_id) is newer


# --- cancel ----------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
async def test_a_cancel_of_a_local_generation_is_a_call(wire: Wire) -> None:
    here = process(wire.control())
    received = Received()
    await wire.listen(received)
    answer = await create_answer(WORKER)
    generation, _gate = await running(here, answer)
    await here.generations.cancel(answer.message_id, Status.CANCELLED.value)
    assert generation.cancel_reason == Status.CANCELLED, "at once, without a round trip"
    # Still registered while it ends, but no longer streaming: its record is about to change.
    assert here.generations.streaming(answer.message_id) is None
    assert await received.about(here.generations.control, answer.message_id) == []
    assert await ended(generation) == Status.CANCELLED


async def test_a_cancel_of_a_generation_elsewhere_goes_to_every_process(wire: Wire) -> None:
    here = process(wire.control())
    received = Received()
    await wire.listen(received)
    elsewhere = str(uuid.uuid4())
    await here.generations.cancel(elsewhere, Status.CANCELLED.value)
    assert await received.about(here.generations.control, elsewhere) == [
        {"type": CANCEL, "reason": Status.CANCELLED.value, "mid": elsewhere}
    ]


async def test_readers_of_a_generation_elsewhere_are_announced(wire: Wire) -> None:
    here = process(wire.control())
    received = Received()
    await wire.listen(received)
    elsewhere = str(uuid.uuid4())
    await here.generations.notify_remote(elsewhere)
    assert await received.about(here.generations.control, elsewhere) == [
        {"type": READERS, "mid": elsewhere}
    ]


@pytest.mark.django_db(transaction=True)
async def test_a_cancel_sent_by_another_process_ends_the_generation_here(wire: Wire) -> None:
    here, there = process(wire.control()), process(wire.control())
    await wire.listen(here.generations.on_control, here.generations.control)
    answer = await create_answer(WORKER)
    generation, _gate = await running(here, answer)
    assert there.generations.get(answer.message_id) is None
    await there.generations.cancel(answer.message_id, Status.CANCELLED.value)
    assert await ended(generation) == Status.CANCELLED


@pytest.mark.django_db(transaction=True)
async def test_a_cancel_of_another_segment_does_not_stop_the_one_running_here(
    wire: Wire,
) -> None:
    """A Stop of the segment its caller saw streaming, which ended as a Continue started
    the next one here, leaves that one running; it still goes to every process, one of
    which may generate the segment it names. A cancel of the segment running stops it."""
    here = process(wire.control())
    received = Received()
    await wire.listen(received)
    answer = await create_answer(WORKER)
    await add_segment(answer.message_id, 1, 1, WORKER)
    gate = Gate()
    engine = ScriptedEngine([chunk("a"), gate, chunk("b")])
    generation = here.generations.launch(
        plan_for(answer, segment_index=1), here.backends_for(engine)
    )
    await asyncio.wait_for(gate.reached.wait(), HANG)
    await here.generations.cancel(answer.message_id, Status.CANCELLED.value, segment=0)
    assert generation.cancel_reason is None
    assert await received.about(here.generations.control, answer.message_id) == [
        {"type": CANCEL, "reason": Status.CANCELLED.value, "segment": 0, "mid": answer.message_id}
    ]
    await here.generations.cancel(answer.message_id, Status.CANCELLED.value, segment=1)
    assert await ended(generation) == Status.CANCELLED


# --- control's handler -----------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
async def test_control_messages_for_other_generations_are_ignored() -> None:
    here = process()
    answer = await create_answer(WORKER)
    generation, gate = await running(here, answer, grace=0.0)
    on_control = here.generations.on_control
    await on_control({"type": CANCEL, "mid": str(uuid.uuid4()), "reason": "cancelled"})
    await on_control({"type": CANCEL, "reason": "cancelled"})
    # A cancel of another segment of the message: one a Continue starts after this one.
    await on_control(
        {"type": CANCEL, "mid": answer.message_id, "reason": "cancelled", "segment": 1}
    )
    await on_control({"type": READERS, "mid": str(uuid.uuid4())})
    await on_control({"type": "generation.unknown", "mid": answer.message_id})
    here.generations.readers_changed(str(uuid.uuid4()), 0)
    assert generation.cancel_reason is None
    gate.open()
    assert await ended(generation) == Status.COMPLETE


@pytest.mark.django_db(transaction=True)
async def test_a_cancel_message_cancels_the_generation_it_names() -> None:
    here = process()
    one, two = await create_answer(WORKER), await create_answer(WORKER)
    first, _ = await running(here, one)
    second, second_gate = await running(here, two)
    await here.generations.on_control({"type": CANCEL, "mid": one.message_id})
    assert await ended(first) == Status.CANCELLED, "the reason defaults to a user Stop"
    assert second.cancel_reason is None
    await here.generations.on_control(
        {"type": CANCEL, "mid": two.message_id, "reason": Status.INTERRUPTED.value}
    )
    assert await ended(second) == Status.INTERRUPTED
    assert not second_gate.opened.is_set()


@pytest.mark.django_db(transaction=True)
async def test_a_readers_message_counts_the_readers_again() -> None:
    here = process()
    answer = await create_answer(WORKER)
    generation, _gate = await running(here, answer, grace=0.0)
    presence = here.presence
    mid = answer.message_id
    shared = [await presence.attach(mid), await presence.attach(mid)]
    assert generation.readers_seen
    # A reader that saw the end does not notify; another process's change arrives as a
    # control message, and the generation counts again.
    await presence.detach(mid, shared=shared[0], ended=True)
    await here.generations.on_control({"type": READERS, "mid": mid})
    assert generation.cancel_reason is None, "one reader is left"
    await presence.detach(mid, shared=shared[1], ended=True)
    assert generation.cancel_reason is None
    await here.generations.on_control({"type": READERS, "mid": mid})
    assert await ended(generation) == Status.ABANDONED


@pytest.mark.django_db(transaction=True)
async def test_a_readers_message_makes_the_topic_keep_the_longer_tail() -> None:
    """Only a process with readers of the answer sends it: they follow the log, so what
    this process holds for a log that lost its tail must reach back past them."""
    here = process()
    answer = await create_answer(WORKER)
    generation, gate = await running(here, answer)
    hub = generation.backends.hub
    topic = hub.topics[answer.message_id]
    assert topic.tail == TAIL_EVENTS
    await here.generations.on_control({"type": READERS, "mid": answer.message_id})
    assert topic.tail == FOLLOWED_TAIL_EVENTS
    gate.open()
    assert await ended(generation) == Status.COMPLETE
