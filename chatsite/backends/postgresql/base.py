from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base
from django_prometheus.db.backends.postgresql import base as instrumented_base

from chatsite.backends import instrumented


class DatabaseWrapper(instrumented_base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        params = base.DatabaseWrapper.get_connection_params(self)
        params["cursor_factory"] = instrumented(params["cursor_factory"], self.alias, self.vendor)
        return params
