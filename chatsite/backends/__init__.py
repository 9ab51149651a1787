"""Database backends: django-prometheus's instrumented ones, minus a class per connection.

django-prometheus builds its instrumented cursor class anew on every connection
(PostgreSQL) or cursor (SQLite). Connections come from a pool and are handed back after
every call, so that was a class creation - a costly one, psycopg's cursors being generic
classes - on every database call. These build each class once.
"""

from __future__ import annotations

import functools
from typing import Any

from django_prometheus.db.common import ExportingCursorWrapper


@functools.cache
def instrumented(cursor_class: Any, alias: str, vendor: str) -> Any:
    return ExportingCursorWrapper(cursor_class, alias, vendor)
