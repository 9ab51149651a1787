"""The one error shape of every 4xx/5xx answer, on every entry point:

``{"error": {"status": 404, "code": "not_found", "message": "...", "field": "params.stop"}}``
(``field`` only for validation errors). Stream errors use the event schema instead.
"""

from __future__ import annotations

import json
from typing import Any


def error_body(status: int, code: str, message: str, field: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"status": status, "code": code, "message": message}
    if field is not None:
        error["field"] = field
    return {"error": error}


def error_bytes(status: int, code: str, message: str, field: str | None = None) -> bytes:
    return json.dumps(error_body(status, code, message, field)).encode()
