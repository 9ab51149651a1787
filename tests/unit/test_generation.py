"""The generation service on the in-memory backends, driven by a scripted engine.

Every termination path ends the same way: one ``done`` closing the segment, with seqs
increasing by one, and the database record saying what the log says. What a reader got
from the hub is what the log holds.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import pytest
from django.test import override_settings
from prometheus_client import REGISTRY

from streaming import database, events
from streaming.control.memory import MemoryControl
from streaming.engines.base import (
    EngineChunk,
    EngineContextFull,
    EngineError,
    EngineRequest,
    EngineTimeout,
    ToolCallDelta,
    Usage,
)
from streaming.generation import Backends, Generation, end_log
from streaming.hub import TAIL_EVENTS, Hub
from streaming.models import Segment
from streaming.presence.memory import MemoryPresence
from streaming.registry import Generations
from streaming.streamlog import Appended, LogUnreachable, StreamLog
from streaming.streamlog.memory import MemoryStreamLog
from streaming.termination import Status
from tests.unit.scripted import (
    MODEL,
    Answer,
    Do,
    Gate,
    ScriptedEngine,
    Step,
    add_segment,
    chunk,
    create_answer,
    load_message,
    load_segments,
    plan_for,
    termination_of,
    texts,
    thoughts,
)

pytestmark = pytest.mark.django_db(transaction=True)

REDIS_URL = os.environ.get("REDIS_URL", "")
WORKER = "tests:generation:1"
# Only a guard against a hang: every wait below ends on an event long before this.
HANG = 10.0


async def collect(hub: Hub, message_id: str, after: int) -> list[events.Event]:
    """What a local reader gets from the hub, until the segment's ``done``."""
    got: list[events.Event] = []
    async for batch in hub.read(message_id, after):
        assert batch is not None
        got.extend(batch)
    return got


@dataclass
class Run:
    generation: Generation
    engine: ScriptedEngine
    log: StreamLog
    hub: Hub
    reader: asyncio.Task[list[events.Event]]

    @property
    def message_id(self) -> str:
        return self.generation.message_id


async def launch(
    answer: Answer,
    script: list[Step],
    *,
    log: StreamLog | None = None,
    hub: Hub | None = None,
    **plan: object,
) -> Run:
    log = log or MemoryStreamLog()
    hub = hub or Hub(log)
    engine = ScriptedEngine(script)
    generations = Generations(MemoryControl())
    presence = MemoryPresence(worker_id=WORKER, listener=generations)
    segment_plan = plan_for(answer, **plan)  # type: ignore[arg-type]
    # The reader attaches first, so it gets every event from the generation's publishes.
    reader = asyncio.create_task(collect(hub, segment_plan.message_id, segment_plan.first_seq - 1))
    generation = generations.launch(segment_plan, Backends(log, hub, presence, engine))
    return Run(generation, engine, log, hub, reader)


async def finish(
    run: Run, *, first_seq: int = 1, base_text: str = "", base_reasoning: str = ""
) -> list[events.Event]:
    """Wait for the end and check that log, readers and record agree; the segment's events."""
    await asyncio.wait_for(run.generation.finished.wait(), HANG)
    published = await asyncio.wait_for(run.reader, HANG)
    logged = await run.log.read(run.message_id, first_seq - 1)
    seqs = [e["seq"] for e in logged]
    assert seqs == list(range(first_seq, first_seq + len(logged))), "seqs increase by one"
    kinds = [e["type"] for e in logged]
    assert kinds[0] == events.START
    assert kinds.count(events.DONE) == 1 and kinds[-1] == events.DONE, kinds
    assert published == logged, "a reader got exactly what the log holds"
    done = logged[-1]
    message = await load_message(run.message_id)
    assert message.content == base_text + "".join(texts(logged))
    assert message.reasoning == base_reasoning + "".join(thoughts(logged))
    assert message.status == done["status"]
    assert message.last_seq == done["seq"]
    assert message.termination == termination_of(done)
    assert run.generation.termination is not None
    assert run.generation.termination.as_dict() == termination_of(done)
    started = bool(run.engine.requests)  # an async generator runs from its first anext
    assert run.engine.closed.is_set() or not started, "a started engine stream is closed"
    return logged


def metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


@pytest.fixture
async def answer() -> Answer:
    return await create_answer(WORKER)


# --- natural ends ------------------------------------------------------------------------
async def test_a_complete_answer(answer: Answer) -> None:
    run = await launch(
        answer,
        [chunk("Hello"), chunk(", "), chunk("world"), chunk(finish_reason="stop")],
    )
    logged = await finish(run)
    assert logged[0] == events.start(1, message_id=answer.message_id, segment=0, model=MODEL)
    assert "".join(texts(logged)) == "Hello, world"
    done = logged[-1]
    assert (done["status"], done["finish_reason"], done["stop_reason"]) == (
        Status.COMPLETE,
        "stop",
        None,
    )
    assert done["completion_tokens"] == 3
    assert "worker" not in done, "the generating host and pid are for operators only"
    assert done["segment"] == 0
    [segment] = await load_segments(answer.message_id)
    assert segment.worker == WORKER
    assert (segment.status, segment.start_offset, segment.end_offset) == (
        Status.COMPLETE,
        0,
        len("Hello, world"),
    )
    assert run.engine.requests[0].stop == []


