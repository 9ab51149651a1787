"""The reaper: finalise segments whose generating process died.

A segment still ``streaming`` whose worker stopped beating is rebuilt from the event log
(tokens streamed but not yet flushed to the database are kept), persisted as
``interrupted`` and closed with a terminal ``done`` so attached readers finish. The
conditional final update makes this exactly-once across reapers; the log's explicit seq
ids make the terminal event exactly-once too.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings

from streaming import database, events, metrics
from streaming.models import Segment
from streaming.persistence import finalize_segment
from streaming.streamlog import SeqConflict
from streaming.termination import Status, Termination
from streaming.worker import worker_key

if TYPE_CHECKING:
    from streaming.runtime import Runtime

log = logging.getLogger(__name__)


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


def _streaming_workers() -> list[str]:
    return list(
        Segment.objects.filter(status=Status.STREAMING).values_list("worker", flat=True).distinct()
    )


def _orphans(workers: list[str]) -> list[Orphan]:
    rows = Segment.objects.filter(status=Status.STREAMING, worker__in=workers).select_related(
        "message"
    )
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
        )
        for s in rows
    ]


async def dead_workers(runtime: Runtime, workers: list[str], *, confirm: bool) -> list[str]:
    """Workers without a heartbeat. With ``confirm``, only those this process has seen
    missing for a whole heartbeat timeout: a Redis restart drops every heartbeat key at
    once, and live processes must get the chance to beat again before being reaped."""
    others = [w for w in workers if w != runtime.worker_id]
    if not others:
        return []
    if runtime.redis is None:
        # One process owns the in-memory state: any other worker is a previous run.
        return others
    pipe = runtime.redis.pipeline(transaction=False)
    for worker in others:
        pipe.exists(worker_key(worker))
    alive = await pipe.execute()
    missing = [w for w, up in zip(others, alive, strict=True) if not up]
    if not confirm:
        return missing
    now = time.monotonic()
    seen = runtime.missing_workers
    for worker in list(seen):
        if worker not in missing:
            del seen[worker]
    for worker in missing:
        seen.setdefault(worker, now)
    return [w for w in missing if now - seen[w] >= settings.STREAM_HEARTBEAT_TIMEOUT]


async def reap(runtime: Runtime, *, confirm: bool = True) -> int:
    """One pass; returns how many segments this process finalised."""
    workers = await database.run(_streaming_workers)
    dead = await dead_workers(runtime, workers, confirm=confirm)
    if not dead:
        return 0
    orphans = await database.run(_orphans, dead)
    reaped = 0
    for orphan in orphans:
        if await reap_one(runtime, orphan):
            reaped += 1
    return reaped


async def reap_one(runtime: Runtime, orphan: Orphan) -> bool:
    logged = await runtime.log.read(orphan.message_id, orphan.first_seq - 1)
    deltas = [e["text"] for e in logged if e["type"] == events.DELTA]
    if logged:
        content = orphan.db_content[: orphan.start_offset] + "".join(deltas)
        last_seq = logged[-1]["seq"]
    else:  # the log is gone (in-memory backend of a dead process): keep what was flushed
        content = orphan.db_content
        last_seq = orphan.db_last_seq
    termination = Termination(
        status=Status.INTERRUPTED.value,
        completion_tokens=orphan.completion_tokens,
        error_type="Interrupted",
        error_message="the server process generating this answer stopped",
        worker=orphan.worker,
    )
    termination.inspect_text(content)
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
    )
    if not owned:
        return False
    done = events.done(done_seq, segment=orphan.segment_index, termination=termination.as_dict())
    try:
        await runtime.log.append(orphan.message_id, [done])
        runtime.hub.publish(orphan.message_id, [done])
    except SeqConflict:
        log.warning("reaped %s but its log already had a later event", orphan.message_id)
    with contextlib.suppress(Exception):
        await runtime.log.finish(orphan.message_id)
    metrics.REAPED.inc()
    metrics.STREAM_GENERATIONS_ENDED.labels(status=termination.status).inc()
    log.warning("reaped interrupted segment %s/%d", orphan.message_id, orphan.segment_index)
    if settings.STREAM_AUTO_CONTINUE_INTERRUPTED:
        from streaming.services import continue_interrupted

        await continue_interrupted(runtime, orphan.message_id)
    return True
