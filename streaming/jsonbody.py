"""JSON request bodies: strict UTF-8, no ``NaN``/``Infinity``, bounded in size.

The one way a JSON request body is read, by every entry point that takes one: the REST
API's parser (``streaming.api.parsers``), the OpenAI-compatible endpoint and the lean
one-step post (``streaming.transports.leanpost``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings

from streaming.storable import is_storable

T = TypeVar("T")


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


def _faults(value: Any) -> tuple[bool, bool, bool]:
    """Whether ``value`` nests objects and arrays deeper than ``MAX_DEPTH`` levels,
    whether it holds a number out of range, and whether an object of it has a key that
    is not storable text (one walk for all, over every body)."""
    stack = [(value, 1)]
    out_of_range = bad_key = False
    while stack:
        current, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True, out_of_range, bad_key
        if isinstance(current, dict):
            children = current.values()
            bad_key = bad_key or not all(map(is_storable, current))
        else:
            children = current
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
            elif isinstance(child, _OutOfRange):
                out_of_range = True
    return False, out_of_range, bad_key


def _first(value: Any, found: Callable[[Any, str], T | None], path: str = "") -> T | None:
    """What ``found`` says of the first node of ``value``, in document order, of which it
    says anything (it is given each node and its path, as ``params.tools[0]``)."""
    if (here := found(value, path)) is not None:
        return here
    if isinstance(value, dict):
        items: Any = ((f"{path}.{key}" if path else key, child) for key, child in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{index}]", child) for index, child in enumerate(value))
    else:
        return None
    for child_path, child in items:
        if (there := _first(child, found, child_path)) is not None:
            return there
    return None


def _out_of_range(value: Any, path: str) -> tuple[str, _OutOfRange] | None:
    return (path, value) if isinstance(value, _OutOfRange) else None


def _bad_key(value: Any, path: str) -> str | None:
    """An object's path when one of its keys is not storable text."""
    if isinstance(value, dict) and not all(map(is_storable, value)):
        return path
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
        too_deep, out_of_range, bad_key = _faults(value)
        if too_deep:
            raise InvalidJSON(f"is nested deeper than {MAX_DEPTH} levels")
        if out_of_range and (found := _first(value, _out_of_range)) is not None:
            path, number = found
            message = f"has a number out of range at {path}: {number.reason}"
            raise InvalidJSON(message, path, number.reason)
        if bad_key and (where := _first(value, _bad_key)) is not None:
            # A key is echoed in errors (an unknown one is named) and stored (tools'
            # schemas): one that no encoder here can write back is refused at the door.
            detail = "has a key with a NUL character or an unpaired surrogate"
            if not where:
                raise InvalidJSON(detail)
            raise InvalidJSON(f"{detail} in {where}", where, detail)
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