async def test_length_truncates_and_the_usage_after_the_reason_is_kept(answer: Answer) -> None:
    run = await launch(
        answer,
        [
            chunk("one"),
            chunk(" two", finish_reason="length"),
            # vLLM sends usage after the finish reason: the generation keeps reading.
            chunk(usage=Usage(prompt_tokens=7, completion_tokens=2)),
        ],
    )
    done = (await finish(run))[-1]
    assert (done["status"], done["finish_reason"]) == (Status.TRUNCATED, "length")
    assert (done["prompt_tokens"], done["completion_tokens"]) == (7, 2)


async def test_reasoning_is_a_channel_of_its_own(answer: Answer) -> None:
    run = await launch(
        answer,
        [
            EngineChunk(reasoning="Two and ", tokens=2),
            EngineChunk(reasoning="two.", tokens=1),
            chunk("Four"),
            chunk(".", finish_reason="stop"),
            chunk(usage=Usage(prompt_tokens=5, completion_tokens=6, reasoning_tokens=3)),
        ],
        stop=["two"],  # stop strings are for the answer: the reasoning may say anything
    )
    logged = await finish(run)
    assert runs(logged) == ["start", "reasoning", "delta", "done"]
    assert ("".join(thoughts(logged)), "".join(texts(logged))) == ("Two and two.", "Four.")
    done = logged[-1]
    assert (done["status"], done["reasoning_tokens"], done["ended_in_reasoning"]) == (
        Status.COMPLETE,
        3,
        False,
    )
    assert done["reasoning_ttft_ms"] is not None and done["ttft_ms"] is not None
    assert done["reasoning_ttft_ms"] <= done["ttft_ms"]
    [segment] = await load_segments(answer.message_id)
    assert (segment.reasoning_start_offset, segment.reasoning_end_offset) == (0, 12)
    assert segment.reasoning_tokens == 3


async def test_an_answer_cut_while_reasoning_says_so(answer: Answer) -> None:
    run = await launch(
        answer, [EngineChunk(reasoning="Let me", tokens=2), chunk(finish_reason="length")]
    )
    done = (await finish(run))[-1]
    assert (done["status"], done["ended_in_reasoning"], done["ttft_ms"]) == (
        Status.TRUNCATED,
        True,
        None,
    )


async def test_a_continue_appends_to_the_reasoning_too(answer: Answer) -> None:
    await add_segment(answer.message_id, 1, 5, WORKER)
    run = await launch(
        answer,
        [EngineChunk(reasoning=" think.", tokens=1), chunk("Yes", finish_reason="stop")],
        segment_index=1,
        first_seq=5,
        base_reasoning="Let me",
    )
    await finish(run, first_seq=5, base_reasoning="Let me")
    segment = (await load_segments(answer.message_id))[-1]
    assert (segment.reasoning_start_offset, segment.reasoning_end_offset) == (6, 13)


async def test_reasoning_is_progress_for_the_stall_timeout(answer: Answer) -> None:
    loop = asyncio.get_running_loop()
    gates = [Gate() for _ in range(5)]
    script: list[Step] = []
    for gate in gates:
        script += [gate, EngineChunk(reasoning="hm ", tokens=1)]
    with override_settings(STREAMING={"STALL_TIMEOUT": 0.5}):
        run = await launch(answer, [*script, chunk("ok", finish_reason="stop")])
        # The engine thinks slowly but steadily: a token every 0.15 s, 0.75 s in all.
        for step, gate in enumerate(gates, start=1):
            loop.call_later(0.15 * step, gate.open)
        done = (await finish(run))[-1]
    assert done["status"] == Status.COMPLETE
    assert done["reasoning_tokens"] is None  # the engine did not say


async def test_tool_calls_are_streamed_and_persisted(answer: Answer) -> None:
    run = await launch(
        answer,
        [
            EngineChunk(tool_calls=(ToolCallDelta(0, id="call_1", name="get_weather"),), tokens=1),
            EngineChunk(tool_calls=(ToolCallDelta(0, arguments='{"city":'),), tokens=1),
            EngineChunk(
                tool_calls=(ToolCallDelta(0, arguments='"Paris"}'),),
                tokens=1,
                finish_reason="tool_calls",
            ),
        ],
    )
    logged = await finish(run)
    calls = [e for e in logged if e["type"] == "tool_call"]
    assert (calls[0]["id"], calls[0]["name"]) == ("call_1", "get_weather")
    assert {e["index"] for e in calls} == {0}
    assert "".join(e["arguments"] for e in calls) == '{"city":"Paris"}'
    done = logged[-1]
    assert (done["status"], done["finish_reason"]) == (Status.COMPLETE, "tool_calls")
    whole = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
        }
    ]
    assert (await load_message(answer.message_id)).tool_calls == whole
    [segment] = await load_segments(answer.message_id)
    assert segment.tool_calls == whole


