from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base
from django_prometheus.db.backends.postgresql import base as instrumented_base
from psycopg import _queries

from chatsite.backends import instrumented

# psycopg keeps how it parsed a statement's text (an LRU cache of 128) only for statements
# of at most 4,096 bytes and 50 parameters. An answer's writes are one statement of about
# 60 (streaming/statements.py), so it was parsed again on every answer, which cost more CPU
# than the rest of its execution. The length bound, which bounds the cache's memory, stays.
CACHED_STATEMENT_PARAMS = 256
_queries.MAX_CACHED_STATEMENT_PARAMS = max(
    _queries.MAX_CACHED_STATEMENT_PARAMS, CACHED_STATEMENT_PARAMS
)


class DatabaseWrapper(instrumented_base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        params = base.DatabaseWrapper.get_connection_params(self)
        params["cursor_factory"] = instrumented(params["cursor_factory"], self.alias, self.vendor)
        return params
