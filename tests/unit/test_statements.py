"""The creation path's hand-built statements store and read what the ORM would, on the
database the suite runs on (PostgreSQL in CI, SQLite without ``DATABASE_URL``)."""

from __future__ import annotations

import itertools
import tempfile
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connections, transaction
from django.db.models import Model
from django.db.models.signals import post_save, pre_save
from django.test.utils import CaptureQueriesContext

from streaming import statements
from streaming.models import Conversation, Message, Segment
from streaming.termination import Status

pytestmark = pytest.mark.django_db
STAMPS = ("created_at", "updated_at", "started_at")


def stored(obj: Model) -> dict[str, Any]:
    """The row as the ORM reads it back, without the columns that differ by nature."""
    row = type(obj).objects.filter(pk=obj.pk).values().get()
    return {k: v for k, v in row.items() if k not in ("id", *STAMPS)}


@pytest.fixture
def conversation() -> Conversation:
    return Conversation.objects.create(owner=User.objects.create_user("ann"), title="t")


def test_no_receiver_listens_to_the_saves_these_statements_skip() -> None:
    for model in (Conversation, Message, Segment):
        for signal in (pre_save, post_save):
            assert not signal.has_listeners(model), f"{signal} has a receiver for {model}"


def test_an_insert_stores_what_create_stores(conversation: Conversation) -> None:
    fields = {
        "conversation": conversation,
        "role": Message.Role.ASSISTANT,
        "content": "Hé 日本 🚀",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f"}}],
        "params": {"max_tokens": 5, "stop": ["\n"]},
        "status": Status.STREAMING,
        "model": "m",
    }
    by_orm = Message.objects.create(**fields)
    question = Message(conversation=conversation, role=Message.Role.USER, content="q")
    answer = Message(**{**fields, "parent": question})
    statements.insert([question, answer])
    assert not answer._state.adding
    assert stored(answer) == {**stored(by_orm), "parent_id": question.id}
    back = Message.objects.get(pk=answer.pk)
    assert back.created_at == answer.created_at and back.created_at is not None
    assert back.created_at >= Message.objects.get(pk=question.pk).created_at


def test_an_insert_reads_back_an_automatic_key(conversation: Conversation) -> None:
    answer = Message.objects.create(conversation=conversation, role=Message.Role.ASSISTANT)
    segment = Segment(message=answer, index=0, first_seq=1, worker="w")
    statements.insert([segment])
    assert segment.pk == Segment.objects.get(message=answer).pk
    by_orm = Segment.objects.create(message=answer, index=1, first_seq=1, worker="w")
    assert stored(segment) == {**stored(by_orm), "index": 0}


def test_an_update_is_save_with_update_fields(conversation: Conversation) -> None:
    leaf = Message.objects.create(conversation=conversation, role=Message.Role.USER)
    before = conversation.updated_at
    conversation.title, conversation.current_leaf, conversation.model = "new", leaf, "unsaved"
    statements.update(conversation, ["title", "current_leaf", "updated_at"])
    back = Conversation.objects.get(pk=conversation.pk)
    assert (back.title, back.current_leaf_id, back.model) == ("new", leaf.id, "")
    assert back.updated_at == conversation.updated_at > before


def test_the_lock_finds_only_the_owners_conversation(conversation: Conversation) -> None:
    other = User.objects.create_user("bob")
    with transaction.atomic():
        found = statements.lock_conversation(conversation.owner_id, conversation.id)
        assert found == conversation and found.title == "t"
        assert found.created_at == conversation.created_at
        assert statements.lock_conversation(other.pk, conversation.id) is None
        assert statements.lock_conversation(conversation.owner_id, uuid.uuid4()) is None


def test_running_answers_counts_the_owners_streaming_answers(conversation: Conversation) -> None:
    owner = conversation.owner_id
    Message.objects.create(conversation=conversation, role="assistant", status=Status.STREAMING)
    Message.objects.create(conversation=conversation, role="assistant", status=Status.COMPLETE)
    Message.objects.create(conversation=conversation, role="user", status=Status.STREAMING)
    elsewhere = Conversation.objects.create(owner=User.objects.create_user("bob"))
    Message.objects.create(conversation=elsewhere, role="assistant", status=Status.STREAMING)
    assert statements.running_answers(owner) == 1