async def test_a_stop_string_split_over_chunks_is_never_shown(answer: Answer) -> None:
    run = await launch(
        answer,
        [chunk("Hello E"), chunk("N"), chunk("D and more"), chunk("never read")],
        stop=["END"],
    )
    logged = await finish(run)
    assert texts(logged) == ["Hello "], "the held-back 'E' and 'N' never reach a reader"
    done = logged[-1]
    assert (done["status"], done["finish_reason"], done["stop_reason"]) == (
        Status.STOPPED,
        "stop",
        "END",
    )
    assert run.engine.steps_run == 3, "the stream is closed at the match"
    [segment] = await load_segments(answer.message_id)
    assert (segment.status, segment.stop_reason) == (Status.STOPPED, "END")
    assert (await load_message(answer.message_id)).content == "Hello "


async def test_an_answer_ended_on_its_first_chunk_counts_that_chunks_tokens(
    answer: Answer,
) -> None:
    """The usage an engine tells with its first output (what the prompt cost, taken before
    that output was counted) is a floor: the chunk's own tokens still count."""
    run = await launch(
        answer,
        [chunk("Hello", usage=Usage(prompt_tokens=9)), chunk(" world"), chunk("never read")],
        stop=["lo"],
    )
    done = (await finish(run))[-1]
    assert (done["status"], done["stop_reason"]) == (Status.STOPPED, "lo")
    assert (done["prompt_tokens"], done["completion_tokens"]) == (9, 1)
    assert (await load_message(answer.message_id)).content == "Hel"


async def test_a_held_back_prefix_that_is_no_stop_string_is_shown(answer: Answer) -> None:
    run = await launch(answer, [chunk("Hello E"), chunk("N"), chunk("x")], stop=["END"])
    logged = await finish(run)
    assert "".join(texts(logged)) == "Hello ENx"
    assert logged[-1]["status"] == Status.COMPLETE


async def test_a_prefix_held_back_at_the_end_is_real_output(answer: Answer) -> None:
    run = await launch(answer, [chunk("Hello E"), chunk("N", finish_reason="stop")], stop=["END"])
    logged = await finish(run)
    assert "".join(texts(logged)) == "Hello EN"
    assert (logged[-1]["status"], logged[-1]["stop_reason"]) == (Status.COMPLETE, None)


@pytest.mark.parametrize("stop_reason", ["</answer>", 50256])
async def test_a_stop_string_the_engine_matched(answer: Answer, stop_reason: str | int) -> None:
    run = await launch(answer, [chunk("42"), chunk(finish_reason="stop", stop_reason=stop_reason)])
    done = (await finish(run))[-1]
    assert (done["status"], done["stop_reason"]) == (Status.STOPPED, stop_reason)
    [segment] = await load_segments(answer.message_id)
    assert segment.stop_reason == str(stop_reason)


async def test_a_character_split_over_token_bytes_is_emitted_whole(answer: Answer) -> None:
    rocket = "🚀".encode()
    assert len(rocket) == 4
    script: list[Step] = [chunk(token_bytes=b"A", tokens=1)]
    script += [chunk(token_bytes=rocket[i : i + 1], tokens=1) for i in range(4)]
    script += [chunk(token_bytes=b"!", tokens=1), chunk(token_bytes=rocket[:2], tokens=1)]
    script += [chunk(token_bytes=rocket[2:], tokens=1, finish_reason="stop")]
    run = await launch(answer, script)
    logged = await finish(run)
    shown = texts(logged)
    assert "".join(shown) == "A🚀!🚀"
    assert all("\ufffd" not in text for text in shown)
    assert sum(text.count("🚀") for text in shown) == 2, "each rocket in one piece"
    assert logged[-1]["completion_tokens"] == 8


# --- failures ------------------------------------------------------------------------------
async def test_an_engine_error_mid_stream(answer: Answer) -> None:
    run = await launch(
        answer,
        [chunk("partial"), EngineError("upstream exploded", "EngineError", 502), chunk("no")],
    )
    logged = await finish(run)
    assert [e["type"] for e in logged] == ["start", "delta", "error", "done"]
    assert logged[2]["error"] == {
        "message": "upstream exploded",
        "type": "EngineError",
        "code": 502,
    }
    done = logged[-1]
    assert (done["status"], done["error_type"], done["error_code"]) == (
        Status.ERROR,
        "EngineError",
        "502",
    )
    assert done["error_message"] == "upstream exploded"
    assert (await load_message(answer.message_id)).content == "partial"


async def test_an_engine_read_timeout_is_a_stall(answer: Answer) -> None:
    run = await launch(answer, [chunk("a"), EngineTimeout("no byte for 30 s")])
    logged = await finish(run)
    assert logged[-2]["type"] == events.ERROR
    assert (logged[-1]["status"], logged[-1]["error_type"]) == (Status.STALLED, "EngineTimeout")


async def test_an_unexpected_failure_still_ends_cleanly(answer: Answer, caplog) -> None:
    """Its text (a library's may name a server's address) goes to the operators' log; the
    record says that the server failed."""
    run = await launch(answer, [chunk("a"), RuntimeError("a bug at 10.0.0.7:6379")])
    logged = await finish(run)
    assert logged[-2]["error"]["type"] == "InternalError"
    assert (logged[-1]["status"], logged[-1]["error_message"]) == (
        Status.ERROR,
        "the server failed while generating this answer",
    )
    assert "10.0.0.7" not in str(logged) and "10.0.0.7" in caplog.text


