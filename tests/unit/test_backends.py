"""The instrumented database backends count every statement, its duration and its
errors by type, with one cursor class per database."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DatabaseError, connection
from django_prometheus.db import errors_total, execute_many_total, execute_total
from django_prometheus.db import query_duration_seconds as durations

from streaming.models import Conversation

pytestmark = pytest.mark.django_db(transaction=True)


def _value(metric: Any, suffix: str, **labels: str) -> float:
    wanted = {"alias": "default", "vendor": connection.vendor, **labels}
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith(suffix) and sample.labels == wanted:
                return float(sample.value)
    return 0.0


def _checked() -> None:
    """The connection open and its health check (one statement, ``CONN_HEALTH_CHECKS``)
    done, before a test counts statements."""
    with connection.cursor():
        pass


def test_statements_are_counted_and_timed() -> None:
    _checked()
    executed, many = _value(execute_total, "_total"), _value(execute_many_total, "_total")
    timed, took = _value(durations, "_count"), _value(durations, "_sum")
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        table = connection.ops.quote_name(Conversation._meta.db_table)
        cursor.executemany(f"DELETE FROM {table} WHERE title = %s", [("a",), ("b",)])
    assert _value(execute_total, "_total") == executed + 3
    assert _value(execute_many_total, "_total") == many + 2
    assert _value(durations, "_count") == timed + 2
    assert _value(durations, "_sum") > took


def test_a_failed_statement_is_counted_by_its_error() -> None:
    def errors() -> float:
        return sum(
            _value(errors_total, "_total", type=name)
            for name in ("ProgrammingError", "OperationalError", "UndefinedTable")
        )

    _checked()
    before, timed = errors(), _value(durations, "_count")
    with pytest.raises(DatabaseError), connection.cursor() as cursor:
        cursor.execute("SELECT * FROM no_such_table")
    assert errors() == before + 1
    assert _value(durations, "_count") == timed + 1, "a failed statement is timed too"


def test_one_cursor_class_serves_every_connection() -> None:
    with connection.cursor() as first:
        first_class = type(first.cursor)
    connection.close()
    with connection.cursor() as second:
        assert type(second.cursor) is first_class


@pytest.mark.skipif(connection.vendor != "postgresql", reason="psycopg's statement cache")
def test_the_parse_of_an_answers_writes_is_kept() -> None:
    from django.contrib.auth.models import User
    from psycopg import _queries

    from streaming import statements
    from streaming.models import Message, Segment

    conversation = Conversation.objects.create(owner=User.objects.create_user("ann"))

    def write() -> None:
        question = Message(conversation=conversation, role="user", content="q")
        answer = Message(conversation=conversation, parent=question, role="assistant")
        segment = Segment(message=answer, index=0, first_seq=1, worker="w")
        conversation.current_leaf = answer
        statements.insert_then_update(
            [[question, answer], [segment]], conversation, ["current_leaf"]
        )

    write()
    before = _queries._query2pg.cache_info().hits
    write()
    assert _queries._query2pg.cache_info().hits == before + 1
