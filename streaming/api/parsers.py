"""Request bodies of the REST API: JSON only, strict UTF-8, bounded in size.

DRF's ``JSONParser`` reads the request stream itself, so Django's
``DATA_UPLOAD_MAX_MEMORY_SIZE`` (``MAX_REQUEST_BYTES``) is never applied to it; this parser
applies it, and reports a body that is not UTF-8 as such rather than as a JSON error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import exceptions, status
from rest_framework.parsers import JSONParser

from streaming.jsonbody import InvalidBody, body_limit, decode_json_body, too_large_detail


class InvalidBodyError(exceptions.ParseError):
    """A body that is not UTF-8 JSON; ``field`` names the value at fault when one is."""

    def __init__(self, detail: str, field: str | None) -> None:
        super().__init__(detail)
        self.field = field


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "the request body is too large"
    default_code = "too_large"


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
            raise InvalidBodyError(exc.detail, exc.field) from None