async def test_the_engine_aborting_the_request_is_an_error(answer: Answer) -> None:
    run = await launch(answer, [chunk("cut"), chunk(finish_reason="abort")])
    done = (await finish(run))[-1]
    assert (done["status"], done["finish_reason"], done["error_type"]) == (
        Status.ERROR,
        "abort",
        "EngineAborted",
    )


async def test_a_repetition_finish_is_stopped(answer: Answer) -> None:
    run = await launch(answer, [chunk("la la"), chunk(finish_reason="repetition")])
    done = (await finish(run))[-1]
    assert (done["status"], done["finish_reason"]) == (Status.STOPPED, "repetition")


async def test_an_answer_that_fills_the_context_says_so(answer: Answer) -> None:
    full = EngineChunk(text=" end", tokens=1, finish_reason="length", context_full=True)
    run = await launch(answer, [chunk("so far"), full])
    done = (await finish(run))[-1]
    assert (done["status"], done["context_full"]) == (Status.TRUNCATED, True)


async def test_a_prompt_with_no_room_left_is_context_full(answer: Answer) -> None:
    run = await launch(answer, [EngineContextFull("the conversation fills the context")])
    logged = await finish(run)
    done = logged[-1]
    assert logged[-2]["error"]["type"] == "ContextFull"
    assert (done["status"], done["error_type"], done["context_full"]) == (
        Status.ERROR,
        "ContextFull",
        True,
    )


async def test_an_engine_that_goes_silent_stalls(answer: Answer) -> None:
    never = Gate()
    with override_settings(STREAMING={"STALL_TIMEOUT": 0.05}):
        run = await launch(answer, [chunk("so far"), never, chunk("never")])
        logged = await finish(run)
    done = logged[-1]
    assert (done["status"], done["error_type"]) == (Status.STALLED, "Stalled")
    assert texts(logged) == ["so far"]
    assert never.reached.is_set() and not never.opened.is_set()


# --- cancels -------------------------------------------------------------------------------
async def test_a_cancel_while_waiting_on_the_engine(answer: Answer) -> None:
    gate = Gate()
    run = await launch(answer, [chunk("thinking"), gate, chunk("never")])
    await asyncio.wait_for(gate.reached.wait(), HANG)
    before = metric("chat_cancels_total")
    assert run.generation.cancel(Status.CANCELLED.value)
    assert not run.generation.cancel(Status.CANCELLED.value), "a second cancel is refused"
    logged = await finish(run)
    assert logged[-1]["status"] == Status.CANCELLED
    assert texts(logged) == ["thinking"]
    assert metric("chat_cancels_total") == before + 1
    assert not gate.opened.is_set()
    assert not run.generation.cancel(Status.CANCELLED.value), "nothing to cancel once ended"


async def test_a_cancel_before_the_first_event_lets_it_out_whole(answer: Answer) -> None:
    run = await launch(answer, [chunk("never")])
    # The task has not run yet: the cancel cannot interrupt anything, only be noticed.
    assert run.generation.cancel(Status.CANCELLED.value)
    logged = await finish(run)
    assert [e["type"] for e in logged] == ["start", "done"]
    assert logged[-1]["status"] == Status.CANCELLED
    assert run.engine.requests == [], "the engine was never asked for a token"


def redis_log() -> StreamLog:
    from streaming.streamlog.redis import RedisStreamLog

    return RedisStreamLog(REDIS_URL, follow_block_ms=100)


on_each_log = pytest.mark.parametrize(
    "backend",
    [
        "memory",
        pytest.param("redis", marks=pytest.mark.skipif(not REDIS_URL, reason="needs REDIS_URL")),
    ],
)


@on_each_log
async def test_a_cancel_never_cuts_an_event(answer: Answer, backend: str) -> None:
    """The cancel is scheduled by the engine as it hands over a chunk, so it lands while
    that chunk is on its way to the log: it stops the engine, and what was produced
    before it is in the log whole, as the record says."""
    log = MemoryStreamLog() if backend == "memory" else redis_log()
    holder: list[Generation] = []
    after = Gate()

    def cancel_soon() -> None:
        asyncio.get_running_loop().call_soon(holder[0].cancel, Status.CANCELLED.value)

    try:
        run = await launch(
            answer,
            [chunk("one "), Do(cancel_soon), chunk("two " * 50), after, chunk("three")],
            log=log,
        )
        holder.append(run.generation)
        logged = await finish(run)
    finally:
        await log.delete(answer.message_id)
        await log.close()
    assert "".join(texts(logged)) == "one " + "two " * 50
    assert logged[-1]["status"] == Status.CANCELLED
    assert after.reached.is_set() and run.engine.steps_run == 4, "ended in the next wait"