def test_a_message_keeps_its_conversations_owner_however_it_is_stored(
    conversation: Conversation,
) -> None:
    by_orm = Message.objects.create(conversation=conversation, role="user", content="a")
    [in_bulk] = Message.objects.bulk_create([Message(conversation=conversation, role="user")])
    by_id = Message(conversation_id=conversation.id, role="user")
    statements.insert([by_id])
    question = Message(conversation=conversation, role="user")
    answer = Message(conversation=conversation, parent=question, role="assistant")
    statements.insert_then_update([[question, answer]], conversation, ["current_leaf"])
    made = [by_orm, in_bulk, by_id, question, answer]
    assert {m.owner_id for m in made} == {conversation.owner_id}
    stored = Message.objects.filter(pk__in=[m.pk for m in made]).values_list("owner", flat=True)
    assert list(stored) == [conversation.owner_id] * len(made)


@pytest.mark.skipif(
    connections["default"].vendor != "postgresql", reason="PostgreSQL's plan, as deployed"
)
def test_counting_running_answers_reads_only_the_users_running_answers(
    conversation: Conversation,
) -> None:
    """Not every conversation the user ever had (an API client makes one per call): the
    count needs no conversation, and the index of running answers by owner serves it
    (the plan of a big table, which a test's few rows would not get by themselves)."""
    owner = conversation.owner
    Conversation.objects.bulk_create([Conversation(owner=owner) for _ in range(50)])
    Message.objects.create(conversation=conversation, role="assistant", status=Status.STREAMING)
    with connections["default"].cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        sql = statements._running_answers_sql("default")
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", [owner.pk, Message.Role.ASSISTANT])
        plan = str(cursor.fetchone()[0])
    assert "msg_owner_streaming" in plan
    assert "streaming_conversation" not in plan
    assert statements.running_answers(owner.pk) == 1


def test_messages_of_a_conversation_come_oldest_first_with_their_prompt_fields(
    conversation: Conversation,
) -> None:
    first = Message.objects.create(conversation=conversation, role="user", content="a")
    call = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    second = Message.objects.create(
        conversation=conversation, parent=first, role="assistant", tool_calls=call
    )
    Message.objects.create(conversation=Conversation.objects.create(owner=conversation.owner))
    rows = statements.messages_of(conversation.id)
    assert [(m.id, m.parent_id, m.role) for m in rows] == [
        (first.id, None, "user"),
        (second.id, first.id, "assistant"),
    ]
    assert rows[1].tool_calls == call and rows[0].content == "a"


def test_update_rows_is_a_filtered_update(conversation: Conversation) -> None:
    answer = Message.objects.create(conversation=conversation, role="assistant")
    Segment.objects.create(message=answer, index=0, status=Status.STREAMING)
    Segment.objects.create(message=answer, index=1, status=Status.COMPLETE)
    changes = {"status": Status.CANCELLED, "tool_calls": [{"id": "c"}], "stop_reason": None}
    assert statements.update_rows(Segment, changes, message_id=answer.id, index=0) == 1
    assert statements.update_rows(Segment, changes, message_id=answer.id, status="x") == 0
    rows = Segment.objects.filter(message=answer).order_by("index")
    assert [(s.status, s.tool_calls, s.stop_reason) for s in rows] == [
        (Status.CANCELLED, [{"id": "c"}], None),
        (Status.COMPLETE, [], None),
    ]


