from __future__ import annotations

from typing import Any

from django_prometheus.db.backends.sqlite3 import base as instrumented_base

from chatsite.backends import instrumented

DatabaseFeatures = instrumented_base.DatabaseFeatures


class DatabaseWrapper(instrumented_base.DatabaseWrapper):
    def create_cursor(self, name: str | None = None) -> Any:
        factory = instrumented(self.CURSOR_CLASS, self.alias, self.vendor)
        return self.connection.cursor(factory=factory)
