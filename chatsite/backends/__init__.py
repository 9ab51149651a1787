"""Database backends: django-prometheus's instrumented ones, with a cursor class built once.

django-prometheus builds its instrumented cursor class anew on every connection
(PostgreSQL) or cursor (SQLite), and its ``execute`` looks up the metrics' labelled
children on every statement (a lock and a label tuple each, for the counter and the
histogram). Connections come from a pool and are handed back after every call, and an
answer costs several statements, so both were paid many times per answer. Here the class
is built once per cursor class, database and vendor, with its children bound: the same
metrics (``django_db_execute_total``, ``django_db_execute_many_total``,
``django_db_query_duration_seconds``, ``django_db_errors_total`` by exception type), the
same values.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from django_prometheus.db import (
    errors_total,
    execute_many_total,
    execute_total,
    query_duration_seconds,
)


@functools.cache
def instrumented(cursor_class: Any, alias: str, vendor: str) -> Any:
    executed = execute_total.labels(alias, vendor)
    executed_many = execute_many_total.labels(alias, vendor)
    duration = query_duration_seconds.labels(alias, vendor)

    def measured(call: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            errors_total.labels(alias, vendor, type(exc).__name__).inc()
            raise
        finally:
            duration.observe(time.perf_counter() - started)

    class CursorWrapper(cursor_class):
        def execute(self, *args: Any, **kwargs: Any) -> Any:
            executed.inc()
            return measured(super().execute, *args, **kwargs)

        def executemany(self, query: Any, param_list: Any, *args: Any, **kwargs: Any) -> Any:
            executed.inc(len(param_list))
            executed_many.inc(len(param_list))
            return measured(super().executemany, query, param_list, *args, **kwargs)

    return CursorWrapper