def _statements(connection_queries: list[dict[str, Any]]) -> int:
    return sum(1 for q in connection_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE")))


def test_inserts_then_an_update_store_what_the_separate_statements_store(
    conversation: Conversation,
) -> None:
    question = Message(conversation=conversation, role=Message.Role.USER, content="q")
    answer = Message(conversation=conversation, parent=question, role=Message.Role.ASSISTANT)
    segment = Segment(message=answer, index=0, first_seq=1, worker="w")
    conversation.title, conversation.current_leaf = "asked", answer
    with CaptureQueriesContext(connections["default"]) as queries:
        statements.insert_then_update(
            [[question, answer], [], [segment]], conversation, ["title", "current_leaf"]
        )
    if connections["default"].vendor == "postgresql":
        assert _statements(queries.captured_queries) == 1
    assert not segment._state.adding and segment.pk == Segment.objects.get(message=answer).pk
    back = Conversation.objects.get(pk=conversation.pk)
    assert (back.title, back.current_leaf_id) == ("asked", answer.id)
    assert Message.objects.get(pk=answer.pk).parent_id == question.id
    # The same rows as one statement each give.
    again = Message(conversation=conversation, role=Message.Role.USER, content="q")
    again_answer = Message(conversation=conversation, parent=again, role=Message.Role.ASSISTANT)
    statements.insert([again, again_answer])
    assert {**stored(again), "parent_id": None} == {**stored(question), "parent_id": None}
    assert {**stored(again_answer), "parent_id": question.id} == stored(answer)


@pytest.mark.django_db(transaction=True)
def test_a_new_conversation_is_stored_with_its_messages_in_one_statement() -> None:
    """A conversation that starts with a post is inserted beside its messages, its leaf
    naming an answer inserted in the same statement (the keys are checked at commit)."""
    owner = User.objects.create_user("eve")
    conversation = Conversation(owner=owner, title="new")
    question = Message(conversation=conversation, role=Message.Role.USER, content="q")
    answer = Message(conversation=conversation, parent=question, role=Message.Role.ASSISTANT)
    segment = Segment(message=answer, index=0, first_seq=1, worker="w")
    conversation.current_leaf = answer
    with CaptureQueriesContext(connections["default"]) as queries, transaction.atomic():
        statements.insert_then_update([[conversation], [question, answer], [segment]])
    if connections["default"].vendor == "postgresql":
        assert _statements(queries.captured_queries) == 3, "BEGIN, the writes, COMMIT"
    back = Conversation.objects.get(pk=conversation.pk)
    assert (back.title, back.owner_id, back.current_leaf_id) == ("new", owner.pk, answer.id)
    assert back.created_at is not None and back.updated_at is not None
    assert [m.owner_id for m in Message.objects.filter(conversation=back)] == [owner.pk] * 2
    assert not conversation._state.adding and segment.pk == Segment.objects.get().pk


def _steps(answer: Message, conversation: Conversation, index: int) -> list[statements.Step]:
    return [
        (Segment, {"status": Status.COMPLETE}, {"message_id": answer.id, "index": index}),
        (Message, {"content": "done"}, {"id": answer.id}),
        (Conversation, {"title": "ended"}, {"id": conversation.id}),
    ]


def test_a_chain_of_updates_runs_only_while_each_step_changes_a_row(
    conversation: Conversation,
) -> None:
    answer = Message.objects.create(conversation=conversation, role="assistant")
    Segment.objects.create(message=answer, index=0, status=Status.STREAMING)

    def state() -> tuple[str, str, str]:
        segment = Segment.objects.get(message=answer)
        return segment.status, Message.objects.get(pk=answer.pk).content, conversation_title()

    def conversation_title() -> str:
        return Conversation.objects.get(pk=conversation.pk).title

    assert statements.update_chain(_steps(answer, conversation, index=1)) is False
    assert state() == (Status.STREAMING, "", "t")
    with CaptureQueriesContext(connections["default"]) as queries:
        assert statements.update_chain(_steps(answer, conversation, index=0)) is True
    if connections["default"].vendor == "postgresql":
        assert _statements(queries.captured_queries) == 1
    assert state() == (Status.COMPLETE, "done", "ended")
    # A later step that changes nothing stops the ones after it; the first still counts.
    Segment.objects.filter(message=answer).update(status=Status.STREAMING)
    gone = [*_steps(answer, conversation, 0)]
    gone[1] = (Message, {"content": "again"}, {"id": uuid.uuid4()})
    gone[2] = (Conversation, {"title": "not reached"}, {"id": conversation.id})
    assert statements.update_chain(gone) is True
    assert state() == (Status.COMPLETE, "done", "ended")


@pytest.mark.skipif(
    connections["default"].vendor != "postgresql", reason="PostgreSQL's prepared statements"
)
@pytest.mark.django_db(transaction=True)
def test_a_prepared_read_survives_a_column_added_under_it() -> None:
    """A deployment migrates while the old processes serve: their prepared statements
    must keep working when a table gains a column (``SELECT *`` would change shape)."""
    conversation = Conversation.objects.create(owner=User.objects.create_user("cy"), title="t")
    owner = conversation.owner_id
    connection = connections["default"]

    def locked() -> Conversation | None:
        with transaction.atomic():
            return statements.lock_conversation(owner, conversation.id)

    for _ in range(8):
        assert locked() is not None
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any("FOR UPDATE" in sql for sql in prepared), "the locking read is prepared"

    table = Conversation._meta.db_table
    with psycopg_connection() as other:
        other.execute(f'ALTER TABLE "{table}" ADD COLUMN added_later integer')
        try:
            found = locked()
        finally:
            other.execute(f'ALTER TABLE "{table}" DROP COLUMN added_later')
    assert found is not None and found.title == "t"


def psycopg_connection() -> Any:
    """A connection of its own to the test database, outside Django's."""
    import psycopg

    params = connections["default"].get_connection_params()
    keep = ("dbname", "user", "password", "host", "port")
    return psycopg.connect(autocommit=True, **{k: v for k, v in params.items() if k in keep})


def test_a_posts_reads_are_the_lock_count_messages_and_key(conversation: Conversation) -> None:
    owner = conversation.owner_id
    question = Message.objects.create(conversation=conversation, role="user", content="q")
    answer = Message.objects.create(
        conversation=conversation,
        parent=question,
        role="assistant",
        status=Status.STREAMING,
        idempotency_key=f"{owner}:k",
    )
    with transaction.atomic():
        reads = statements.post_reads(owner, conversation.id, f"{owner}:k")
    assert reads.conversation == conversation and reads.conversation.title == "t"
    assert reads.running == 1
    assert [(m.id, m.parent_id, m.content) for m in reads.messages] == [
        (question.id, None, "q"),
        (answer.id, question.id, ""),
    ]
    assert reads.keyed == answer
    with transaction.atomic():
        new = statements.post_reads(owner, None, f"{owner}:other")
    assert (new.conversation, new.running, new.messages, new.keyed) == (None, 1, [], None)


def test_a_post_reads_nothing_of_a_conversation_not_the_users(conversation: Conversation) -> None:
    Message.objects.create(conversation=conversation, role="user", content="secret")
    other = User.objects.create_user("bob")
    with transaction.atomic():
        reads = statements.post_reads(other.pk, conversation.id, None)
    assert (reads.conversation, reads.running, reads.messages) == (None, 0, [])
    with pytest.raises(ValidationError), transaction.atomic():
        statements.post_reads(other.pk, "not-a-uuid", None)


def _round_trips(connection: Any, action: Callable[[], Any]) -> int:
    """How many times the client waited for PostgreSQL while ``action`` ran: in libpq's
    trace of the protocol, each run of the client's messages answered by the server's."""
    from psycopg import pq

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            action()
        finally:
            pgconn.untrace()
        trace.seek(0)
        senders = [line.split("\t")[0] for line in trace.read().splitlines() if line]
    return sum(1 for pair in itertools.pairwise(senders) if pair == ("F", "B"))


@pytest.mark.skipif(
    connections["default"].vendor != "postgresql", reason="PostgreSQL's round trips"
)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("key", [None, "1:k"])
def test_a_posts_reads_go_in_one_round_trip_after_its_begin(key: str | None) -> None:
    """The lock, the count, the messages and the key's message: one round trip, where
    they were one each (psycopg still has the transaction's ``BEGIN`` answered first)."""
    conversation = Conversation.objects.create(owner=User.objects.create_user("cy"), title="t")

    def post() -> None:
        with transaction.atomic():
            statements.post_reads(conversation.owner_id, conversation.id, key)

    for _ in range(8):  # and again once the statements are prepared
        assert _round_trips(connections["default"], post) == 3  # BEGIN, reads, COMMIT


@pytest.mark.skipif(connections["default"].vendor != "postgresql", reason="PostgreSQL's row locks")
@pytest.mark.django_db(transaction=True)
def test_a_posts_count_is_read_once_its_lock_is_held() -> None:
    """Read in one round trip, the count still runs after the lock: a post that waited
    for another transaction of the same user counts the answer that one committed."""
    conversation = Conversation.objects.create(owner=User.objects.create_user("di"), title="t")
    owner = conversation.owner_id
    user_table, conversation_table = User._meta.db_table, Conversation._meta.db_table
    result: dict[str, Any] = {}

    def post() -> None:
        try:
            with transaction.atomic():
                result["reads"] = statements.post_reads(owner, conversation.id, None)
        finally:
            connections.close_all()

    with psycopg_connection() as other:
        other.execute("BEGIN")
        # What a post in another conversation of the user's would lock.
        other.execute(
            f'SELECT 1 FROM "{conversation_table}" c JOIN "{user_table}" u ON u.id = c.owner_id'
            " WHERE c.id = %s FOR UPDATE OF c, u",
            [conversation.id],
        )
        other.execute(
            f'INSERT INTO "{Message._meta.db_table}" (id, conversation_id, owner_id, role,'
            " content, reasoning, tool_calls, tool_call_id, status, termination, params,"
            " model, last_seq, created_at, updated_at) VALUES (%s, %s, %s, 'assistant', '',"
            " '', '[]', '', 'streaming', '{}', '{}', '', 0, now(), now())",
            [uuid.uuid4(), conversation.id, owner],
        )
        waiting = threading.Thread(target=post)
        waiting.start()
        with psycopg_connection() as watcher:
            while not watcher.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%%FOR UPDATE%%' AND pid <> pg_backend_pid()"
            ).fetchone():
                waiting.join(timeout=0.01)  # poll the server for the waiter: an event
                assert waiting.is_alive(), "the post did not wait for the lock"
        other.execute("COMMIT")
        waiting.join(timeout=30)
    assert result["reads"].running == 1, "the count saw the answer committed under the lock"


