"""JSON request bodies: strict UTF-8, no ``NaN``/``Infinity``, bounded in size.

The one way a JSON request body is read, by every entry point that takes one: the REST
API's parser (``streaming.api.parsers``), the OpenAI-compatible endpoint and the lean
one-step post (``streaming.transports.leanpost``).
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings


def body_limit() -> int:
    """``MAX_REQUEST_BYTES`` (Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE``); 0: no limit."""
    return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0)


def declared_length(meta: dict[str, Any]) -> int:
    try:
        return int(meta.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


def too_large_detail(limit: int) -> str:
    return f"the request body is larger than {limit} bytes"


class InvalidBody(ValueError):
    """The body is not UTF-8 JSON; the message says which and where."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def decode_json_body(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidBody(f"the request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise InvalidBody(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidBody("the request body is nested too deeply") from None
