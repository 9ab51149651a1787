"""Request bodies of the REST API: JSON only, strict UTF-8, bounded in size.

DRF's ``JSONParser`` reads the request stream itself, so Django's
``DATA_UPLOAD_MAX_MEMORY_SIZE`` (``MAX_REQUEST_BYTES``) is never applied to it; this parser
applies it, and reports a body that is not UTF-8 as such rather than as a JSON error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from rest_framework import exceptions, status
from rest_framework.parsers import JSONParser


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "the request body is too large"
    default_code = "too_large"


def body_limit() -> int:
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
    """The one way a JSON request body is decoded (REST views and the OpenAI endpoint)."""
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


class JSONBodyParser(JSONParser):
    def parse(
        self,
        stream: Any,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        limit = body_limit()
        raw = stream.read(limit + 1) if limit else stream.read()
        if limit and len(raw) > limit:
            raise PayloadTooLarge(too_large_detail(limit))
        try:
            return decode_json_body(raw)
        except InvalidBody as exc:
            raise exceptions.ParseError(str(exc)) from None