def _answer_rows(conversation: Conversation) -> tuple[Message, Message, Segment]:
    question = Message(conversation=conversation, role="user", content="q")
    answer = Message(
        conversation=conversation, parent=question, role="assistant", status=Status.STREAMING
    )
    return question, answer, Segment(message=answer, index=0, first_seq=1, worker="w")


def _post(owner: Any, conversation: Conversation, then: Callable[[], Any] = lambda: None) -> Any:
    """A post's statements in its transaction: the reads, the writes, ``then``."""
    with statements.creating_transaction() as tx:
        reads = statements.post_reads(owner, conversation.id, None)
        question, answer, segment = _answer_rows(reads.conversation or conversation)
        tx.write([[question, answer], [segment]], conversation, ["updated_at"])
        then()
    return question, answer, segment


def _idle_in_autocommit() -> None:
    """The connection is as Django keeps it outside a transaction, and it works."""
    connection = connections["default"]
    assert connection.get_autocommit() and not connection.in_atomic_block
    if connection.vendor == "postgresql":
        from psycopg.pq import TransactionStatus

        raw = connection.connection
        assert raw.autocommit and raw.info.transaction_status == TransactionStatus.IDLE
    assert Conversation.objects.count() >= 1


@pytest.mark.skipif(
    connections["default"].vendor != "postgresql", reason="PostgreSQL's round trips"
)
@pytest.mark.django_db(transaction=True)
def test_a_post_is_two_round_trips_and_commits() -> None:
    """``BEGIN`` with the reads, the writes with ``COMMIT``: two round trips where psycopg
    under Django's ``atomic`` needs four (each of ``BEGIN`` and ``COMMIT`` on its own)."""
    conversation = Conversation.objects.create(owner=User.objects.create_user("ed"), title="t")
    made: list[Any] = []
    for _ in range(8):  # and again once the statements are prepared
        count = _round_trips(
            connections["default"], lambda: made.append(_post(conversation.owner_id, conversation))
        )
        assert count == 2
    _idle_in_autocommit()
    *_, segment = made[-1]
    assert segment.pk is not None and not segment._state.adding, "its key read back"
    with psycopg_connection() as other:  # committed: another connection sees the rows
        seen = other.execute(
            f'SELECT count(*) FROM "{Segment._meta.db_table}" WHERE id = %s', [segment.pk]
        ).fetchone()
    assert seen == (1,)
    assert Message.objects.filter(conversation=conversation).count() == 16


