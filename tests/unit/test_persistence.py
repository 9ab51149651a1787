"""Write-behind: one statement for the batch, and only answers still streaming change."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from streaming.models import Conversation, Message
from streaming.persistence import Partial, flush_partials
from streaming.termination import Status

pytestmark = pytest.mark.django_db


def test_partials_of_streaming_answers_are_written_in_one_statement() -> None:
    owner = User.objects.create_user("flush")
    conversation = Conversation.objects.create(owner=owner)

    def answer(status: str, content: str) -> Message:
        return Message.objects.create(
            conversation=conversation, role="assistant", status=status, content=content
        )

    running = [answer(Status.STREAMING, "") for _ in range(3)]
    ended = answer(Status.COMPLETE, "the final text")
    partials = [Partial(str(m.id), f"partial {i} 👋🏽", 10 + i) for i, m in enumerate(running)]
    partials.append(Partial(str(ended.id), "a stale partial", 99))

    with CaptureQueriesContext(connection) as queries:
        flush_partials(partials)
    # One statement, executed for the batch (Django logs it as "4 times: UPDATE ...").
    updates = [q["sql"] for q in queries.captured_queries if "UPDATE" in q["sql"]]
    assert len(updates) == 1
    assert updates[0].startswith("4 times: UPDATE")

    for i, message in enumerate(running):
        message.refresh_from_db()
        assert (message.content, message.last_seq) == (f"partial {i} 👋🏽", 10 + i)
    ended.refresh_from_db()
    assert (ended.content, ended.last_seq, ended.status) == ("the final text", 0, Status.COMPLETE)


def _streaming_answers(owner: str, contents: list[str]) -> list[Message]:
    """Answers still streaming, one per text, in a new conversation of a new user."""
    conversation = Conversation.objects.create(owner=User.objects.create_user(owner))
    return [
        Message.objects.create(
            conversation=conversation, role="assistant", status=Status.STREAMING, content=content
        )
        for content in contents
    ]


def test_a_row_the_database_refuses_does_not_hold_back_the_batch() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("only PostgreSQL refuses U+0000 in text")
    running = _streaming_answers("refused", [""] * 3)
    # Text is made storable before it gets here; a row that still is not must cost only itself.
    partials = [Partial(str(m.id), f"ok {i}", 5 + i) for i, m in enumerate(running)]
    partials[1] = Partial(str(running[1].id), "bad \x00 row", 6)
    refused = flush_partials(partials)
    assert [p.message_id for p in refused] == [str(running[1].id)]
    contents = [Message.objects.get(id=m.id).content for m in running]
    assert contents == ["ok 0", "", "ok 2"]


def _hot_updates() -> int:
    """Heap-only updates of the messages' table in this transaction so far."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_stat_get_xact_tuples_hot_updated(%s::regclass)", [Message._meta.db_table]
        )
        return int(cursor.fetchone()[0])


def test_a_partial_in_a_page_filled_by_inserts_touches_no_index() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("heap-only updates and fill factors are PostgreSQL's")
    # Rows of about 1.1 KiB inserted one after the other fill the table's pages as far as
    # its fill factor lets them: at 100 a page holds seven and has no room for an eighth
    # version, at 70 it holds four and has room for three.
    running = _streaming_answers("pages", [f"{i:04d}" * 250 for i in range(64)])
    before = _hot_updates()
    # Each rewritten at the same size: a new version that fits only in room left free.
    flush_partials([Partial(str(m.id), m.content[::-1], 7) for m in running])
    # At least one rewrite per page stays out of the indexes (at 100: none does).
    assert _hot_updates() - before >= len(running) // 4
    assert Message.objects.get(id=running[5].id).content == running[5].content[::-1]


def test_a_final_record_tried_again_is_known_as_its_own() -> None:
    """The same write (the same ``ended_at``) finds the segment final with its own record
    and says it owns it; another writer's finds it final and does not."""
    from datetime import datetime, timedelta

    from django.utils import timezone

    from streaming.models import Segment
    from streaming.persistence import finalize_segment
    from streaming.termination import Termination

    owner = User.objects.create_user("final")
    conversation = Conversation.objects.create(owner=owner)
    message = Message.objects.create(
        conversation=conversation, role="assistant", status=Status.STREAMING
    )
    Segment.objects.create(message=message, index=0, status=Status.STREAMING, worker="w")
    ended_at = timezone.now()

    def write(at: datetime) -> bool:
        return finalize_segment(
            message_id=str(message.id),
            conversation_id=str(conversation.id),
            segment_index=0,
            content="done",
            start_offset=0,
            last_seq=3,
            termination=Termination(status=Status.COMPLETE.value),
            ended_at=at,
        )

    assert write(ended_at)
    assert write(ended_at), "the same write, tried again"
    assert not write(ended_at + timedelta(microseconds=1)), "someone else's"
    message.refresh_from_db()
    assert (message.content, message.status, message.last_seq) == ("done", Status.COMPLETE, 3)
