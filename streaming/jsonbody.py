"""JSON request bodies: strict UTF-8, no ``NaN``/``Infinity``, bounded in size.

The one way a JSON request body is read, by every entry point that takes one: the REST
API's parser (``streaming.api.parsers``), the OpenAI-compatible endpoint and the lean
one-step post (``streaming.transports.leanpost``).
"""

from __future__ import annotations

import json
import math
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


def media_type(content_type: str | None) -> str:
    """The media type a ``Content-Type`` declares, without its parameters (``""`` for
    none), as sent."""
    return (content_type or "").partition(";")[0].strip()


def too_large_detail(limit: int) -> str:
    return f"the request body is larger than {limit} bytes"


class InvalidBody(ValueError):
    """The body is not UTF-8 JSON; the message says which and where."""


class InvalidJSON(ValueError):
    """JSON text that is not JSON, or that holds what cannot be written back; the
    message completes "the body ..." or "the frame ..."."""


# What every encoder here (orjson for events and frames, PostgreSQL's jsonb for stored
# params) can write back: orjson refuses integers beyond 64 bits and nesting deeper than
# 254 levels, and jsonb refuses infinities. Anything decoded is held to this at the door,
# so a value is refused with a 400 before anything is written, never after.
MAX_DEPTH = 64
LOWEST_INT, HIGHEST_INT = -(2**63), 2**64 - 1


class _OutOfRange(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _integer(text: str) -> int:
    value = int(text)
    if not LOWEST_INT <= value <= HIGHEST_INT:
        raise _OutOfRange(f"integer {text[:40]} is outside -2^63..2^64-1")
    return value


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _OutOfRange(f"number {text[:40]} is too large")
    return value


def _too_deep(value: Any) -> bool:
    """Whether ``value`` nests objects and arrays deeper than ``MAX_DEPTH`` levels."""
    stack = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        children = current.values() if isinstance(current, dict) else current
        if depth > MAX_DEPTH:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def decode_json(text: str) -> Any:
    """Parse JSON text, strictly (no ``NaN``/``Infinity``), into values every encoder here
    can write back (see ``MAX_DEPTH``), or raise ``InvalidJSON``. The one JSON parser for
    what clients send: bodies and WebSocket frames."""
    try:
        value = json.loads(
            text, parse_constant=_reject_constant, parse_int=_integer, parse_float=_float
        )
    except _OutOfRange as exc:
        raise InvalidJSON(f"has a number out of range: {exc}") from None
    except ValueError as exc:
        raise InvalidJSON(f"is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidJSON(f"is nested deeper than {MAX_DEPTH} levels") from None
    if isinstance(value, dict | list) and _too_deep(value):
        raise InvalidJSON(f"is nested deeper than {MAX_DEPTH} levels")
    return value


def decode_json_body(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidBody(f"the request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        return decode_json(text)
    except InvalidJSON as exc:
        raise InvalidBody(f"the request body {exc}") from None
