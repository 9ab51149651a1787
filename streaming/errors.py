"""The errors the services raise, and the one shape every entry point answers them in.

``{"error": {"status": 400, "code": "invalid_params", "field": "params.stop",
"message": "params.stop: at most 8 sequences"}}`` (``field`` only for validation errors,
and then ``message`` starts with it). REST, WebSocket and the OpenAI-compatible endpoint
all describe a ``ServiceError`` with ``describe`` and ``headers_of``; each wraps the same
fields in its own envelope (a JSON body, a ``{"type": "error"}`` frame, OpenAI's error
object: ``error_document``). What answers a request by its path alone (Django's error
views, the server's own refusals) takes the shape its path calls for from
``error_for_path``. Stream errors use the event schema instead.
"""

from __future__ import annotations

import json
from typing import Any

# What API clients authenticate with, announced on every 401 (RFC 9110 requires one).
AUTHENTICATE = 'Token realm="api"'
# A post's key for retries (the IETF draft's name and Stripe's), and the header that says
# an answer is the one a first request with that key got.
IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_META = "HTTP_IDEMPOTENCY_KEY"  # as Django's request.META holds it
REPLAYED_HEADER = "Idempotent-Replayed"
# The OpenAI-compatible endpoint's paths: their errors carry OpenAI's ``type`` and ``param``.
OPENAI_PREFIX = "/v1/"
# OpenAI's error ``type`` for each status; any other is a ``server_error``.
OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
}


class ServiceError(Exception):
    """A request the services refuse; ``status`` is the HTTP status it answers with.

    With a ``field``, ``message`` says what is wrong with it ("must be a number"): the
    error shape puts the field's name in front (``error_fields``)."""

    status = 400
    code = "invalid"
    # Seconds a client should wait before trying again (a ``Retry-After``), or None.
    retry_after: int | None = None
    # The same request would be refused the same way however long a client waited: what
    # a retry policy cannot tell from the status of a refusal it retries (a 409).
    lasting = False

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class NotFound(ServiceError):
    """No such object, or not the caller's: the two are indistinguishable on purpose."""

    status = 404
    code = "not_found"


class Conflict(ServiceError):
    status = 409
    code = "conflict"


class ContextFull(Conflict):
    """The answer already fills the model's context: nothing can be added to it."""

    code = "context_full"
    lasting = True


class ConversationFull(Conflict):
    """The conversation holds as much as one may (``MAX_CONVERSATION_MESSAGES``,
    ``MAX_CONVERSATION_CHARS``): nothing more is made in it."""

    code = "conversation_full"
    lasting = True


class IdempotencyKeyReused(ServiceError):
    """An ``Idempotency-Key`` that names an earlier request of another kind or body: a
    retry must repeat its request, and a new request takes a new key."""

    status = 422
    code = "idempotency_key_reused"


class TooManyGenerations(ServiceError):
    status = 429
    code = "too_many_generations"
    retry_after = 5


class TooManyWaits(ServiceError):
    """More of a user's calls waiting on answers (``?wait=true``) than they may have
    answers streaming: each holds a request slot of the process."""

    status = 429
    code = "too_many_waits"
    retry_after = 5


class ShuttingDown(ServiceError):
    status = 503
    code = "shutting_down"
    retry_after = 2


class StopUnconfirmed(ServiceError):
    """A Stop that the process generating the answer did not confirm in time: it may be
    gone (its answers are ended ``interrupted`` once it is known to be), or slow."""

    status = 503
    code = "stop_unconfirmed"
    retry_after = 5


class Unavailable(ServiceError):
    """The database could not serve the request: a connection lost, none to be had within
    ``DATABASE_POOL_TIMEOUT``, or no answer within ``DATABASE_WAIT_TIMEOUT``
    (``unavailable``). Nothing was made, unless a commit whose answer was lost went
    through: a post is sent again with its ``Idempotency-Key`` (docs/api.md)."""

    status = 503
    code = "unavailable"
    retry_after = 2


def unavailable(exc: BaseException) -> Unavailable | None:
    """The 503 for ``exc`` when it is the database failing a request (Django's
    ``OperationalError`` or ``InterfaceError``: a connection lost, refused, or not had in
    time; a deadlock, which a retry gets past), else None: anything else stays a 500."""
    from django.db import InterfaceError, OperationalError

    if isinstance(exc, OperationalError | InterfaceError):
        return Unavailable("the database is unavailable; retry")
    return None


class InvalidParams(ServiceError):
    status = 400
    code = "invalid_params"


class WrongRole(ServiceError):
    """An action on a message of the other role (regenerate a question, edit an answer)."""

    status = 400
    code = "wrong_role"


class InvalidCursor(ServiceError):
    status = 400
    code = "invalid_cursor"


def too_long(limit: int, text: str) -> str:
    """What a text over its limit is told, after its field's name, on every entry point."""
    return f"is longer than {limit} characters (it has {len(text)})"


def error_fields(status: int, code: str, message: str, field: str | None = None) -> dict[str, Any]:
    """The error object. A validation error's message names its field first
    ("params.max_tokens: must be between 1 and 4096"), as OpenAI's errors do: many clients
    (the openai SDK among them) show only ``message``, and a bound without its field's
    name helps nobody."""
    if field is None:
        return {"status": status, "code": code, "message": message}
    return {"status": status, "code": code, "message": f"{field}: {message}", "field": field}


def error_body(status: int, code: str, message: str, field: str | None = None) -> dict[str, Any]:
    return {"error": error_fields(status, code, message, field)}


def error_bytes(status: int, code: str, message: str, field: str | None = None) -> bytes:
    return json.dumps(error_body(status, code, message, field)).encode()


def error_document(
    status: int, code: str, message: str, field: str | None = None
) -> dict[str, Any]:
    """Our error shape plus OpenAI's ``type`` and ``param``, so both kinds of client read it."""
    document = error_body(status, code, message, field)
    document["error"]["type"] = OPENAI_TYPES.get(status, "server_error")
    document["error"]["param"] = field
    return document


def error_for(
    path: str, status: int, code: str, message: str, field: str | None = None
) -> dict[str, Any]:
    """The error object a request to ``path`` is answered with: ``error_document`` under
    ``/v1/`` (every answer of the OpenAI-compatible endpoint has OpenAI's fields),
    ``error_body`` elsewhere."""
    if path.startswith(OPENAI_PREFIX):
        return error_document(status, code, message, field)
    return error_body(status, code, message, field)


def error_for_path(
    path: str, status: int, code: str, message: str, field: str | None = None
) -> bytes:
    """``error_for`` as a response body."""
    return json.dumps(error_for(path, status, code, message, field)).encode()


def describe(exc: ServiceError) -> dict[str, Any]:
    """The fields of the error object for ``exc``."""
    return error_fields(exc.status, exc.code, exc.message, exc.field)


def headers_of(exc: ServiceError) -> dict[str, str]:
    """The HTTP headers that go with ``exc`` (``Retry-After`` for a limit or a drain)."""
    return {} if exc.retry_after is None else {"Retry-After": str(exc.retry_after)}