@pytest.mark.django_db(transaction=True)
def test_a_post_refused_after_its_writes_leaves_nothing(conversation: Conversation) -> None:
    def refuse() -> None:
        raise RuntimeError("refused")

    with pytest.raises(RuntimeError):
        _post(conversation.owner_id, conversation, then=refuse)
    assert not Message.objects.exists() and not Segment.objects.exists()
    _idle_in_autocommit()


@pytest.mark.django_db(transaction=True)
def test_a_post_whose_write_fails_raises_djangos_error_and_leaves_nothing(
    conversation: Conversation,
) -> None:
    taken = Message.objects.create(conversation=conversation, role="user", content="first")
    with pytest.raises(IntegrityError), statements.creating_transaction() as tx:
        statements.post_reads(conversation.owner_id, conversation.id, None)
        question, answer, segment = _answer_rows(conversation)
        question.id = taken.id  # the primary key of a stored message
        tx.write([[question, answer], [segment]])
    assert list(Message.objects.values_list("content", flat=True)) == ["first"]
    assert not Segment.objects.exists() and segment._state.adding
    _idle_in_autocommit()


@pytest.mark.django_db(transaction=True)
def test_a_posts_on_commit_callbacks_run_once_it_committed(conversation: Conversation) -> None:
    seen: list[int] = []

    def count_from_elsewhere() -> None:
        # Django's own connection is this thread's: ask another one what is committed.
        with ThreadedCount() as counted:
            seen.append(counted)

    _post(
        conversation.owner_id,
        conversation,
        then=lambda: transaction.on_commit(count_from_elsewhere),
    )
    assert seen == [2]


