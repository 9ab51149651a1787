"""The statements every new answer pays for, with their SQL built once.

Creating an answer locks, counts, reads the conversation's messages, inserts three rows
and updates one, in one transaction; ending it updates three rows. Built through the
ORM's query compiler, each of those statements cost several times its round trip in CPU
(docs/performance.md), and at a hundred answers a second that CPU is what saturates a
process. On PostgreSQL the writes of each go in one statement (writable CTEs), a round
trip each instead of one per row, and an answer's end needs no transaction of its own.
Here each statement's text is built once per model from the model's own metadata;
values are prepared by the model's fields (``pre_save``, ``get_db_prep_save``) and rows
come back through a ``rows.Reader``, which applies the fields' converters as ``raw()``
does. So what is written and read is what ``objects.create``/``save``/a queryset would
give, on PostgreSQL and SQLite alike.

Not sent: model signals. Nothing listens to the saves of these models (a unit test
checks that no receiver is connected); one added later needs the ORM's ``save``.
Locks: ``FOR UPDATE`` where the database has it; SQLite's transactions are ``IMMEDIATE``
(``chatsite.settings``), so a write transaction there holds the database's write lock
from its start and needs no row locks.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from django.contrib.auth import get_user_model
from django.db import connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model

from streaming.models import Conversation, Message
from streaming.rows import Reader, columns
from streaming.termination import Status

M = TypeVar("M", bound=Model)
# The columns a prompt and a conversation's tree need (``branches``), and whether the
# message a new one would follow has ended (``status``).
PROMPT_FIELDS = ("id", "parent_id", "role", "content", "tool_calls", "tool_call_id", "status")


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


def _insert_parts(objs: Sequence[Model], alias: str) -> tuple[str, list[Any], bool]:
    """The ``INSERT`` of ``objs`` (one model), its parameters, and whether it returns the
    automatic primary keys."""
    model = type(objs[0])
    meta = model._meta
    connection = connections[alias]
    with_pk = meta.auto_field is None or all(obj.pk is not None for obj in objs)
    sql, fields, returning = _insert_sql(model, alias, len(objs), with_pk)
    params: list[Any] = []
    for obj in objs:
        params.extend(f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields)
    return sql, params, returning


def _inserted(objs: Sequence[Model], alias: str, keys: Sequence[Any] | None) -> None:
    """Mark ``objs`` stored, with the automatic keys read back (in the rows' order)."""
    if keys is not None:
        auto = type(objs[0])._meta.auto_field
        assert auto is not None
        for obj, key in zip(objs, keys, strict=True):
            setattr(obj, auto.attname, key)
    for obj in objs:
        obj._state.adding = False
        obj._state.db = alias


def insert(objs: Sequence[M]) -> None:
    """``INSERT`` unsaved instances of one model in one statement, stored as ``save()``
    stores them (defaults, ``auto_now_add``); an automatic primary key is read back."""
    if not objs:
        return
    alias, connection = _connection(type(objs[0]))
    sql, params, returning = _insert_parts(objs, alias)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        keys = [row[0] for row in cursor.fetchall()] if returning else None
    _inserted(objs, alias, keys)


def _one_statement(connection: BaseDatabaseWrapper) -> bool:
    """Whether writes can be chained in one statement (PostgreSQL's writable CTEs)."""
    return connection.vendor == "postgresql"


class Write(Protocol):
    """``insert_then_update``'s signature: what stores an answer's rows."""

    def __call__(
        self, groups: Sequence[Sequence[Model]], obj: Model | None = None, names: Sequence[str] = ()
    ) -> None: ...


def insert_then_update(
    groups: Sequence[Sequence[Model]], obj: Model | None = None, names: Sequence[str] = ()
) -> None:
    """``insert(group)`` for each of ``groups``, then ``update(obj, names)`` (none when
    ``obj`` is None).

    On PostgreSQL in one statement, one round trip instead of one per write: the inserts
    are data-modifying CTEs and the update is run beside them. They see one snapshot, so
    ``obj`` must be a row that exists already; the new rows may refer to each other and
    ``obj`` to them, in any order, because Django declares foreign keys ``DEFERRABLE
    INITIALLY DEFERRED`` (checked at commit). Elsewhere one statement each, in this
    order."""
    _start_insert_then_update(groups, obj, names)(True)


def _start_insert_then_update(
    groups: Sequence[Sequence[Model]], obj: Model | None, names: Sequence[str]
) -> Callable[[bool], None]:
    """``insert_then_update`` up to its statement's execution; the call it returns reads
    the automatic keys back and marks the rows stored (``False``: the transaction did
    not commit, nothing is marked). Inside a pipeline the statement is only queued until
    then (``creating_transaction``)."""
    groups = [group for group in groups if group]
    alias, connection = _connection(type(obj) if obj is not None else type(groups[0][0]))
    if not _one_statement(connection):
        for group in groups:
            insert(group)
        if obj is not None:
            update(obj, names)
        return _nothing
    ctes, params, reads, returns = [], [], [], []
    for i, group in enumerate(groups):
        sql, group_params, returning = _insert_parts(group, alias)
        ctes.append(f"w{i} AS ({sql})")
        params += group_params
        returns.append(returning)
        if returning:
            auto = type(group[0])._meta.auto_field
            assert auto is not None
            reads.append(f"SELECT {i}, {connection.ops.quote_name(auto.column)} FROM w{i}")
    if obj is not None:
        usql, uparams = _update_parts(type(obj), _saved(obj, names), {"pk": obj.pk}, alias)
        ctes.append(f"u AS ({usql})")
        params += uparams
    main = " UNION ALL ".join(reads) if reads else "SELECT NULL, NULL"
    cursor = connection.cursor()
    try:
        cursor.execute(f"WITH {', '.join(ctes)} {main}", params)
    except BaseException:
        cursor.close()
        raise

    def stored(committed: bool) -> None:
        with cursor:
            rows = cursor.fetchall() if reads and committed else []
        if committed:
            for i, group in enumerate(groups):
                keys = [key for at, key in rows if at == i] if returns[i] else None
                _inserted(group, alias, keys)

    return stored


def _nothing(committed: bool) -> None:
    pass


@functools.cache
def _update_sql(
    model: type[Model], alias: str, names: tuple[str, ...], keys: tuple[str, ...]
) -> tuple[str, list[Field[Any, Any]], list[Field[Any, Any]]]:
    connection = connections[alias]
    assignments = ", ".join(f"{_column(connection, model, name)} = %s" for name in names)
    where = " AND ".join(f"{_column(connection, model, key)} = %s" for key in keys)
    sql = f"UPDATE {_table(connection, model)} SET {assignments} WHERE {where}"
    return sql, [_field(model, n) for n in names], [_field(model, k) for k in keys]


def _update_parts(
    model: type[Model], values: Mapping[str, Any], where: Mapping[str, Any], alias: str
) -> tuple[str, list[Any]]:
    connection = connections[alias]
    sql, fields, keys = _update_sql(model, alias, tuple(values), tuple(where))
    params = [
        f.get_db_prep_save(v, connection) for f, v in zip(fields, values.values(), strict=True)
    ]
    params += [
        f.get_db_prep_value(v, connection) for f, v in zip(keys, where.values(), strict=True)
    ]
    return sql, params


def update_rows(model: type[Model], values: Mapping[str, Any], **where: Any) -> int:
    """``model.objects.filter(**where).update(**values)`` for equality filters, in one
    statement; the number of rows changed. As with ``update()``, an ``auto_now`` field
    changes only when given."""
    alias, connection = _connection(model)
    sql, params = _update_parts(model, values, where, alias)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


def delete_rows(model: type[Model], name: str, values: Sequence[Any]) -> int:
    """The rows of ``model`` whose field ``name`` is one of ``values``, deleted in one
    statement without Django's collector, which loads every row and names every id in
    one statement's parameters (PostgreSQL takes at most 65,535). For rows whose
    relations the caller has dealt with, or that go with them in the same statement (the
    foreign keys are checked at its end); the number deleted."""
    if not values:
        return 0
    _, connection = _connection(model)
    field = _field(model, name)
    column = _column(connection, model, name)
    marks = ", ".join(["%s"] * len(values))
    sql = f"DELETE FROM {_table(connection, model)} WHERE {column} IN ({marks})"
    with connection.cursor() as cursor:
        cursor.execute(sql, [field.get_db_prep_value(v, connection) for v in values])
        return int(cursor.rowcount)


# One ``update_rows`` of a chain: the model, the values set, the equality filters.
Step = tuple[type[Model], Mapping[str, Any], Mapping[str, Any]]


def update_chain(steps: Sequence[Step]) -> bool:
    """``update_rows`` for each step in order, each only when the step before it changed a
    row; whether the first changed any. On PostgreSQL one statement (each step a
    data-modifying CTE guarded by ``EXISTS`` over the one before, which also takes the
    rows' locks in the steps' order), elsewhere a transaction. The steps update
    different tables (a row changed twice in one statement is undefined there). Atomic."""
    alias, connection = _connection(steps[0][0])
    if not _one_statement(connection):
        with transaction.atomic(using=alias):
            for i, (model, values, where) in enumerate(steps):
                if not update_rows(model, values, **where):
                    return i > 0
        return True
    ctes, params = [], []
    for i, (model, values, where) in enumerate(steps):
        sql, step_params = _update_parts(model, values, where, alias)
        guard = f" AND EXISTS (SELECT 1 FROM s{i - 1})" if i else ""
        ctes.append(f"s{i} AS ({sql}{guard} RETURNING 1)")
        params += step_params
    last = len(steps) - 1
    with connection.cursor() as cursor:
        # The main query reads the last step, which makes every step before it run first.
        cursor.execute(
            f"WITH {', '.join(ctes)} SELECT (SELECT COUNT(*) FROM s0), COUNT(*) FROM s{last}",
            params,
        )
        row = cursor.fetchone()
    return bool(row[0])


def update(obj: Model, names: Sequence[str]) -> None:
    """``obj.save(update_fields=names)`` in one statement (an ``auto_now`` field among
    ``names`` gets the time now, as ``save`` gives it)."""
    update_rows(type(obj), _saved(obj, names), pk=obj.pk)


def _saved(obj: Model, names: Sequence[str]) -> dict[str, Any]:
    """The values ``save(update_fields=names)`` would store (``auto_now`` applied)."""
    model = type(obj)
    return {n: _field(model, n).pre_save(obj, False) for n in names}


# --- reads in the creating transaction ----------------------------------------------------
@functools.cache
def _lock_conversation(alias: str) -> Reader[Conversation]:
    connection = connections[alias]
    user = get_user_model()
    conversation, owner = _table(connection, Conversation), _table(connection, user)
    sql = (
        f"SELECT {columns(connection, Conversation, conversation)} FROM {conversation}"
        f" INNER JOIN {owner}"
        f" ON {owner}.{_column(connection, user, 'pk')}"
        f" = {conversation}.{_column(connection, Conversation, 'owner')}"
        f" WHERE {conversation}.{_column(connection, Conversation, 'id')} = %s"
        f" AND {conversation}.{_column(connection, Conversation, 'owner')} = %s"
    )
    if connection.features.has_select_for_update_of:
        sql += f" FOR UPDATE OF {conversation}, {owner}"
    return Reader(Conversation, alias, sql)


def _conversation_key(conversation_id: Any, connection: BaseDatabaseWrapper) -> Any:
    """A conversation id as the database takes it; raises (``ValidationError``) for a
    malformed one."""
    return _field(Conversation, "pk").get_db_prep_value(conversation_id, connection)


def lock_conversation(user_pk: Any, conversation_id: Any) -> Conversation | None:
    """The user's conversation ``conversation_id`` (a UUID), its row and its owner's
    locked until the transaction ends; ``None`` when the user has no such conversation."""
    alias, connection = _connection(Conversation)
    params = [_conversation_key(conversation_id, connection), user_pk]
    rows = _lock_conversation(alias).fetch(params)
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


@functools.cache
def _running_answers_sql(alias: str) -> str:
    """The status is written into the statement, not bound: the planner then knows it
    may read the index of streaming answers by owner (``msg_owner_streaming``), which
    holds only them, so the count reads the user's running answers and nothing else."""
    connection = connections[alias]
    status = _column(connection, Message, "status")
    assert Status.STREAMING.isidentifier(), "written into the statement as a literal"
    return (
        f"SELECT COUNT(*) FROM {_table(connection, Message)}"
        f" WHERE {_column(connection, Message, 'owner')} = %s"
        f" AND {_column(connection, Message, 'role')} = %s"
        f" AND {status} = '{Status.STREAMING.value}'"
    )


def running_answers(user_pk: Any) -> int:
    """How many of the user's answers are streaming now."""
    alias, connection = _connection(Message)
    with connection.cursor() as cursor:
        cursor.execute(_running_answers_sql(alias), [user_pk, Message.Role.ASSISTANT])
        row = cursor.fetchone()
    return int(row[0])


@functools.cache
def _messages(alias: str) -> Reader[Message]:
    connection = connections[alias]
    columns = ", ".join(_column(connection, Message, name) for name in PROMPT_FIELDS)
    order = ", ".join(_column(connection, Message, name) for name in ("created_at", "id"))
    sql = (
        f"SELECT {columns} FROM {_table(connection, Message)}"
        f" WHERE {_column(connection, Message, 'conversation')} = %s ORDER BY {order}"
    )
    return Reader(Message, alias, sql)


def messages_of(conversation_id: Any) -> list[Message]:
    """Every message of a conversation, oldest first, with only ``PROMPT_FIELDS``."""
    alias, connection = _connection(Message)
    return _messages(alias).fetch([_conversation_key(conversation_id, connection)])


@functools.cache
def _keyed(alias: str) -> Reader[Message]:
    connection = connections[alias]
    key = _column(connection, Message, "idempotency_key")
    table = _table(connection, Message)
    return Reader(
        Message, alias, f"SELECT {columns(connection, Message)} FROM {table} WHERE {key} = %s"
    )


def keyed_message(stored_key: str) -> Message | None:
    """The message stored with this idempotency key (``Message.idempotency_key``: unique,
    and only keyed rows are in its index), or None."""
    alias, _ = _connection(Message)
    rows = _keyed(alias).fetch([stored_key])
    return rows[0] if rows else None


# --- a post's reads, in one round trip -------------------------------------------------
@contextlib.contextmanager
def _one_round_trip(connection: BaseDatabaseWrapper) -> Iterator[None]:
    """Statements executed inside go to PostgreSQL together and their results come back
    together when the block ends (psycopg's pipeline mode), each into its own cursor;
    elsewhere each runs as it is executed. PostgreSQL still runs them one after the
    other, each from a snapshot of its own, and stops at the first that fails: what a
    statement reads after a locking read is read once the lock is held."""
    if not _one_statement(connection):
        yield
        return
    connection.ensure_connection()
    from psycopg import pq

    raw = connection.connection
    if raw.pgconn.pipeline_status != pq.PipelineStatus.OFF:
        # Already in a pipeline (``creating_transaction``): the statements join what it
        # holds (its ``BEGIN``), and reading the first result sends them all.
        yield
        return
    with connection.wrap_database_errors, raw.pipeline():
        yield


@dataclass(frozen=True, slots=True)
class PostReads:
    """What a post reads under the lock it takes first (``post_reads``)."""

    conversation: Conversation | None  # locked; None: a new one, or the user has no such one
    running: int  # the user's answers streaming now
    messages: list[Message]  # the conversation's, oldest first (``PROMPT_FIELDS`` only)
    keyed: Message | None  # the message stored with the request's idempotency key


def post_reads(user_pk: Any, conversation_id: Any, stored_key: str | None) -> PostReads:
    """In a post's transaction: lock the user's conversation ``conversation_id`` and the
    user's row (only the user's row for a new conversation, ``None``), then count the
    user's running answers, read the conversation's messages and the message stored
    with ``stored_key`` (an idempotency key as ``Message.idempotency_key`` holds it;
    None: the post has none). One round trip on PostgreSQL instead of one per
    statement, with the transaction's ``BEGIN`` in ``creating_transaction`` (in
    Django's ``atomic`` alone, psycopg has the ``BEGIN`` answered first, on its own);
    the count stays exact, as every statement after the lock runs once it is held. The
    messages are read before the lock's answer is known, and dropped when the user has
    no such conversation. A malformed ``conversation_id`` raises (``ValidationError``)
    before any statement."""
    alias, connection = _connection(Message)
    new = conversation_id is None
    key = None if new else _conversation_key(conversation_id, connection)
    lock, messages, keyed = _lock_conversation(alias), _messages(alias), _keyed(alias)
    with contextlib.ExitStack() as cursors:

        def execute(sql: str, params: Sequence[Any]) -> Any:
            cursor = cursors.enter_context(connection.cursor())
            cursor.execute(sql, params)
            return cursor

        with _one_round_trip(connection):
            if new:
                execute(_lock_user_sql(alias), [user_pk])
            else:
                locked = execute(lock.sql, [key, user_pk])
            count = execute(_running_answers_sql(alias), [user_pk, Message.Role.ASSISTANT])
            read = None if new else execute(messages.sql, [key])
            found = None if stored_key is None else execute(keyed.sql, [stored_key])
        rows = [] if new else lock.read(locked)
        conversation = rows[0] if rows else None
        running = int(count.fetchone()[0])
        listed = messages.read(read) if read is not None and conversation is not None else []
        earlier = keyed.read(found) if found is not None else []
    return PostReads(conversation, running, listed, earlier[0] if earlier else None)


# --- a post's transaction, in two round trips -------------------------------------------
class CreatingTransaction:
    """The transaction ``creating_transaction`` opens: ``write`` stores rows as
    ``insert_then_update`` does. In its pipeline the write's statement is queued, to go
    with the ``COMMIT``, and its rows are marked stored (their automatic keys read back)
    once the transaction has committed; elsewhere it runs at once."""

    def __init__(self, pipelined: bool) -> None:
        self.pipelined = pipelined
        self._stored: list[Callable[[bool], None]] = []

    def write(
        self, groups: Sequence[Sequence[Model]], obj: Model | None = None, names: Sequence[str] = ()
    ) -> None:
        stored = _start_insert_then_update(groups, obj, names)
        if self.pipelined:
            self._stored.append(stored)
        else:
            stored(True)

    def _ended(self, committed: bool) -> None:
        stored, self._stored = self._stored, []
        for done in stored:
            done(committed)


@contextlib.contextmanager
def creating_transaction() -> Iterator[CreatingTransaction]:
    """``transaction.atomic()`` for a post, in two round trips on PostgreSQL: the
    ``BEGIN`` goes with the first statements the block runs (``post_reads``), and the
    ``COMMIT`` with the writes (``CreatingTransaction.write``), where psycopg sends each
    on its own (Django's ``atomic`` has psycopg begin the transaction, and psycopg has a
    ``BEGIN`` answered before it sends anything else). Django's block stays open around
    it, so ``on_commit`` callbacks run once the ``COMMIT`` has succeeded and an error
    anywhere rolls everything back: the statements run in psycopg's autocommit mode
    inside an explicit ``BEGIN``, and the connection is back in Django's state
    (autocommit off, no transaction) before Django's block ends, which then commits or
    rolls back nothing at the server. Nested in another transaction (a test's), or on
    SQLite, it is ``atomic()`` and writes run at once."""
    alias, connection = _connection(Message)
    outermost = not connection.in_atomic_block
    with transaction.atomic(using=alias):
        if not (outermost and _one_statement(connection)):
            yield CreatingTransaction(pipelined=False)
            return
        from psycopg.pq import TransactionStatus

        raw = connection.connection
        tx = CreatingTransaction(pipelined=True)
        raw.autocommit = True  # idle: Django's atomic has sent nothing yet
        committed = False
        try:
            with connection.wrap_database_errors, raw.pipeline():
                raw.execute(b"BEGIN", prepare=False)
                yield tx
                raw.execute(b"COMMIT", prepare=False)
            committed = True
        finally:
            tx._ended(committed)
            status = raw.info.transaction_status
            if status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
                with connection.wrap_database_errors:
                    raw.rollback()
            if raw.info.transaction_status == TransactionStatus.IDLE:
                raw.autocommit = False  # as Django's atomic left it
