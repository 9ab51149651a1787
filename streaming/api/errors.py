"""The one error shape (``streaming.errors``) for the REST API, whoever raises the error.

``exception_handler`` covers everything DRF views raise. The ``handler*`` views cover what
Django answers before or outside a view (an unknown ``/api/`` URL, an uncaught exception):
under ``/api/`` and ``/v1/`` they answer JSON too; elsewhere (admin, pages) Django's own
pages stay.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.urls import is_valid_path
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from streaming.api.parsers import InvalidBodyError
from streaming.errors import (
    AUTHENTICATE,
    OPENAI_PREFIX,
    ServiceError,
    describe,
    error_body,
    error_for,
    headers_of,
    unavailable,
)
from streaming.transports.hosts import REFUSED

CODES = {
    400: "invalid",
    401: "not_authenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    429: "throttled",
    500: "server_error",
    503: "unavailable",
}

JSON_PREFIXES = ("/api/", OPENAI_PREFIX)

log = logging.getLogger(__name__)


def _first_field_error(detail: Any, prefix: str = "") -> tuple[str | None, str]:
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = key if key != "non_field_errors" else ""
            field = f"{prefix}.{name}" if prefix and name else (name or prefix)
            found, message = _first_field_error(value, field)
            return found or field or None, message
    if isinstance(detail, list) and detail:
        return _first_field_error(detail[0], prefix)
    return (prefix or None), str(detail)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if (down := unavailable(exc)) is not None:
        log.warning("a request failed on the database: %s", exc)
        exc = down
    if isinstance(exc, ServiceError):
        return Response({"error": describe(exc)}, status=exc.status, headers=headers_of(exc))
    if isinstance(exc, Http404):
        exc = exceptions.NotFound("not found")
    response = drf_handler(exc, context)
    if response is None:
        return None
    code = CODES.get(response.status_code, "error")
    field = None
    if isinstance(exc, exceptions.ValidationError):
        field, message = _first_field_error(exc.detail)
        # An error of no field is the body's as a whole (an array where an object goes).
        field = field or "body"
    elif isinstance(exc, exceptions.APIException):
        message = str(exc.detail)
        if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
            response.status_code = status.HTTP_401_UNAUTHORIZED
            response["WWW-Authenticate"] = AUTHENTICATE
            code = "not_authenticated"
        elif isinstance(exc, exceptions.ParseError):
            # A value at fault is named; otherwise the body as a whole is (not JSON, not
            # UTF-8), as for a body that is no object.
            code = "invalid_body"
            field = (exc.field if isinstance(exc, InvalidBodyError) else None) or "body"
    else:
        message = str(exc)
    response.data = error_body(response.status_code, code, message, field)
    return response


def _wants_json(request: HttpRequest) -> bool:
    """Whether a request is answered as the API: under one of ``JSON_PREFIXES``, or one
    of them spelt without its slash (``/api``, ``/v1``: no HTML page for a client that
    missed the API's path by its last character)."""
    path = request.path
    return path.startswith(JSON_PREFIXES) or f"{path}/" in JSON_PREFIXES


def _json(request: HttpRequest, status_code: int, message: str) -> JsonResponse:
    """The error object; under ``/v1/`` with OpenAI's ``type`` and ``param`` too, as
    every answer of the OpenAI-compatible endpoint has them."""
    return JsonResponse(
        error_for(request.path, status_code, CODES[status_code], message), status=status_code
    )


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _wants_json(request):
        # A Host not in ALLOWED_HOSTS is told as the streams and /v1 tell it.
        return _json(
            request, 400, REFUSED if isinstance(exception, DisallowedHost) else "bad request"
        )
    return defaults.bad_request(request, exception)


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _wants_json(request):
        return _json(request, 403, "you may not do this")
    return defaults.permission_denied(request, exception)


def _routed(request: HttpRequest, path: str) -> bool:
    """Whether a route takes ``path``: Django's or one Channels serves before Django
    (``CHANNELS_URLCONF``: the message stream, ``/v1``), which only reaches Django when
    none of its routes took the URL."""
    if is_valid_path(path, getattr(request, "urlconf", None)):
        return True
    channels: str | None = getattr(settings, "CHANNELS_URLCONF", None)
    return channels is not None and bool(is_valid_path(path, channels))


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _wants_json(request):
        if not request.path.endswith("/") and _routed(request, f"{request.path_info}/"):
            return _json(request, 404, f"not found; the URL ends with a slash: {request.path}/")
        return _json(request, 404, "not found")
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if _wants_json(request):
        return _json(request, 500, "internal server error")
    return defaults.server_error(request)