class ThreadedCount:
    """The messages another thread (its own connection) sees: what is committed."""

    def __enter__(self) -> int:
        result: list[int] = []

        def count() -> None:
            try:
                result.append(Message.objects.count())
            finally:
                connections.close_all()

        thread = threading.Thread(target=count)
        thread.start()
        thread.join(timeout=30)
        return result[0]

    def __exit__(self, *exc_info: object) -> None:
        pass


def test_a_post_inside_another_transaction_writes_at_once(conversation: Conversation) -> None:
    """Nested (here in the test's transaction): a savepoint, the writes run as they come."""
    *_, segment = _post(conversation.owner_id, conversation)
    assert segment.pk is not None
    assert Message.objects.filter(conversation=conversation).count() == 2


def test_rows_are_deleted_by_a_field_in_one_statement(conversation: Conversation) -> None:
    """Only the rows whose field is one of the values go, in one statement whatever their
    number (no row loaded, no id named), links between them with them."""
    other = Conversation.objects.create(owner=conversation.owner)
    first = Message.objects.create(conversation=conversation, role="user", content="a")
    Message.objects.create(conversation=conversation, role="user", content="b", parent=first)
    kept = Message.objects.create(conversation=other, role="user", content="c")
    assert statements.delete_rows(Message, "conversation", []) == 0
    with CaptureQueriesContext(connections["default"]) as queries:
        assert statements.delete_rows(Message, "conversation", [conversation.pk]) == 2
    assert len(queries.captured_queries) == 1
    assert list(Message.objects.values_list("pk", flat=True)) == [kept.pk]
