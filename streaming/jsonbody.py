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


class InvalidJSON(ValueError):
    """JSON text that is not JSON, or that holds what cannot be written back; the
    message completes "the body ..." or "the frame ...". ``field`` names the value at
    fault when one is (``params.seed``, ``messages[0].content``), and ``detail`` is then
    what is wrong with that value alone, to go with the field in an error object."""

    def __init__(self, message: str, field: str | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.detail = message if detail is None else detail


class InvalidBody(InvalidJSON):
    """The body is not UTF-8 JSON; the message says which and where (``detail`` with
    ``field``, when there is one, as the error object's)."""


# What every encoder here (orjson for events and frames, PostgreSQL's jsonb for stored
# params) can write back: orjson refuses integers beyond 64 bits and nesting deeper than
# 254 levels, and jsonb refuses infinities. Anything decoded is held to this at the door,
# so a value is refused with a 400 before anything is written, never after.
MAX_DEPTH = 64
LOWEST_INT, HIGHEST_INT = -(2**63), 2**64 - 1


class _OutOfRange:
    """Stands in the parsed document for a number no encoder here can write back, so
    that the error can name where it was (the parser's hooks see only the number)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _integer(text: str) -> int | _OutOfRange:
    value = int(text)
    if not LOWEST_INT <= value <= HIGHEST_INT:
        return _OutOfRange(f"integer {text[:40]} is outside -2^63..2^64-1")
    return value


def _float(text: str) -> float | _OutOfRange:
    value = float(text)
    if not math.isfinite(value):
        return _OutOfRange(f"number {text[:40]} is too large")
    return value


def _faults(value: Any) -> tuple[bool, bool]:
    """Whether ``value`` nests objects and arrays deeper than ``MAX_DEPTH`` levels, and
    whether it holds a number out of range (one walk for both, over every body)."""
    stack = [(value, 1)]
    out_of_range = False
    while stack:
        current, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True, out_of_range
        for child in current.values() if isinstance(current, dict) else current:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
            elif isinstance(child, _OutOfRange):
                out_of_range = True
    return False, out_of_range


def _out_of_range(value: Any, path: str = "") -> tuple[str, _OutOfRange] | None:
    """The first number out of range in ``value``, in document order, with its path."""
    if isinstance(value, _OutOfRange):
        return path, value
    if isinstance(value, dict):
        items: Any = ((f"{path}.{key}" if path else key, child) for key, child in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{index}]", child) for index, child in enumerate(value))
    else:
        return None
    for child_path, child in items:
        if isinstance(child, _OutOfRange | dict | list):
            found = _out_of_range(child, child_path)
            if found is not None:
                return found
    return None


def decode_json(text: str) -> Any:
    """Parse JSON text, strictly (no ``NaN``/``Infinity``), into values every encoder here
    can write back (see ``MAX_DEPTH``), or raise ``InvalidJSON``. The one JSON parser for
    what clients send: bodies and WebSocket frames."""
    try:
        value = json.loads(
            text, parse_constant=_reject_constant, parse_int=_integer, parse_float=_float
        )
    except ValueError as exc:
        raise InvalidJSON(f"is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidJSON(f"is nested deeper than {MAX_DEPTH} levels") from None
    if isinstance(value, dict | list):
        too_deep, out_of_range = _faults(value)
        if too_deep:
            raise InvalidJSON(f"is nested deeper than {MAX_DEPTH} levels")
        if out_of_range and (found := _out_of_range(value)) is not None:
            path, number = found
            message = f"has a number out of range at {path}: {number.reason}"
            raise InvalidJSON(message, path, number.reason)
    elif isinstance(value, _OutOfRange):
        raise InvalidJSON(f"has a number out of range: {value.reason}")
    return value


def decode_json_body(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidBody(f"the request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        return decode_json(text)
    except InvalidJSON as exc:
        # Without a field the message is the whole sentence: a fragment ("is not valid
        # JSON") would reach the client with nothing to say what is not.
        detail = exc.detail if exc.field is not None else None
        raise InvalidBody(f"the request body {exc}", exc.field, detail) from None