@on_each_log
async def test_a_generation_whose_conversation_was_deleted_stops_at_its_next_write(
    answer: Answer, backend: str
) -> None:
    """A conversation deleted under an answer whose Stop never reached it (sent before
    its generation started, or to a process that missed it): the next write finds the
    log deleted, and the generation stops its engine there, puts nothing back and writes
    no record; its reader ends with the delete's ``done``."""
    from streaming.models import Conversation

    log = MemoryStreamLog() if backend == "memory" else redis_log()
    paused, never = Gate(), Gate()
    try:
        run = await launch(
            answer, [chunk("one "), paused, chunk("two "), never, chunk("three")], log=log
        )
        await asyncio.wait_for(paused.reached.wait(), HANG)
        await asyncio.wait_for(run.generation.outbox.drain(), HANG)
        await database.run(lambda: Conversation.objects.filter(id=answer.conversation_id).delete())
        await log.delete(answer.message_id)
        paused.open()
        await asyncio.wait_for(run.generation.finished.wait(), HANG)
        published = await asyncio.wait_for(run.reader, HANG)
        assert await log.read(answer.message_id, 0) == [], "nothing put back"
    finally:
        await log.close()
    assert never.reached.is_set() and run.engine.steps_run == 4, "stopped in the engine's wait"
    termination = run.generation.termination
    assert termination is not None
    assert (termination.status, termination.error_type) == (Status.CANCELLED, "Deleted")
    assert published[-1]["type"] == events.DONE and published[-1]["error_type"] == "Deleted"


@pytest.mark.skipif(not REDIS_URL, reason="needs REDIS_URL")
@pytest.mark.parametrize("lost_before", ["a delta", "the done"])
async def test_a_log_that_lost_its_tail_gets_back_what_this_process_holds(
    answer: Answer, lost_before: str
) -> None:
    """Redis restarting empty between two appends (before a delta: the outbox's next
    write; before the done: the terminal append): the append finds the log short, the
    generation puts back the events its hub still holds, and both a reader in this
    process and one following the log from another process get every event once; the log
    is whole again and the record matches it."""
    import redis.asyncio as aioredis

    from streaming.streamlog.redis import stream_key

    log, other_log = redis_log(), redis_log()
    raw = aioredis.Redis.from_url(REDIS_URL)
    paused = Gate()
    script: list[Step] = [chunk("one "), chunk("two "), paused, chunk("three")]
    if lost_before == "the done":
        script = [chunk("one "), chunk("two "), chunk("three"), paused]
    try:
        run = await launch(answer, script, log=log)
        remote = Hub(other_log)
        caught_up = asyncio.Event()
        remote_got: list[events.Event] = []

        async def follow_remotely() -> None:
            async for batch in remote.read(run.message_id, 0):
                assert batch is not None
                remote_got.extend(batch)
                if remote_got[-1]["seq"] >= await log.last_seq(run.message_id):
                    caught_up.set()

        following = asyncio.create_task(follow_remotely())
        await asyncio.wait_for(paused.reached.wait(), HANG)
        await asyncio.wait_for(run.generation.outbox.drain(), HANG)
        await asyncio.wait_for(caught_up.wait(), HANG)
        assert await raw.delete(stream_key(run.message_id)) == 1  # the restart's effect
        paused.open()
        logged = await finish(run)
        await asyncio.wait_for(following, HANG)
    finally:
        await log.delete(answer.message_id)
        await raw.aclose()
        await log.close()
        await other_log.close()
    assert "".join(texts(logged)) == "one two three"
    assert remote_got == logged, "the other process's reader got every event once"


@pytest.mark.skipif(not REDIS_URL, reason="needs REDIS_URL")
async def test_a_log_that_lost_its_tail_gets_back_every_event_the_database_lacks(
    answer: Answer,
) -> None:
    """More events than the topic's tail, its reader caught up, and no write-behind yet:
    the topic still holds every event the database does not, so after Redis restarts
    empty the log is whole again from its first event, and a reader from the start of
    the answer gets all of it."""
    import redis.asyncio as aioredis

    from streaming.streamlog.redis import stream_key

    log = redis_log()
    raw = aioredis.Redis.from_url(REDIS_URL)
    gates = [Gate() for _ in range(3 * TAIL_EVENTS)]
    script: list[Step] = []
    for n, gate in enumerate(gates):
        script += [chunk(f"t{n} "), gate]
    script.append(chunk("end"))
    try:
        run = await launch(answer, script, log=log)
        for gate in gates:  # one event per chunk: each is appended before the next comes
            await asyncio.wait_for(gate.reached.wait(), HANG)
            await asyncio.wait_for(run.generation.outbox.drain(), HANG)
            if gate is gates[-1]:
                assert await raw.delete(stream_key(run.message_id)) == 1  # the restart
            gate.open()
        logged = await finish(run)
        whole = await log.read(run.message_id, 0)
    finally:
        await log.delete(answer.message_id)
        await raw.aclose()
        await log.close()
    assert [e["seq"] for e in whole] == list(range(1, logged[-1]["seq"] + 1))
    assert "".join(texts(whole)) == "".join(f"t{n} " for n in range(len(gates))) + "end"


