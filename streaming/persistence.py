"""Writes of generation state to the database: write-behind partials and final records.

Partial content is flushed for all running generations of the process in one batch every
``STREAM_FLUSH_INTERVAL`` seconds (one DB thread hop per tick, not one write per token).
If the database is unreachable the batch is kept and retried: readers keep getting tokens
from the log meanwhile, and nothing is lost because the log holds every delta.

The final write is conditional on the segment still being ``streaming``: whoever makes
that update (the generating process, its shutdown path or a reaper) owns the terminal
event, which makes finalisation exactly-once across processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction

from streaming import statements
from streaming.models import Conversation, Message, Segment
from streaming.termination import Status, Termination

_FLUSH_SQL = (
    f"UPDATE {Message._meta.db_table} SET content = %s, reasoning = %s, last_seq = %s "
    "WHERE id = %s AND status = %s"
)


@dataclass(slots=True)
class Partial:
    message_id: str
    content: str
    last_seq: int
    reasoning: str = ""


def flush_partials(partials: list[Partial]) -> list[Partial]:
    """Write the batch; return the partials the database refused (and that are given up).

    One statement prepared once and executed for the whole batch (psycopg pipelines it:
    one round trip), not one ORM update per message: with hundreds of answers streaming,
    per-message updates cost more CPU than the answers' tokens. Only rows still
    ``streaming`` change (a final write wins). A row the database refuses for its data
    must not hold back the others: the batch is then written row by row and the refused
    rows are returned. A database that cannot be reached raises (the caller retries all).
    """
    try:
        _write(partials)
        return []
    except (OperationalError, InterfaceError):
        raise
    except DatabaseError:
        if len(partials) == 1:
            return partials
    refused = []
    for partial in partials:
        try:
            _write([partial])
        except (OperationalError, InterfaceError):
            raise
        except DatabaseError:
            refused.append(partial)
    return refused


def _write(partials: list[Partial]) -> None:
    key = Message._meta.pk
    assert key is not None
    rows = [
        (
            p.content,
            p.reasoning,
            p.last_seq,
            key.get_db_prep_value(p.message_id, connection),
            Status.STREAMING,
        )
        for p in partials
    ]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany(_FLUSH_SQL, rows)


def finalize_segment(
    *,
    message_id: str,
    conversation_id: str,
    segment_index: int,
    content: str,
    start_offset: int,
    last_seq: int,
    termination: Termination,
    ended_at: datetime,
    reasoning: str = "",
    reasoning_start_offset: int = 0,
    tool_calls: list[dict[str, Any]] | None = None,
    earlier_tool_calls: list[dict[str, Any]] | None = None,
) -> bool:
    """Persist the end of a segment; False when someone else already finalised it.

    ``content`` and ``reasoning`` are the whole message's; the segment's own parts begin
    at ``start_offset`` and ``reasoning_start_offset`` in them. ``tool_calls`` are the
    segment's own, ``earlier_tool_calls`` those of the message's earlier segments.

    ``ended_at`` names the write: a caller that tries again after a failure passes the
    same one. A try can commit without its caller hearing so (the connection lost after
    the commit, or given up on a server that answered too late: ``DATABASE_WAIT_TIMEOUT``);
    the next try then finds the segment final, and by ``ended_at`` that the record is its
    own, so the caller still ends the log with its ``done``, which otherwise nobody
    would, leaving the answer's readers waiting."""
    calls = list(tool_calls or [])
    t = termination
    written = statements.update_chain(
        [
            (
                Segment,
                {
                    "status": t.status,
                    "start_offset": start_offset,
                    "end_offset": len(content),
                    "reasoning_start_offset": reasoning_start_offset,
                    "reasoning_end_offset": len(reasoning),
                    "tool_calls": calls,
                    "finish_reason": t.finish_reason,
                    "stop_reason": None if t.stop_reason is None else str(t.stop_reason),
                    "prompt_tokens": t.prompt_tokens,
                    "completion_tokens": t.completion_tokens,
                    "reasoning_tokens": t.reasoning_tokens,
                    "ttft_ms": t.ttft_ms,
                    "reasoning_ttft_ms": t.reasoning_ttft_ms,
                    "duration_ms": t.duration_ms,
                    "has_unclosed_code_block": t.has_unclosed_code_block,
                    "is_valid_json": t.is_valid_json,
                    "error_type": t.error_type,
                    "error_message": t.error_message,
                    "error_code": t.error_code,
                    "context_full": t.context_full,
                    "ended_in_reasoning": t.ended_in_reasoning,
                    "ended_at": ended_at,
                },
                {"message_id": message_id, "index": segment_index, "status": Status.STREAMING},
            ),
            (
                Message,
                {
                    "content": content,
                    "reasoning": reasoning,
                    "tool_calls": [*(earlier_tool_calls or []), *calls],
                    "status": t.status,
                    "termination": t.as_dict(),
                    "last_seq": last_seq,
                    "updated_at": ended_at,
                },
                {"id": message_id},
            ),
            (Conversation, {"updated_at": ended_at}, {"id": conversation_id}),
        ]
    )
    return written or (
        Segment.objects.filter(message_id=message_id, index=segment_index, ended_at=ended_at)
        .exclude(status=Status.STREAMING)
        .exists()
    )
