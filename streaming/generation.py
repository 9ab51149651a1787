"""The generation service: the one code path that runs a generation for every transport.

prompt -> engine -> incremental UTF-8 detokenisation -> stop-sequence hold-back ->
outbox (coalesced, then the event log and local fan-out) -> write-behind persistence ->
final record + ``done``.
The model's reasoning, when the engine splits it off, is a channel of its own: ``reasoning``
events beside the answer's ``delta`` events, persisted apart (stop sequences apply to the
answer only). Tool calls the engine's parser finds are ``tool_call`` events, persisted on
the segment and the message; the model finishes with ``tool_calls`` and the caller runs
them.

A generation is an asyncio task of the process that accepted the request. It never runs
inside a consumer handler, so a reader's disconnect is seen at once and never blocks it.
Cancellation (user Stop, every reader gone, shutdown) is a task cancel with a reason; the
engine stream is closed on the way out, which is how vLLM learns to abort.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from streaming import database, events, metrics, signals
from streaming.conf import streaming_settings
from streaming.detokenize import Detokenizer
from streaming.engines.base import (
    Engine,
    EngineChunk,
    EngineContextFull,
    EngineError,
    EngineRequest,
    ToolCallDelta,
)
from streaming.engines.catalog import Catalog
from streaming.errors import unavailable
from streaming.hub import Hub
from streaming.logcontext import stream_context
from streaming.outbox import Outbox
from streaming.persistence import Partial, finalize_segment
from streaming.presence import Presence
from streaming.stops import StopFilter
from streaming.storable import storable
from streaming.streamlog import (
    Appended,
    LogDeleted,
    LogLost,
    LogUnreachable,
    SeqConflict,
    StreamLog,
    until_appended,
)
from streaming.termination import Status, Termination

log = logging.getLogger(__name__)

# Why an answer ended ``interrupted``, whichever way its process stopped.
INTERRUPTED_WHY = "the server process generating this answer stopped"
# How a cancel reason maps onto the record.
CANCEL_STATUSES = {
    "cancelled": Status.CANCELLED,
    "abandoned": Status.ABANDONED,
    "interrupted": Status.INTERRUPTED,
}


class Cancelled(Exception):
    """Raised inside the run when a cancel arrived while an event was being emitted."""


@dataclass(slots=True)
class SegmentPlan:
    """Everything a generation needs, read from the database when the segment was created."""

    message_id: str
    conversation_id: str
    user_id: int
    segment_index: int
    first_seq: int
    base_text: str  # the message's content before this segment (Continue)
    request: EngineRequest
    base_reasoning: str = ""  # the message's reasoning before this segment
    base_tool_calls: list[dict[str, Any]] = field(default_factory=list)
    abandon_grace: float = field(default_factory=lambda: streaming_settings.ABANDON_GRACE)
    # A Continue's: the previous segment's `done`, as its final record says it, which the
    # log must hold before this segment's first events (``submit_after_done``).
    previous_done: events.Event | None = None


@dataclass(frozen=True, slots=True)
class Backends:
    """What a generation writes to and reads from, built once per process by the runtime.

    ``engine`` answers every model unless a ``catalog`` says which engine serves which."""

    log: StreamLog
    hub: Hub
    presence: Presence
    engine: Engine
    catalog: Catalog | None = None

    def engine_for(self, model: str) -> Engine:
        return self.engine if self.catalog is None else self.catalog.engine_for(model)


class Generation:
    def __init__(
        self,
        plan: SegmentPlan,
        backends: Backends,
        on_end: Callable[[Generation], None] | None = None,
    ) -> None:
        """``on_end`` is called once the generation is over, before ``finished`` is set."""
        self.plan = plan
        self.backends = backends
        self.on_end = on_end
        self.message_id = plan.message_id
        # The events on their way to the log; ``parts`` and ``reasoning_parts`` hold the
        # text and reasoning the log has (what readers can have seen), so the write-behind
        # copy and the final record never get ahead of the log.
        self.outbox = Outbox(
            self._write,
            self._written,
            first_seq=plan.first_seq,
            window=streaming_settings.COALESCE_WINDOW,
            failed=self._write_failed,
        )
        self.parts: list[str] = []
        self.reasoning_parts: list[str] = []
        # This segment's tool calls, as their pieces arrive.
        self.tool_calls = events.ToolCalls()
        # Whether the model is in its reasoning now: a Continue of an answer cut while
        # reasoning starts there.
        self.in_reasoning = bool(plan.base_reasoning) and not plan.base_text
        self.cancel_reason: str | None = None
        self.readers_seen = False
        # Made when first asked for (``finished``): most generations end unwaited for, and
        # an Event holds a deque (0.8 KB) for as long as the answer streams.
        self._finished: asyncio.Event | None = None
        self._over = False
        self.termination: Termination | None = None
        self.task: asyncio.Task[None] | None = None
        # The failure the run already ended with (``_fail``), told once.
        self._failure: Exception | None = None
        self._finalizing = False
        # Set once its process stops without its record (``leave_to_reaper``); True while
        # the record is being written (``_persist_final``).
        self._left = False
        self._persisting = False
        self._waiting_for_engine = False
        self._engine_wait_since = 0.0
        self._stalled = False
        self._stall_timer: asyncio.TimerHandle | None = None
        self._abandon_timer: asyncio.TimerHandle | None = None
        self._abandon_check: asyncio.Task[None] | None = None
        self._persisted_seq = plan.first_seq - 1
        # The seq of the last event the log holds, whose text ``parts`` hold (``_written``).
        self._logged_seq = plan.first_seq - 1
        self.started_at = time.monotonic()

    @property
    def finished(self) -> asyncio.Event:
        """Set once the generation is over (after ``on_end``)."""
        if self._finished is None:
            self._finished = asyncio.Event()
            if self._over:
                self._finished.set()
        return self._finished

    @property
    def streaming(self) -> bool:
        """Running and not asked to end: until then its record says ``streaming`` and a
        reader can follow it from the log. Once it is asked to end, its record is about to
        change (or, for a conversation being deleted, to go): readers ask the database."""
        return self.task is not None and not (self._finalizing or self._over or self.cancel_reason)

    # --- control -----------------------------------------------------------------------
    def start(self) -> None:
        # A fresh context: the task must not inherit the request's asgiref thread context
        # (its executor dies with the request, and the task outlives it).
        self.task = asyncio.create_task(
            self._run(), name=f"generation:{self.message_id}", context=contextvars.Context()
        )

    def cancel(self, reason: str) -> bool:
        """Ask the generation to end with ``reason``; False if it is already ending.

        Only a wait on the engine is interrupted: an event being appended to the log is
        never cut in half, so what readers got, the log and the record always agree.
        """
        if self._finalizing or self.task is None or self.task.done() or self.cancel_reason:
            return False
        self.cancel_reason = reason
        if reason == Status.CANCELLED:
            metrics.CANCELS.inc()
        elif reason == Status.ABANDONED:
            metrics.ABANDONS.inc()
        if self._waiting_for_engine:
            self.task.cancel()
        return True

    def leave_to_reaper(self) -> None:
        """Write no final record: its process stops without it (a SIGTERM's drain, while
        the database cannot be reached), and another process's reaper ends the answer
        from the log, as a crashed process's. A write under way is no longer waited for
        (it commits or not, as the database has it: one that commits leaves its readers
        to end from the record, which they ask for when nothing comes); none is tried
        after it. Retried for
        as long as the database was away, the record kept the process from stopping and
        its heartbeat on, so no reaper could take the answer over."""
        self._left = True
        if self._persisting and self.task is not None and not self.task.done():
            self.task.cancel()

    def readers_changed(self, count: int) -> None:
        """Called whenever the number of attached readers (all processes) may have changed."""
        if count > 0:
            self.readers_seen = True
            if self._abandon_timer is not None:
                self._abandon_timer.cancel()
                self._abandon_timer = None
            return
        if not self.readers_seen or self._abandon_timer is not None:
            return
        grace = self.plan.abandon_grace
        if grace <= 0:
            self.cancel(Status.ABANDONED.value)
            return
        loop = asyncio.get_running_loop()
        self._abandon_timer = loop.call_later(grace, self._abandon_due)

    def followed_elsewhere(self) -> None:
        """A process other than this one has (or had) readers of this answer: they read
        the log, so what this process holds must cover them if the log loses its tail."""
        self.backends.hub.keep_for_followers(self.message_id)

    async def recount_readers(self) -> None:
        """Count the readers in every process again (another process's count changed)."""
        self.readers_changed(await self.backends.presence.count(self.message_id))

    async def left_unread(self) -> None:
        """The caller that asked for this answer in order to read it (a ``/v1`` call) left
        before it began reading: as if its reader had come and gone. Abandoned (after the
        grace) unless another reader reads it, the page following the conversation say,
        whose leaving then does it; a generation heeds no count before it saw a reader."""
        self.readers_seen = True
        await self.recount_readers()

    def _abandon_due(self) -> None:
        self._abandon_timer = None
        self._abandon_check = asyncio.create_task(
            self._recheck_abandon(), name="abandon-check", context=contextvars.Context()
        )

    def _watch_stall(self) -> None:
        """One timer per stall period instead of a timeout scope per engine chunk: it
        fires, sees how long the current wait has lasted, and either re-arms for the rest
        or ends the wait as a stall (a per-chunk timeout cost a timer per token)."""
        self._stall_timer = None
        task = self.task
        if self._finalizing or task is None or task.done():
            return
        loop = asyncio.get_running_loop()
        stall = streaming_settings.STALL_TIMEOUT
        now = loop.time()
        if self._waiting_for_engine and self.cancel_reason is None:
            due = self._engine_wait_since + stall
            if now >= due:
                self._stalled = True
                task.cancel()
                return
        else:
            due = now + stall
        self._stall_timer = loop.call_at(due, self._watch_stall)

    async def _recheck_abandon(self) -> None:
        count = await self.backends.presence.count(self.message_id)
        if count == 0:
            self.cancel(Status.ABANDONED.value)

    # --- the run ---------------------------------------------------------------------
    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def reasoning(self) -> str:
        return "".join(self.reasoning_parts)

    def partial(self) -> Partial | None:
        """The text the log holds and the seq it reaches, for the write-behind. Not the
        outbox's seq: that counts a batch from the moment its write starts, while its
        text joins ``parts`` only once the log has it, and a record whose seq counted
        text it did not hold would lose that text when the reaper splices the log's
        events after the seq onto it."""
        seq = self._logged_seq
        if seq == self._persisted_seq or self._finalizing:
            return None
        self._persisted_seq = seq
        plan = self.plan
        return Partial(
            self.message_id,
            plan.base_text + self.text,
            seq,
            plan.base_reasoning + self.reasoning,
        )

    def stored(self, partial: Partial) -> None:
        """The write-behind stored ``partial`` (one this generation gave): the events it
        covers need not stay in this process for a log that loses its tail."""
        self.backends.hub.stored(self.message_id, partial.last_seq)

    def _write(self, batch: list[events.Event], appended: Appended) -> None:
        """Every batch after the segment's first must follow on from what the log holds;
        a Continue's first follows the segment before it."""
        backends = self.backends
        previous = self.plan.previous_done
        if batch[0]["seq"] > self.plan.first_seq:
            submit_following(backends.log, backends.hub, self.message_id, batch, appended)
        elif previous is not None:
            submit_after_done(backends.log, self.message_id, previous, batch, appended)
        else:
            backends.log.submit(self.message_id, batch, appended)

    def _written(self, batch: list[events.Event]) -> None:
        """A batch is in the log: it is part of the answer now, and local readers get it."""
        for event in batch:
            kind = event["type"]
            if kind == events.DELTA:
                self.parts.append(event["text"])
            elif kind == events.REASONING:
                self.reasoning_parts.append(event["text"])
        self._logged_seq = batch[-1]["seq"]
        self.backends.hub.publish(self.message_id, batch)

    def _write_failed(self, exc: BaseException) -> None:
        """The log refused a write: the run ends (as an internal error) at once."""
        if self.task is not None and self._waiting_for_engine and not self.task.done():
            self.task.cancel()

    async def _run(self) -> None:
        plan = self.plan
        with stream_context(plan.message_id, plan.request.request_id):
            self.backends.hub.open_local(plan.message_id, plan.first_seq)
            metrics.ACTIVE_GENERATIONS.inc()
            try:
                termination = await self._generate()
            finally:
                metrics.ACTIVE_GENERATIONS.dec()
            await self._finish(termination)

    async def _generate(self) -> Termination:
        plan = self.plan
        request = plan.request
        engine = self.backends.engine_for(request.model)
        detok = Detokenizer()
        stops = StopFilter(request.stop)
        termination = Termination(status=Status.COMPLETE.value)
        stream: AsyncGenerator[EngineChunk, None] | None = None
        try:
            # Inside the try: an engine that refuses the request up front still ends it.
            stream = engine.stream(request)
            self.outbox.add(
                events.start(
                    0,
                    message_id=plan.message_id,
                    segment=plan.segment_index,
                    model=request.model or engine.model,
                ),
                urgent=True,
            )
            if await self._pump(stream, detok, stops, termination):
                return termination  # a stop string matched: nothing held back is shown
        except TimeoutError:
            termination.status = Status.STALLED.value
            termination.error_type = "Stalled"
            termination.error_message = f"no token for {streaming_settings.STALL_TIMEOUT:g} s"
            metrics.engine_error("EngineTimeout")
        except EngineError as raised:
            exc = _storable_error(raised)
            stalled = exc.type == "EngineTimeout"
            termination.status = Status.STALLED.value if stalled else Status.ERROR.value
            termination.error_type = exc.type
            termination.error_message = exc.message
            termination.error_code = None if exc.code is None else str(exc.code)
            termination.context_full = isinstance(raised, EngineContextFull)
            metrics.engine_error(exc.type)
            await self._emit_error(exc)
        except (asyncio.CancelledError, Cancelled) as exc:
            task = asyncio.current_task()
            if isinstance(exc, asyncio.CancelledError) and task is not None:
                task.uncancel()
            if isinstance(self.outbox.error, Exception):
                await self._fail(termination, self.outbox.error)
            else:
                reason = self.cancel_reason or Status.INTERRUPTED.value
                termination.status = CANCEL_STATUSES.get(reason, Status.INTERRUPTED).value
                if termination.status == Status.INTERRUPTED:
                    # In the reaper's words for a process that died: one record either way.
                    termination.error_type = "Interrupted"
                    termination.error_message = INTERRUPTED_WHY
        except Exception as exc:  # a bug or an unexpected failure: still end cleanly
            await self._fail(termination, exc)
        finally:
            self._finalizing = True
            if self._abandon_timer is not None:
                self._abandon_timer.cancel()
            if self._stall_timer is not None:
                self._stall_timer.cancel()
                self._stall_timer = None
            # Closing the engine stream aborts the request upstream (vLLM: HTTP close).
            if stream is not None:
                with contextlib.suppress(Exception):
                    await stream.aclose()
            termination.duration_ms = (time.monotonic() - self.started_at) * 1000
        # Ended without a stop match so far: what was held back (a partial character, a
        # prefix of a stop string) is real output - unless it completes a stop string now.
        tail, matched = stops.feed(storable(detok.flush()))
        if matched is None:
            tail += stops.flush()
            matched = stops.matched
        if matched is not None and termination.status in (Status.COMPLETE, Status.TRUNCATED):
            termination.status = Status.STOPPED.value
            termination.finish_reason = "stop"
            termination.stop_reason = matched
        if tail:
            self.in_reasoning = False
            self.outbox.add(events.delta(0, tail))
        return termination

    async def _fail(self, termination: Termination, exc: Exception) -> None:
        """End as an internal error: a bug, an unexpected failure, or the log refusing.
        The record says what the product knows in its own words; any other exception's
        text (a library's, which may name a server's address) goes to the log only. A log
        deleted with its conversation ends the answer as its delete's Stop would have
        (one that came before this generation started, or that its process missed): it
        has no record left to write, nor a log to tell."""
        self._failure = exc
        if isinstance(exc, LogDeleted):
            log.info("generation stopped: its conversation was deleted")
            termination.status = Status.CANCELLED.value
            termination.error_type = "Deleted"
            termination.error_message = "the conversation was deleted"
            return
        log.error("generation failed", exc_info=exc)
        termination.status = Status.ERROR.value
        termination.error_type = "InternalError"
        ours = isinstance(exc, LogLost | LogUnreachable)
        said = str(exc) if ours else "the server failed while generating this answer"
        termination.error_message = storable(said)
        await self._emit_error(EngineError(termination.error_message, "InternalError", 500))

    async def _pump(
        self,
        stream: AsyncGenerator[EngineChunk, None],
        detok: Detokenizer,
        stops: StopFilter,
        termination: Termination,
    ) -> bool:
        """Move engine output to the log until the engine ends; True on a stop match."""
        loop = asyncio.get_running_loop()
        completion_tokens = 0
        first_token = first_reasoning = first_text = True
        self._stall_timer = loop.call_later(streaming_settings.STALL_TIMEOUT, self._watch_stall)
        stamps = streaming_settings.EMIT_STAMPS
        while True:
            if self.outbox.error is not None:
                raise self.outbox.error
            if self.cancel_reason is not None:
                raise Cancelled
            self._waiting_for_engine = True
            self._engine_wait_since = loop.time()
            try:
                chunk: EngineChunk = await anext(stream)
            except StopAsyncIteration:
                return False
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not self._stalled or task is None:
                    raise
                task.uncancel()
                raise TimeoutError from None
            finally:
                self._waiting_for_engine = False
            # A chunk's own tokens always count; its usage, where it has one, is the
            # engine's count up to it, which may have been taken before them (the usage
            # an engine tells on its first output to say what the prompt cost): a floor,
            # never a replacement, or an answer ended after one chunk counted none.
            completion_tokens += chunk.tokens
            if chunk.usage is not None:
                termination.prompt_tokens = chunk.usage.prompt_tokens
                completion_tokens = max(completion_tokens, chunk.usage.completion_tokens)
                termination.reasoning_tokens = chunk.usage.reasoning_tokens
            termination.completion_tokens = completion_tokens
            if chunk.tokens:
                # The first reasoning token and the first answer token are timed apart:
                # a reasoning model shows its thinking long before its answer.
                if chunk.reasoning and first_reasoning:
                    first_reasoning = False
                    ttft = time.monotonic() - self.started_at
                    termination.reasoning_ttft_ms = ttft * 1000
                    metrics.ENGINE_REASONING_TTFT.observe(ttft)
                elif not chunk.reasoning and first_token:
                    first_token = False
                    ttft = time.monotonic() - self.started_at
                    termination.ttft_ms = ttft * 1000
                    metrics.ENGINE_TTFT.observe(ttft)
            if chunk.reasoning:
                thought = storable(chunk.reasoning)
                self.outbox.add(events.reasoning(0, thought), urgent=not self.in_reasoning)
                self.in_reasoning = True
            if chunk.tool_calls:
                self.in_reasoning = False
                for piece in chunk.tool_calls:
                    self.outbox.add(self._tool_call(piece))
            text = chunk.text if chunk.token_bytes is None else detok.feed(chunk.token_bytes)
            text = storable(text)
            if text:
                shown, matched = stops.feed(text)
                if shown:
                    stamp = chunk.emitted_at if stamps else None
                    # The answer's first text goes at once (the window never delays it).
                    urgent = first_text or self.in_reasoning
                    first_text = self.in_reasoning = False
                    self.outbox.add(events.delta(0, shown, stamp), urgent=urgent)
                if matched is not None:
                    termination.status = Status.STOPPED.value
                    termination.finish_reason = "stop"
                    termination.stop_reason = matched
                    return True
            if chunk.finish_reason is not None:
                # Keep reading: vLLM sends the usage chunk and [DONE] after the reason.
                self._apply_finish(termination, chunk)

    def _tool_call(self, piece: ToolCallDelta) -> events.Event:
        """The event of one piece of a tool call (texts made storable), added to its call."""
        event = events.tool_call(
            0,
            index=piece.index,
            id=storable(piece.id),
            name=storable(piece.name),
            arguments=storable(piece.arguments),
        )
        self.tool_calls.add(event)
        return event

    def _apply_finish(self, termination: Termination, chunk: EngineChunk) -> None:
        reason = None if chunk.finish_reason is None else storable(chunk.finish_reason)
        termination.finish_reason = reason
        termination.context_full = chunk.context_full
        if reason == "length":
            termination.status = Status.TRUNCATED.value
        elif reason == "repetition":
            # vLLM's repetition detection ended it: finished on purpose, like a stop.
            termination.status = Status.STOPPED.value
        elif reason == "stop" and chunk.stop_reason is not None:
            termination.status = Status.STOPPED.value
            stop = chunk.stop_reason
            termination.stop_reason = storable(stop) if isinstance(stop, str) else stop
        elif reason in ("abort", "error"):
            termination.status = Status.ERROR.value
            termination.error_type = "EngineAborted" if reason == "abort" else "EngineError"
            termination.error_message = f"the engine ended the request ({reason})"
            metrics.engine_error(termination.error_type)
        else:
            termination.status = Status.COMPLETE.value

    async def _emit_error(self, exc: EngineError) -> None:
        self.outbox.add(events.error(0, message=exc.message, type=exc.type, code=exc.code))
        with contextlib.suppress(Exception):
            await self.outbox.drain()

    async def _finish(self, termination: Termination) -> None:
        plan = self.plan
        backends = self.backends
        # Everything produced goes to the log before the record is written: the record's
        # text is what the log holds (short of it only if the log refused a write).
        with contextlib.suppress(Exception):
            await self.outbox.drain()
        refused = self.outbox.error
        if isinstance(refused, Exception) and refused is not self._failure:
            # The engine was done before the log refused its tail: the record says so,
            # not that the answer ended as the engine did, short of what it sent.
            await self._fail(termination, refused)
        if isinstance(refused, LogUnreachable):
            await self._read_back()
        text = self.text
        content = plan.base_text + text
        termination.inspect_text(content)
        termination.ended_in_reasoning = self.in_reasoning
        self.termination = termination
        done_seq = self.outbox.seq + 1
        owned = await self._persist_final(
            content, plan.base_reasoning + self.reasoning, done_seq, termination
        )
        try:
            if owned:
                # Counted before readers can see the `done`, so a scrape after it includes it.
                metrics.STREAM_GENERATIONS_ENDED.labels(status=termination.status).inc()
                metrics.GENERATED_TOKENS.inc(termination.completion_tokens)
                done = events.done(
                    done_seq, segment=plan.segment_index, termination=termination.as_dict()
                )
                await end_log(backends.log, backends.hub, plan.message_id, done)
                log.info(
                    "generation ended: %s (%d tokens, %d chars)",
                    termination.status,
                    termination.completion_tokens,
                    len(text),
                )
                signals.answer_ended.send_robust(
                    sender=Generation,
                    message_id=plan.message_id,
                    segment_index=plan.segment_index,
                    status=termination.status,
                )
        finally:
            backends.hub.close_local(plan.message_id)
            if self.on_end is not None:
                self.on_end(self)
            self._over = True
            if self._finished is not None:
                self._finished.set()

    async def _read_back(self) -> None:
        """What the log holds of the batches whose appends were given up: one sent may
        have been applied, its answer lost, and readers elsewhere had it then. Those
        events are the answer's as much as the ones the log confirmed (the record and a
        Continue go on from them); a log that cannot be read now leaves them out."""
        try:
            held = await self.backends.log.read(self.message_id, self._logged_seq)
        except Exception:
            return
        held = [event for event in held if event["seq"] <= self.outbox.seq]
        if held and held[0]["seq"] == self._logged_seq + 1:
            self._written(held)

    async def _persist_final(
        self, content: str, reasoning: str, done_seq: int, termination: Termination
    ) -> bool:
        """Write the final record (``_write_final``); False when it is not this
        generation's to end: another writer's, or left to a reaper (``leave_to_reaper``)."""
        if self._left:
            return False
        self._persisting = True
        try:
            return await self._write_final(content, reasoning, done_seq, termination)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self._left or task is None:
                raise
            task.uncancel()
            log.warning("the final record is left to a reaper: this process is stopping")
            return False
        finally:
            self._persisting = False

    async def _write_final(
        self, content: str, reasoning: str, done_seq: int, termination: Termination
    ) -> bool:
        """Write the final record (every try the same write, named by its ``ended_at``:
        ``finalize_segment``). While the database cannot be reached it is tried for as long
        as that lasts (or until its process stops without it: ``leave_to_reaper``): a try
        may have committed unheard, and only a later try that reaches the database can
        tell and end the log (given up, the answer's readers waited for ever). One the
        database refuses is given up after ``PERSIST_RETRY_SECONDS``; the reaper ends the
        answer then."""
        delay = 0.2
        deadline = time.monotonic() + streaming_settings.PERSIST_RETRY_SECONDS
        ended_at = timezone.now()
        while True:
            started = time.monotonic()
            try:
                owned = await database.run(
                    finalize_segment,
                    message_id=self.plan.message_id,
                    conversation_id=self.plan.conversation_id,
                    segment_index=self.plan.segment_index,
                    content=content,
                    start_offset=len(self.plan.base_text),
                    last_seq=done_seq,
                    termination=termination,
                    ended_at=ended_at,
                    reasoning=reasoning,
                    reasoning_start_offset=len(self.plan.base_reasoning),
                    tool_calls=self.tool_calls.as_list(),
                    earlier_tool_calls=self.plan.base_tool_calls,
                )
                metrics.PERSIST_LATENCY.labels(kind="final").observe(time.monotonic() - started)
                return owned
            except Exception as exc:
                away = unavailable(exc) is not None
                if not away and time.monotonic() > deadline:
                    log.exception("could not persist the final record; the reaper will")
                    return False
                log.warning("database unavailable for the final record; retrying")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)


