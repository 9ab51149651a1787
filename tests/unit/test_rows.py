"""A reader gives what ``raw()`` gives for the same statement, on the database the suite
runs on (PostgreSQL in CI, SQLite without ``DATABASE_URL``), and works its plan out once."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Model

from streaming.models import Conversation, Message
from streaming.rows import Reader
from streaming.termination import Status

pytestmark = pytest.mark.django_db


def values(obj: Model) -> dict[str, Any]:
    """Every loaded field's value (deferred fields are not in ``__dict__``)."""
    return {
        f.attname: obj.__dict__[f.attname]
        for f in obj._meta.concrete_fields
        if f.attname in obj.__dict__
    }


@pytest.fixture
def answer() -> Message:
    conversation = Conversation.objects.create(owner=User.objects.create_user("ann"), title="t")
    question = Message.objects.create(conversation=conversation, role="user", content="q")
    return Message.objects.create(
        conversation=conversation,
        parent=question,
        role=Message.Role.ASSISTANT,
        content="Hé 日本 🚀",
        tool_calls=[{"id": "c1", "type": "function", "function": {"name": "f"}}],
        params={"max_tokens": 5, "stop": ["\n"]},
        status=Status.STREAMING,
        model="m",
    )


def table(model: type[Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def test_every_column_comes_back_as_raw_gives_it(answer: Message) -> None:
    sql = f"SELECT * FROM {table(Message)} WHERE conversation_id = %s ORDER BY created_at"
    params = [Message._meta.pk.get_db_prep_value(answer.conversation_id, connection)]  # type: ignore[union-attr]
    read = Reader(Message, "default", sql).fetch(params)
    by_raw = list(Message.objects.raw(sql, params))
    assert [values(m) for m in read] == [values(m) for m in by_raw]
    assert read[1].tool_calls == answer.tool_calls and read[1].params == answer.params
    assert read[1].created_at == answer.created_at and read[1].id == answer.id
    assert not read[1]._state.adding and read[1]._state.db == "default"


def test_columns_not_selected_are_deferred_and_the_order_of_columns_does_not_matter(
    answer: Message,
) -> None:
    sql = f"SELECT content, status, id FROM {table(Message)} WHERE id = %s"
    params = [Message._meta.pk.get_db_prep_value(answer.id, connection)]  # type: ignore[union-attr]
    (read,) = Reader(Message, "default", sql).fetch(params)
    assert (read.id, read.content, read.status) == (answer.id, answer.content, answer.status)
    assert read.get_deferred_fields() == {
        f.attname
        for f in Message._meta.concrete_fields
        if f.attname not in {"id", "content", "status"}
    }
    assert read.model == "m"  # loaded on access, as for raw()


def test_the_plan_is_made_once_per_set_of_columns(answer: Message) -> None:
    reader = Reader(User, "default", f"SELECT * FROM {table(User)} WHERE id = %s")
    assert reader.fetch([answer.conversation.owner_id])[0].username == "ann"
    plan = reader._plan
    assert reader.fetch([-1]) == []
    assert reader._plan is plan is not None
    # What ``SELECT *`` returns changed under the process (a migration): planned again.
    reader.sql = f"SELECT username, id FROM {table(User)} WHERE id = %s"
    (found,) = reader.fetch([answer.conversation.owner_id])
    assert (found.username, found.get_deferred_fields() >= {"email"}) == ("ann", True)
    assert reader._plan is not plan


@pytest.mark.parametrize(
    ("columns", "error"),
    [("id, 1 AS extra", "not fields of streaming.Message"), ("content", "the primary key")],
)
def test_a_statement_that_cannot_make_instances_is_refused(
    answer: Message, columns: str, error: str
) -> None:
    reader = Reader(Message, "default", f"SELECT {columns} FROM {table(Message)}")
    with pytest.raises(ValueError, match=error):
        reader.fetch([])
