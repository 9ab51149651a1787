"""The statements every new answer pays for, with their SQL built once.

Creating an answer locks, counts, reads the conversation's messages, inserts three rows
and updates one, in one transaction. Built through the ORM's query compiler, each of
those statements cost several times its round trip in CPU (docs/performance.md), and at
a hundred answers a second that CPU is what saturates a process. Here each statement's
text is built once per model from the model's own metadata; values are prepared by the
model's fields (``pre_save``, ``get_db_prep_save``) and rows come back through
``raw()``, which applies the fields' converters. So what is written and read is what
``objects.create``/``save``/a queryset would give, on PostgreSQL and SQLite alike.

Not sent: model signals. Nothing listens to the saves of these models (a unit test
checks that no receiver is connected); one added later needs the ORM's ``save``.
Locks: ``FOR UPDATE`` where the database has it; SQLite's transactions are ``IMMEDIATE``
(``chatsite.settings``), so a write transaction there holds the database's write lock
from its start and needs no row locks.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from django.contrib.auth import get_user_model
from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model

from streaming.models import Conversation, Message
from streaming.termination import Status

M = TypeVar("M", bound=Model)
# The columns a prompt and a conversation's tree need (``branches``).
PROMPT_FIELDS = ("id", "parent_id", "role", "content", "tool_calls", "tool_call_id")


def _connection(model: type[Model]) -> tuple[str, BaseDatabaseWrapper]:
    alias = router.db_for_write(model)
    return alias, connections[alias]


def _field(model: type[Model], name: str) -> Field[Any, Any]:
    """A concrete field by name, attname or ``"pk"``."""
    field = model._meta.pk if name == "pk" else model._meta.get_field(name)
    assert isinstance(field, Field) and field.column is not None
    return field


def _column(connection: BaseDatabaseWrapper, model: type[Model], name: str) -> str:
    column = _field(model, name).column
    assert column is not None
    return connection.ops.quote_name(column)


def _table(connection: BaseDatabaseWrapper, model: type[Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


# --- writes -----------------------------------------------------------------------------
@functools.cache
def _insert_sql(
    model: type[Model], alias: str, rows: int, with_pk: bool
) -> tuple[str, tuple[Field[Any, Any], ...], bool]:
    meta = model._meta
    connection = connections[alias]
    fields = tuple(f for f in meta.local_concrete_fields if with_pk or f is not meta.auto_field)
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    values = ", ".join([row] * rows)
    sql = f"INSERT INTO {_table(connection, model)} ({columns}) VALUES {values}"
    returning = not with_pk
    if returning:
        assert meta.auto_field is not None and connection.features.can_return_rows_from_bulk_insert
        sql += f" RETURNING {connection.ops.quote_name(meta.auto_field.column)}"
    return sql, fields, returning


def insert(objs: Sequence[M]) -> None:
    """``INSERT`` unsaved instances of one model in one statement, stored as ``save()``
    stores them (defaults, ``auto_now_add``); an automatic primary key is read back."""
    if not objs:
        return
    model = type(objs[0])
    meta = model._meta
    alias, connection = _connection(model)
    with_pk = meta.auto_field is None or all(obj.pk is not None for obj in objs)
    sql, fields, returning = _insert_sql(model, alias, len(objs), with_pk)
    params: list[Any] = []
    for obj in objs:
        params.extend(f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        if returning:
            assert meta.auto_field is not None
            for obj, row in zip(objs, cursor.fetchall(), strict=True):
                setattr(obj, meta.auto_field.attname, row[0])
    for obj in objs:
        obj._state.adding = False
        obj._state.db = alias


@functools.cache
def _update_sql(
    model: type[Model], alias: str, names: tuple[str, ...], keys: tuple[str, ...]
) -> tuple[str, list[Field[Any, Any]], list[Field[Any, Any]]]:
    connection = connections[alias]
    assignments = ", ".join(f"{_column(connection, model, name)} = %s" for name in names)
    where = " AND ".join(f"{_column(connection, model, key)} = %s" for key in keys)
    sql = f"UPDATE {_table(connection, model)} SET {assignments} WHERE {where}"
    return sql, [_field(model, n) for n in names], [_field(model, k) for k in keys]


def update_rows(model: type[Model], values: Mapping[str, Any], **where: Any) -> int:
    """``model.objects.filter(**where).update(**values)`` for equality filters, in one
    statement; the number of rows changed. As with ``update()``, an ``auto_now`` field
    changes only when given."""
    alias, connection = _connection(model)
    sql, fields, keys = _update_sql(model, alias, tuple(values), tuple(where))
    params = [
        f.get_db_prep_save(v, connection) for f, v in zip(fields, values.values(), strict=True)
    ]
    params += [
        f.get_db_prep_value(v, connection) for f, v in zip(keys, where.values(), strict=True)
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


def update(obj: Model, names: Sequence[str]) -> None:
    """``obj.save(update_fields=names)`` in one statement (an ``auto_now`` field among
    ``names`` gets the time now, as ``save`` gives it)."""
    model = type(obj)
    update_rows(model, {n: _field(model, n).pre_save(obj, False) for n in names}, pk=obj.pk)


# --- reads in the creating transaction ----------------------------------------------------
@functools.cache
def _lock_conversation_sql(alias: str) -> str:
    connection = connections[alias]
    user = get_user_model()
    conversation, owner = _table(connection, Conversation), _table(connection, user)
    sql = (
        f"SELECT {conversation}.* FROM {conversation} INNER JOIN {owner}"
        f" ON {owner}.{_column(connection, user, 'pk')}"
        f" = {conversation}.{_column(connection, Conversation, 'owner')}"
        f" WHERE {conversation}.{_column(connection, Conversation, 'id')} = %s"
        f" AND {conversation}.{_column(connection, Conversation, 'owner')} = %s"
    )
    if connection.features.has_select_for_update_of:
        sql += f" FOR UPDATE OF {conversation}, {owner}"
    return sql


def lock_conversation(user_pk: Any, conversation_id: Any) -> Conversation | None:
    """The user's conversation ``conversation_id`` (a UUID), its row and its owner's
    locked until the transaction ends; ``None`` when the user has no such conversation."""
    alias, connection = _connection(Conversation)
    key = _field(Conversation, "pk")
    params = [key.get_db_prep_value(conversation_id, connection), user_pk]
    rows = list(Conversation.objects.using(alias).raw(_lock_conversation_sql(alias), params))
    return rows[0] if rows else None


@functools.cache
def _lock_user_sql(alias: str) -> str:
    connection = connections[alias]
    user = get_user_model()
    pk = _column(connection, user, "pk")
    sql = f"SELECT {pk} FROM {_table(connection, user)} WHERE {pk} = %s"
    if connection.features.has_select_for_update:
        sql += " FOR UPDATE"
    return sql


def lock_user(user_pk: Any) -> None:
    """Lock the user's row until the transaction ends (what every write of theirs that
    counts their answers takes first)."""
    alias, connection = _connection(get_user_model())
    with connection.cursor() as cursor:
        cursor.execute(_lock_user_sql(alias), [user_pk])
        cursor.fetchall()


@functools.cache
def _running_answers_sql(alias: str) -> str:
    connection = connections[alias]
    message, conversation = _table(connection, Message), _table(connection, Conversation)
    return (
        f"SELECT COUNT(*) FROM {message} INNER JOIN {conversation}"
        f" ON {message}.{_column(connection, Message, 'conversation')}"
        f" = {conversation}.{_column(connection, Conversation, 'id')}"
        f" WHERE {conversation}.{_column(connection, Conversation, 'owner')} = %s"
        f" AND {message}.{_column(connection, Message, 'role')} = %s"
        f" AND {message}.{_column(connection, Message, 'status')} = %s"
    )


def running_answers(user_pk: Any) -> int:
    """How many of the user's answers are streaming now."""
    alias, connection = _connection(Message)
    with connection.cursor() as cursor:
        cursor.execute(
            _running_answers_sql(alias), [user_pk, Message.Role.ASSISTANT, Status.STREAMING]
        )
        row = cursor.fetchone()
    return int(row[0])


@functools.cache
def _messages_sql(alias: str) -> str:
    connection = connections[alias]
    columns = ", ".join(_column(connection, Message, name) for name in PROMPT_FIELDS)
    order = ", ".join(_column(connection, Message, name) for name in ("created_at", "id"))
    return (
        f"SELECT {columns} FROM {_table(connection, Message)}"
        f" WHERE {_column(connection, Message, 'conversation')} = %s ORDER BY {order}"
    )


def messages_of(conversation_id: Any) -> list[Message]:
    """Every message of a conversation, oldest first, with only ``PROMPT_FIELDS``."""
    alias, connection = _connection(Message)
    key = _field(Conversation, "pk")
    params = [key.get_db_prep_value(conversation_id, connection)]
    return list(Message.objects.using(alias).raw(_messages_sql(alias), params))
