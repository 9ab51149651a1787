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


@pytest.mark.timeout(60)
def test_a_call_the_server_never_answers_fails_and_closes_its_connection() -> None:
    """A connection that stays open while nothing answers on it (a frozen proxy): the
    call fails after the bound, with an error saying so, instead of waiting until TCP
    gives up, and the connection is closed (its state is unknown)."""
    import psycopg

    from chatsite.backends.postgresql.base import answered_within
    from tests.faults.tcpproxy import TcpProxy

    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (DATABASE_URL)")
    settings = connection.settings_dict
    proxy = TcpProxy(settings.get("HOST") or "127.0.0.1", int(settings.get("PORT") or 5432))
    proxy.start()
    try:
        with answered_within(0.5).connect(
            host="127.0.0.1",
            port=proxy.port,
            dbname=settings["NAME"],
            user=settings.get("USER") or "postgres",
            password=settings.get("PASSWORD") or None,
            autocommit=True,
        ) as bounded:
            assert bounded.execute("SELECT 1").fetchone() == (1,)
            proxy.freeze()
            with pytest.raises(psycopg.OperationalError, match=r"did not answer within 0\.5 s"):
                bounded.execute("SELECT 1")
            assert bounded.closed
    finally:
        proxy.thaw()
        proxy.stop()


def test_the_pool_makes_connections_bounded_by_the_setting() -> None:
    """Every connection of the pool is of the class bounded by ``DATABASE_WAIT_TIMEOUT``
    (30 s unless set)."""
    from chatsite.backends.postgresql.base import answered_within

    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (DATABASE_URL)")
    pool = connection.pool
    assert pool is not None
    assert pool.connection_class is answered_within(30.0), "the pool makes bounded ones"