class HeldLog(MemoryStreamLog):
    """A log whose appends wait while ``gate`` is closed (a slow Redis); ``entered`` is
    set when an append is waiting there."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.appends = 0
        self._held: set[asyncio.Task[None]] = set()

    def submit(
        self,
        message_id: str,
        batch: list[events.Event],
        appended: Appended,
        *,
        contiguous: bool = False,
    ) -> None:
        self.appends += 1
        self.entered.set()

        async def when_open() -> None:
            await self.gate.wait()
            super(HeldLog, self).submit(message_id, batch, appended, contiguous=contiguous)

        task = asyncio.create_task(when_open())
        self._held.add(task)
        task.add_done_callback(self._held.discard)


async def test_a_slow_log_never_holds_up_the_engine(answer: Answer) -> None:
    """While an append waits on the log, the engine is read on: what it produced
    meanwhile goes out as one event when the log answers, seqs contiguous."""
    log = HeldLog()
    written, reading = Gate(), Gate()
    script = [chunk("a"), written, *[chunk(f" {n}") for n in range(20)], reading, chunk()]
    run = await launch(answer, script, log=log)
    await asyncio.wait_for(written.reached.wait(), HANG)
    await asyncio.wait_for(log.entered.wait(), HANG)  # the start and "a" are on their way
    written.open()
    await asyncio.wait_for(reading.reached.wait(), HANG)
    assert run.engine.steps_run == 23, "every chunk was read while the append waited"
    assert log.appends == 1
    log.gate.set()
    reading.open()
    logged = await finish(run)
    assert texts(logged) == ["a", "".join(f" {n}" for n in range(20))]


async def test_the_write_behind_never_counts_text_still_on_its_way_to_the_log(
    answer: Answer,
) -> None:
    """A partial taken while a batch is being appended reaches the seq of the text it
    holds: a record claiming the batch's seq without its text would lose that text when
    the reaper splices the log's events after the seq onto it."""
    log = HeldLog()
    log.gate.set()
    first, second = Gate(), Gate()
    run = await launch(answer, [chunk("Hello"), first, chunk(" there"), second], log=log)
    await asyncio.wait_for(first.reached.wait(), HANG)
    await asyncio.wait_for(run.generation.outbox.drain(), HANG)
    before = run.generation.partial()
    assert before is not None and before.content == "Hello"
    log.gate.clear()
    log.entered.clear()
    first.open()
    await asyncio.wait_for(second.reached.wait(), HANG)
    await asyncio.wait_for(log.entered.wait(), HANG)  # " there" is on its way
    assert run.generation.partial() is None, "nothing more is in the log yet"
    log.gate.set()
    await asyncio.wait_for(run.generation.outbox.drain(), HANG)
    after = run.generation.partial()
    assert after is not None and after.content == "Hello there"
    assert after.last_seq == before.last_seq + 1
    second.open()
    await finish(run)


async def first_text(hub: Hub, message_id: str) -> str:
    async for batch in hub.read(message_id, 0):
        for event in batch or []:
            if event["type"] == events.DELTA:
                return str(event["text"])
    raise AssertionError("the segment ended without text")


@override_settings(STREAMING={"COALESCE_WINDOW": 30.0})
async def test_the_window_never_delays_the_first_text(answer: Answer) -> None:
    """With a window far longer than the test, the first text still reaches readers at
    once; text after it waits for the window, or for the end, which drains it."""
    first, second = Gate(), Gate()
    run = await launch(answer, [chunk("first"), first, chunk(" second"), second, chunk(" end")])
    await asyncio.wait_for(first.reached.wait(), HANG)
    assert await asyncio.wait_for(first_text(run.hub, answer.message_id), HANG) == "first"
    first.open()
    await asyncio.wait_for(second.reached.wait(), HANG)
    second.open()
    logged = await finish(run)
    assert texts(logged) == ["first", " second end"], "held for the window, then drained"


def runs(logged: list[events.Event]) -> list[str]:
    """The event types of ``logged`` with repeats collapsed (coalescing decides how many
    events a run of text is, not what it says)."""
    return [kind for kind, _ in itertools.groupby(e["type"] for e in logged)]


# --- readers leaving -----------------------------------------------------------------------
async def test_the_last_reader_leaving_abandons_it(answer: Answer) -> None:
    gate = Gate()
    run = await launch(answer, [chunk("for nobody"), gate, chunk("never")], grace=0.0)
    await asyncio.wait_for(gate.reached.wait(), HANG)
    before = metric("chat_abandons_total")
    run.generation.readers_changed(1)
    assert run.generation.cancel_reason is None
    run.generation.readers_changed(0)
    logged = await finish(run)
    assert logged[-1]["status"] == Status.ABANDONED
    assert metric("chat_abandons_total") == before + 1


async def test_the_grace_period_asks_presence_again(answer: Answer) -> None:
    gate = Gate()
    run = await launch(answer, [chunk("x"), gate, chunk("never")], grace=0.01)
    await asyncio.wait_for(gate.reached.wait(), HANG)
    run.generation.readers_changed(2)
    run.generation.readers_changed(0)
    assert run.generation.cancel_reason is None, "not before the grace period"
    # Presence (in memory: this process) has no reader of it: the recheck abandons it.
    logged = await finish(run)
    assert logged[-1]["status"] == Status.ABANDONED


async def test_a_generation_that_never_had_a_reader_is_not_abandoned(answer: Answer) -> None:
    gate = Gate()
    run = await launch(answer, [chunk("for later"), gate, chunk(" reading")], grace=0.0)
    await asyncio.wait_for(gate.reached.wait(), HANG)
    before = metric("chat_abandons_total")
    run.generation.readers_changed(0)
    assert run.generation.cancel_reason is None
    gate.open()
    logged = await finish(run)
    assert logged[-1]["status"] == Status.COMPLETE
    assert texts(logged) == ["for later", " reading"]
    assert metric("chat_abandons_total") == before


