"""The data migrations: what was stored before one reads back as its contract says after it.

Each test migrates the test database back to the state before a migration, writes rows
with the historical models, migrates forward (and back), and reads them again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

Target = list[tuple[str, str]]


@pytest.fixture
def migrate() -> Iterator[Callable[[Target], Any]]:
    """Move the schema to a target; returns that state's app registry. Ends at the latest."""

    def to(target: Target) -> Any:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(target)
        return executor.loader.project_state(target).apps

    yield to
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def test_stored_records_lose_the_worker_and_get_it_back_on_reverse(migrate) -> None:
    before = migrate([("streaming", "0001_initial")])
    User = before.get_model("auth", "User")
    Conversation = before.get_model("streaming", "Conversation")
    Message = before.get_model("streaming", "Message")
    Segment = before.get_model("streaming", "Segment")
    user = User.objects.create(username="migrated")
    conversation = Conversation.objects.create(owner=user, title="old")
    record = {"status": "complete", "completion_tokens": 3, "worker": "host:12:34"}
    answer = Message.objects.create(
        conversation=conversation, role="assistant", content="abc", status="complete",
        termination=record,
    )  # fmt: skip
    Segment.objects.create(message=answer, index=0, first_seq=1, worker="host:12:34")
    question = Message.objects.create(conversation=conversation, role="user", content="q")

    after = migrate([("streaming", "0002_termination_without_worker")])
    stored = after.get_model("streaming", "Message").objects.get(id=answer.id)
    assert stored.termination == {"status": "complete", "completion_tokens": 3}
    assert after.get_model("streaming", "Segment").objects.get(message_id=answer.id).worker == (
        "host:12:34"
    )
    assert after.get_model("streaming", "Message").objects.get(id=question.id).termination == {}

    reverted = migrate([("streaming", "0001_initial")])
    assert reverted.get_model("streaming", "Message").objects.get(id=answer.id).termination == (
        record
    )
    assert reverted.get_model("streaming", "Message").objects.get(id=question.id).termination == {}


def test_a_linear_conversation_reads_back_identically_as_one_branch(migrate) -> None:
    from django.contrib.auth.models import User as CurrentUser

    from streaming.models import Conversation as CurrentConversation
    from streaming.selectors import branch_ids

    before = migrate([("streaming", "0002_termination_without_worker")])
    User = before.get_model("auth", "User")
    Conversation = before.get_model("streaming", "Conversation")
    Message = before.get_model("streaming", "Message")
    user = User.objects.create(username="linear")
    conversation = Conversation.objects.create(owner=user, title="before trees")
    empty = Conversation.objects.create(owner=user, title="nothing yet")
    stored = [
        Message.objects.create(conversation=conversation, role=role, content=f"turn {i}")
        for i, role in enumerate(["user", "assistant", "user", "assistant", "user"])
    ]
    updated_at = Conversation.objects.get(id=conversation.id).updated_at

    migrate([("streaming", "0004_link_linear_conversations")])
    owner = CurrentUser.objects.get(id=user.id)
    tree, ids = branch_ids(owner, conversation.id)
    assert ids == [str(m.id) for m in stored], "the same messages, in the same order"
    assert [tree.parents[i] for i in ids] == [None, *ids[:-1]]
    after = CurrentConversation.objects.get(id=conversation.id)
    assert str(after.current_leaf_id) == ids[-1]
    assert after.updated_at == updated_at, "the sidebar order is kept"
    assert CurrentConversation.objects.get(id=empty.id).current_leaf_id is None

    reverted = migrate([("streaming", "0002_termination_without_worker")])
    contents = reverted.get_model("streaming", "Message").objects.filter(
        conversation_id=conversation.id
    )
    assert sorted(contents.values_list("content", flat=True)) == [f"turn {i}" for i in range(5)]


DROPPED_INDEXES = {
    "streaming_conversation": ["streaming_conversation_owner_id_b4bde1ea"],
    "streaming_message": [
        "streaming_message_conversation_id_453f75f7",
        "streaming_message_status_c0bced7a",
    ],
    "streaming_segment": [
        "streaming_segment_message_id_fc8fa5ce",
        "streaming_segment_status_e1ae5c0d",
        "streaming_segment_worker_42d122ed",
    ],
}


def _index_names(table: str) -> set[str]:
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
    return {name for name, info in found.items() if info["index"]}


def test_covered_indexes_are_dropped_and_come_back_on_reverse(migrate) -> None:
    migrate([("streaming", "0009_message_idempotency_key")])
    for table, names in DROPPED_INDEXES.items():
        assert set(names) <= _index_names(table), table

    migrate([("streaming", "0010_redundant_indexes")])
    for table, names in DROPPED_INDEXES.items():
        assert not set(names) & _index_names(table), table


def test_stored_messages_get_their_conversations_owner_and_lose_it_on_reverse(migrate) -> None:
    before = migrate([("streaming", "0010_redundant_indexes")])
    User = before.get_model("auth", "User")
    Conversation = before.get_model("streaming", "Conversation")
    Message = before.get_model("streaming", "Message")
    ann, bob = User.objects.create(username="ann"), User.objects.create(username="bob")
    mine = Conversation.objects.create(owner=ann)
    theirs = Conversation.objects.create(owner=bob)
    asked = Message.objects.create(conversation=mine, role="user", content="q")
    answering = Message.objects.create(conversation=theirs, role="assistant", status="streaming")

    after = migrate([("streaming", "0011_message_owner")])
    owners = dict(after.get_model("streaming", "Message").objects.values_list("id", "owner_id"))
    assert owners == {asked.id: ann.id, answering.id: bob.id}

    reverted = migrate([("streaming", "0010_redundant_indexes")])
    fields = {f.name for f in reverted.get_model("streaming", "Message")._meta.get_fields()}
    assert "owner" not in fields
    assert reverted.get_model("streaming", "Message").objects.count() == 2


def _fill_factor(table: str) -> str | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [table])
        options = dict(o.split("=", 1) for o in cursor.fetchone()[0] or [])
    return options.get("fillfactor")


def test_the_messages_pages_keep_room_for_rewrites_and_lose_it_on_reverse(migrate) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("a fill factor is PostgreSQL's")
    migrate([("streaming", "0012_segment_streaming_worker")])
    assert _fill_factor("streaming_message") is None
    migrate([("streaming", "0013_message_fillfactor")])
    assert _fill_factor("streaming_message") == "70"
