"""The reaper: finalise segments whose generating process died.

A segment still ``streaming`` whose worker stopped beating (or, in this process, that no
generation here streams: ``Reaper._strayed``) is rebuilt from the event log
(tokens streamed but not yet flushed to the database are kept), persisted as
``interrupted`` and closed with a terminal ``done`` so attached readers finish. The
conditional final update makes this exactly-once across reapers; the log's explicit seq
ids make the terminal event exactly-once too.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from streaming import database, events, metrics, signals
from streaming.conf import streaming_settings
from streaming.generation import INTERRUPTED_WHY, end_log
from streaming.hub import Hub
from streaming.models import Segment
from streaming.persistence import finalize_segment
from streaming.presence import Presence
from streaming.streamlog import StreamLog
from streaming.termination import Status, Termination

log = logging.getLogger(__name__)

# An answer of this process's that never started: its rows committed while its post
# failed (the answer to the commit lost), so nothing generated it.
NEVER_STARTED_WHY = (
    "this answer never started: the server lost the database's answer while starting it; "
    "Continue or regenerate it"
)
# How many of a database call's waits (DATABASE_WAIT_TIMEOUT) a start may take after its
# rows are written: its own round trips after the insert, the commit's among them.
STRAY_WAITS = 3


@dataclass(slots=True)
class Orphan:
    message_id: str
    conversation_id: str
    segment_index: int
    first_seq: int
    start_offset: int
    worker: str
    db_content: str
    db_last_seq: int
    completion_tokens: int
    db_reasoning: str = ""
    reasoning_start_offset: int = 0
    earlier_tool_calls: list[dict[str, Any]] = field(default_factory=list)


def _streaming_workers() -> list[str]:
    """Each process with a segment streaming, once. Without ``order_by()`` the model's
    ordering joined the messages and went into the ``DISTINCT``: a row per streaming
    segment, and a heartbeat lookup per row, on every pass."""
    return list(
        Segment.objects.filter(status=Status.STREAMING)
        .order_by()
        .values_list("worker", flat=True)
        .distinct()
    )


def _streaming_here(worker: str, started_before: datetime) -> list[tuple[str, int]]:
    """The segments ``worker`` (this process) has streaming, by message and index, of
    those started (their rows written) before ``started_before``."""
    rows = Segment.objects.filter(
        status=Status.STREAMING, worker=worker, started_at__lt=started_before
    ).order_by()
    return [(str(m), i) for m, i in rows.values_list("message_id", "index")]


def _orphans(workers: list[str], keys: list[tuple[str, int]] | None = None) -> list[Orphan]:
    """The segments streaming for ``workers``, or only those of ``keys`` among them."""
    rows = Segment.objects.filter(status=Status.STREAMING, worker__in=workers).select_related(
        "message"
    )
    wanted = None if keys is None else set(keys)
    if keys is not None:
        rows = rows.filter(message_id__in=[m for m, _ in keys])
    return [
        Orphan(
            message_id=str(s.message_id),
            conversation_id=str(s.message.conversation_id),
            segment_index=s.index,
            first_seq=s.first_seq,
            start_offset=s.start_offset,
            worker=s.worker,
            db_content=s.message.content,
            db_last_seq=s.message.last_seq,
            completion_tokens=s.completion_tokens,
            db_reasoning=s.message.reasoning,
            reasoning_start_offset=s.reasoning_start_offset,
            # A Continue starts a segment after its message's tool calls were final.
            earlier_tool_calls=list(s.message.tool_calls),
        )
        for s in rows
        if wanted is None or (str(s.message_id), s.index) in wanted
    ]


class Reaper:
    """One per process; ``reap`` is one pass. It remembers which workers it has seen
    without a heartbeat, and since when, to confirm a death before acting on it."""

    def __init__(self, log: StreamLog, hub: Hub, presence: Presence) -> None:
        self.log = log
        self.hub = hub
        self.presence = presence
        # Workers found without a heartbeat, and since when (monotonic).
        self.missing: dict[str, float] = {}
        # Orphans whose final record was sent without an answer, with the ``ended_at``
        # that names it: tried again, as the same write, until the answer comes. It may
        # have committed meanwhile, and then the segment is no longer found streaming.
        self.unsettled: dict[tuple[str, int], tuple[Orphan, datetime]] = {}
        # This process's streaming segments that no generation here streamed last pass.
        self.strays: set[tuple[str, int]] = set()

    async def dead_workers(self, workers: list[str], *, confirm: bool) -> list[str]:
        """Workers without a heartbeat. With ``confirm``, only those this process has seen
        missing for a whole heartbeat timeout: a Redis restart drops every heartbeat key
        at once, and live processes must get the chance to beat again before being reaped."""
        missing = await self.presence.dead(workers)
        if not confirm:
            return missing
        now = time.monotonic()
        seen = self.missing
        for worker in list(seen):
            if worker not in missing:
                del seen[worker]
        for worker in missing:
            seen.setdefault(worker, now)
        timeout = streaming_settings.HEARTBEAT_TIMEOUT
        return [w for w in missing if now - seen[w] >= timeout]

    async def reap(self, *, confirm: bool = True) -> int:
        """One pass; returns how many segments this process finalised."""
        orphans = {key: orphan for key, (orphan, _) in self.unsettled.items()}
        workers = await database.run(_streaming_workers)
        dead = await self.dead_workers(workers, confirm=confirm)
        if dead:
            for orphan in await database.run(_orphans, dead):
                orphans.setdefault((orphan.message_id, orphan.segment_index), orphan)
        for orphan in await self._strayed(workers):
            orphans.setdefault((orphan.message_id, orphan.segment_index), orphan)
        reaped = 0
        for key, orphan in orphans.items():
            ended_at = self.unsettled[key][1] if key in self.unsettled else timezone.now()
            # One segment that cannot be finalised must not keep the others from it.
            try:
                if await self.reap_one(orphan, ended_at):
                    reaped += 1
            except Exception:
                self.unsettled[key] = (orphan, ended_at)
                log.exception("could not reap %s/%d", orphan.message_id, orphan.segment_index)
            else:
                self.unsettled.pop(key, None)
        return reaped

    async def _strayed(self, workers: list[str]) -> list[Orphan]:
        """This process's segments left streaming with no generation here: an answer whose
        rows committed while its post failed (the commit's answer lost, or given up on),
        or whose final record the database refused for ``PERSIST_RETRY_SECONDS``. The
        process lives on, so the pass for dead processes never finds them; they held their
        owner's slot, and a Continue or regenerate below them, for ever.

        Its rows commit before its start is registered: other sessions see them at once,
        the thread that wrote them only once it hears the commit's answer, which may take
        up to ``DATABASE_WAIT_TIMEOUT`` for each of its round trips. So only segments
        written longer ago than ``STRAY_WAITS`` such waits count (none without that
        bound), and only when two passes in a row find them so."""
        me = self.presence.worker_id
        wait = settings.DATABASE_WAIT_TIMEOUT
        if me not in workers or not wait:
            self.strays = set()
            return []
        before = timezone.now() - timedelta(seconds=STRAY_WAITS * wait)
        generating = self.presence.listener.generating
        here = await database.run(_streaming_here, me, before)
        strays = {key for key in here if not generating(key[0])}
        confirmed, self.strays = strays & self.strays, strays
        if not confirmed:
            return []
        return await database.run(_orphans, [me], sorted(confirmed))

    async def reap_one(self, orphan: Orphan, ended_at: datetime) -> bool:
        """Finalise one orphan from the database's text and the log's tail, spliced by
        seq: the write-behind stores the text with the seq it reaches, so the log is only
        needed after that seq (a log that lost its beginning to a Redis restart loses
        nothing stored). A log that does not reach back that far leaves a hole, said so."""
        stored = orphan.db_last_seq
        logged = await self.log.read(orphan.message_id, stored)
        tail = "".join(e["text"] for e in logged if e["type"] == events.DELTA)
        content = orphan.db_content + tail
        thought = "".join(e["text"] for e in logged if e["type"] == events.REASONING)
        # Tool calls are not written behind: the log holds the segment's only copy.
        calls = events.ToolCalls()
        for event in await self.log.read(orphan.message_id, orphan.first_seq - 1):
            if event["type"] == events.TOOL_CALL:
                calls.add(event)
        reasoning = orphan.db_reasoning + thought
        texts = [e["type"] for e in logged if e["type"] in events.TEXT_TYPES]
        last_seq = logged[-1]["seq"] if logged else stored
        why = INTERRUPTED_WHY
        if orphan.worker == self.presence.worker_id and not logged and not content:
            why = NEVER_STARTED_WHY
        if logged and logged[0]["seq"] > stored + 1:
            why += (
                f"; events {stored + 1}-{logged[0]['seq'] - 1} were lost from the event log, "
                "so text is missing there"
            )
        elif not logged and stored and await self.log.last_seq(orphan.message_id) < stored:
            # The log holds less than the stored copy reaches: it lost its events (Redis
            # restarted empty), and with them any that came after the copy.
            why += f"; the event log lost its events, so text after event {stored} may be missing"
        termination = Termination(
            status=Status.INTERRUPTED.value,
            completion_tokens=orphan.completion_tokens,
            error_type="Interrupted",
            error_message=why,
        )
        termination.inspect_text(content)
        termination.ended_in_reasoning = (
            texts[-1] == events.REASONING if texts else bool(reasoning) and not content
        )
        done_seq = last_seq + 1
        owned = await database.run(
            finalize_segment,
            message_id=orphan.message_id,
            conversation_id=orphan.conversation_id,
            segment_index=orphan.segment_index,
            content=content,
            start_offset=orphan.start_offset,
            last_seq=done_seq,
            termination=termination,
            ended_at=ended_at,
            reasoning=reasoning,
            reasoning_start_offset=orphan.reasoning_start_offset,
            tool_calls=calls.as_list(),
            earlier_tool_calls=orphan.earlier_tool_calls,
        )
        if not owned:
            return False
        done = events.done(
            done_seq, segment=orphan.segment_index, termination=termination.as_dict()
        )
        await end_log(self.log, self.hub, orphan.message_id, done)
        metrics.REAPED.inc()
        metrics.STREAM_GENERATIONS_ENDED.labels(status=termination.status).inc()
        log.warning("reaped interrupted segment %s/%d", orphan.message_id, orphan.segment_index)
        replies = await signals.answer_interrupted.asend_robust(
            sender=Reaper, message_id=orphan.message_id
        )
        for receiver, reply in replies:
            if isinstance(reply, Exception):
                log.error("%r failed after reaping: %r", receiver, reply)
        return True