def submit_following(
    stream_log: StreamLog,
    hub: Hub,
    message_id: str,
    batch: list[events.Event],
    appended: Appended,
) -> None:
    """Append ``batch`` after the event before it, then call ``appended``. When the log
    lost its tail (Redis restarted empty), the recent events this process still holds
    (the hub keeps a tail beyond its slowest local reader) go back in first, so a reader
    in another process following close behind the writer misses nothing; one further
    behind than that tail gets the log's ``resume_gap``."""

    def contiguous(error: BaseException | None) -> None:
        if not isinstance(error, LogLost):
            appended(error)
            return
        held = hub.newer_than(message_id, error.have)
        held = [e for e in held if e["seq"] < batch[0]["seq"]]
        resumed = held[0]["seq"] if held else batch[0]["seq"]
        log.warning(
            "the event log lost this answer's events after seq %d; put back from seq %d%s",
            error.have,
            resumed,
            "" if resumed == error.have + 1 else f" (events {error.have + 1}-{resumed - 1} gone)",
        )
        stream_log.submit(message_id, held + batch, appended)

    stream_log.submit(message_id, batch, contiguous, contiguous=True)


def submit_after_done(
    stream_log: StreamLog,
    message_id: str,
    done: events.Event,
    batch: list[events.Event],
    appended: Appended,
) -> None:
    """Append a Continue's first ``batch`` after the previous segment's ``done``, then call
    ``appended``. The Continue went ahead once that segment's record was final, and its
    process appends the ``done`` only after the record (a process killed in between never
    does): a ``start`` appended first would keep that ``done`` out of the log for good,
    and the segment's readers would read on into this one. So the batch goes after the
    ``done`` when the log holds it; with it, as the record says it, when the log holds
    everything before it (the owner's own append then finds it there: one ``done`` per
    seq); alone, as any first batch, when the log lost or let expire what came before."""

    def after_done(error: BaseException | None) -> None:
        if not isinstance(error, LogLost):
            appended(error)
        elif error.have == done["seq"] - 1:
            stream_log.submit(message_id, [done, *batch], with_done, contiguous=True)
        else:
            stream_log.submit(message_id, batch, appended)

    def with_done(error: BaseException | None) -> None:
        if isinstance(error, SeqConflict):  # the owner's ``done`` came in between
            stream_log.submit(message_id, batch, appended, contiguous=True)
        else:
            appended(error)

    stream_log.submit(message_id, batch, after_done, contiguous=True)


async def end_log(stream_log: StreamLog, hub: Hub, message_id: str, done: events.Event) -> None:
    """Append a segment's terminal ``done`` (its owner, the one whose final record was
    written, calls this) and publish it to local readers; its append starts the log's
    expiry. A log that already holds a later event keeps it (and its expiry: a later
    ``start`` is a Continue's, live): the ``done`` is exactly-once by seq."""
    try:
        await until_appended(
            lambda appended: submit_following(stream_log, hub, message_id, [done], appended)
        )
        hub.publish(message_id, [done])
    except SeqConflict:
        log.warning("the log of %s already had a later event than its done", message_id)
    except (LogUnreachable, LogDeleted):
        # Given up after the log's own hold: the record is final, and readers waiting
        # for this ``done`` read it from there (``Subscription``).
        log.warning(
            "the done of %s could not be appended; its readers end from its record", message_id
        )


def _storable_error(exc: EngineError) -> EngineError:
    """The engine's error with its texts made storable (they reach the log and the record)."""
    code = storable(exc.code) if isinstance(exc.code, str) else exc.code
    return EngineError(storable(exc.message), storable(exc.type), code)