# --- segments and ownership ----------------------------------------------------------------
@pytest.mark.parametrize("owner", ["appended", "late", "never"])
async def test_a_continue_follows_the_done_its_segment_ended_with(
    answer: Answer, owner: str
) -> None:
    """A Continue starts once the previous segment's record is final, which its owner
    writes before it appends the `done`: the new segment's events go after that `done`,
    whether the owner appended it first (``appended``), appends it after the Continue's
    first write (``late``: it then finds it there) or never does (``never``: its process
    was killed in between). Either way the log holds it once, before the new `start`."""
    log = MemoryStreamLog()
    first = await launch(answer, [chunk("Once upon"), chunk(finish_reason="length")], log=log)
    done = (await finish(first))[-1]
    if owner != "appended":
        # The log as it was between the owner's record and its `done`.
        held = await log.read(answer.message_id)
        log = MemoryStreamLog()
        await log.append(answer.message_id, [e for e in held if e["seq"] < done["seq"]])
    await add_segment(answer.message_id, 1, done["seq"] + 1, WORKER)
    plan = {
        "segment_index": 1,
        "first_seq": done["seq"] + 1,
        "base_text": "Once upon",
        "previous_done": done,
    }
    second = await launch(answer, [chunk(" a time"), chunk(finish_reason="stop")], log=log, **plan)
    await finish(second, first_seq=done["seq"] + 1, base_text="Once upon")
    if owner == "late":
        await end_log(log, first.hub, answer.message_id, done)
    everything = await log.read(answer.message_id)
    assert [e["seq"] for e in everything] == list(range(1, len(everything) + 1))
    dones = [e for e in everything if e["type"] == events.DONE]
    assert [e["segment"] for e in dones] == [0, 1]
    assert dones[0] == done


async def test_each_segment_ends_with_exactly_one_done(answer: Answer) -> None:
    log = MemoryStreamLog()
    first = await launch(answer, [chunk("Once upon"), chunk(finish_reason="length")], log=log)
    done = (await finish(first))[-1]
    base = "Once upon"
    await add_segment(answer.message_id, 1, done["seq"] + 1, WORKER)
    second = await launch(
        answer,
        [chunk(" a time"), chunk(finish_reason="stop")],
        log=log,
        segment_index=1,
        first_seq=done["seq"] + 1,
        base_text=base,
    )
    logged = await finish(second, first_seq=done["seq"] + 1, base_text=base)
    assert logged[0]["segment"] == 1 and logged[-1]["segment"] == 1
    everything = await log.read(answer.message_id)
    assert [e["seq"] for e in everything] == list(range(1, len(everything) + 1))
    assert [e["type"] for e in everything].count(events.DONE) == 2
    message = await load_message(answer.message_id)
    assert (message.content, message.status) == ("Once upon a time", Status.COMPLETE)
    segments = await load_segments(answer.message_id)
    assert [(s.status, s.start_offset, s.end_offset) for s in segments] == [
        (Status.TRUNCATED, 0, 9),
        (Status.COMPLETE, 9, 16),
    ]


async def test_a_final_record_written_by_someone_else_gets_no_second_done(
    answer: Answer,
) -> None:
    gate = Gate()
    log = MemoryStreamLog()
    run = await launch(answer, [chunk("x"), gate], log=log)
    await asyncio.wait_for(gate.reached.wait(), HANG)
    # A reaper elsewhere finalised the segment meanwhile (and owns its terminal event).
    await database.run(
        lambda: Segment.objects.filter(message_id=answer.message_id).update(
            status=Status.INTERRUPTED
        )
    )
    gate.open()
    await asyncio.wait_for(run.generation.finished.wait(), HANG)
    run.reader.cancel()
    logged = await log.read(answer.message_id)
    assert [e["type"] for e in logged] == ["start", "delta"]
    message = await load_message(answer.message_id)
    assert message.status == Status.STREAMING, "the generation did not overwrite the record"


async def test_a_final_record_left_to_a_reaper_is_tried_no_more(
    answer: Answer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its record is tried again while the database cannot be reached; once its process
    stops without it (``leave_to_reaper``: a SIGTERM's drain ran out) the try under way
    is no longer waited for and none follows: the generation ends, with no ``done`` (a
    reaper's ends the answer). The tries had kept its process from stopping."""
    from django.db import OperationalError

    from streaming.persistence import finalize_segment

    tries = 0
    hanging = asyncio.Event()
    run_call = database.run

    async def unreachable(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal tries
        if fn is not finalize_segment:
            return await run_call(fn, *args, **kwargs)
        tries += 1
        if tries == 1:
            raise OperationalError("connection refused")
        hanging.set()
        await asyncio.Event().wait()  # a try the database never answers

    monkeypatch.setattr(database, "run", unreachable)
    run = await launch(answer, [chunk("so far")])
    await asyncio.wait_for(hanging.wait(), HANG)
    run.generation.leave_to_reaper()
    await asyncio.wait_for(run.generation.finished.wait(), HANG)
    run.reader.cancel()
    assert tries == 2
    logged = await run.log.read(answer.message_id)
    assert [e["type"] for e in logged] == ["start", "delta"], "no done: the reaper's comes"
    monkeypatch.undo()
    message = await load_message(answer.message_id)
    assert message.status == Status.STREAMING, "left for the reaper to end"


async def test_two_answers_are_independent() -> None:
    log = MemoryStreamLog()
    hub = Hub(log)
    one, two = await create_answer(WORKER), await create_answer(WORKER)
    gate = Gate()
    slow = await launch(one, [chunk("slow"), gate, chunk(" end")], log=log, hub=hub)
    fast = await launch(two, [chunk("fast")], log=log, hub=hub)
    assert texts(await finish(fast)) == ["fast"]
    assert not slow.generation.finished.is_set()
    gate.open()
    assert texts(await finish(slow)) == ["slow", " end"]


# --- known defects (strict: they fail loudly once fixed, to be turned into plain tests) ----
class RefusingEngine(ScriptedEngine):
    """An engine whose ``stream`` checks the request before returning its generator, as
    ``SimulatedEngine.stream`` does ("Validate now (ValueError)")."""

    def stream(self, request: EngineRequest) -> AsyncGenerator[EngineChunk, None]:
        self.requests.append(request)
        raise EngineError("the request was refused", "EngineError", 400)


async def test_an_engine_refusing_the_request_up_front_still_ends_it(answer: Answer) -> None:
    log = MemoryStreamLog()
    hub = Hub(log)
    generations = Generations(MemoryControl())
    presence = MemoryPresence(worker_id=WORKER, listener=generations)
    engine = RefusingEngine([])
    generation = generations.launch(plan_for(answer), Backends(log, hub, presence, engine))
    assert generation.task is not None
    await asyncio.wait([generation.task], timeout=HANG)
    crashed = None if generation.task.cancelled() else generation.task.exception()
    assert crashed is None, f"the generation task died: {crashed!r}"
    assert generation.finished.is_set()
    assert answer.message_id not in generations.running
    message = await load_message(answer.message_id)
    assert message.status == Status.ERROR


async def test_local_readers_get_the_done_of_whoever_finalised_the_segment(
    answer: Answer,
) -> None:
    gate = Gate()
    log = MemoryStreamLog()  # stands for a log shared between processes
    hub = Hub(log)
    got: list[events.Event] = []

    async def read() -> None:
        async for batch in hub.read(answer.message_id, 0, idle_timeout=0.05):
            got.extend(batch or [])

    reader = asyncio.create_task(read())
    run = await launch(answer, [chunk("x"), gate], log=log, hub=hub)
    await asyncio.wait_for(gate.reached.wait(), HANG)
    # Another process's reaper finalised the segment and appended its `done`.
    await database.run(
        lambda: Segment.objects.filter(message_id=answer.message_id).update(
            status=Status.INTERRUPTED
        )
    )
    await log.append(
        answer.message_id,
        [events.done(3, segment=0, termination={"status": Status.INTERRUPTED.value})],
    )
    gate.open()
    await asyncio.wait_for(run.generation.finished.wait(), HANG)
    await asyncio.wait_for(reader, HANG)
    run.reader.cancel()
    assert got and got[-1]["type"] == events.DONE, [e["type"] for e in got]


class LostAnswerLog(MemoryStreamLog):
    """A log whose second append is taken, and answered as failed (``LogUnreachable``):
    Redis applied it, and its reply never came back before the log gave up."""

    def __init__(self) -> None:
        super().__init__()
        self.appends = 0

    def submit(
        self,
        message_id: str,
        batch: list[events.Event],
        appended: Appended,
        *,
        contiguous: bool = False,
    ) -> None:
        self.appends += 1
        if self.appends != 2:
            super().submit(message_id, batch, appended, contiguous=contiguous)
            return

        def lost(error: BaseException | None) -> None:
            appended(LogUnreachable("the event log could not be reached for 60 s"))

        super().submit(message_id, batch, lost, contiguous=contiguous)


async def test_a_write_whose_answer_was_lost_is_read_back_and_the_done_goes_after_it(
    answer: Answer,
) -> None:
    """The log took a batch and the writer was told it failed: the answer ends as an
    error in the log's words (not as the engine ended it), the text the log holds is
    the record's, and the ``done`` comes after that batch (it took the batch's seq, and
    its append's retry took it for written: readers never got a ``done``)."""
    log = LostAnswerLog()
    first = Gate()
    run = await launch(answer, [chunk("one "), first, chunk("two "), chunk("three")], log=log)
    await asyncio.wait_for(first.reached.wait(), HANG)
    await asyncio.wait_for(run.generation.outbox.drain(), HANG)
    first.open()
    await asyncio.wait_for(run.generation.finished.wait(), HANG)
    logged = await log.read(run.message_id, 0)
    assert [e["type"] for e in logged][-1] == events.DONE
    assert [e["seq"] for e in logged] == list(range(1, len(logged) + 1)), "contiguous"
    done = logged[-1]
    assert (done["status"], done["error_type"]) == (Status.ERROR, "InternalError")
    assert "could not be reached" in done["error_message"]
    message = await load_message(run.message_id)
    assert message.content == "".join(texts(logged)) == "one two three"
    assert message.last_seq == done["seq"]
