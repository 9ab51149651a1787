"""The one-step ``POST`` of a message by a token caller, created without Django's request
cycle and DRF.

Posting a message is the path of every answer, and Django's handler, its middleware and a
DRF view around one call of ``services.create_exchange`` cost more than the call itself.
This path makes the same call and describes the result the same way
(``streaming.representation``), and takes only requests whose answer it can give exactly
as the REST API would:

- ``POST /api/conversations/<id>/messages/`` or ``POST /api/messages/`` with no query
  string (``?wait=`` is Django's), asking for ``text/event-stream`` (``onestep``);
- an ``Authorization: Token`` or ``Bearer`` key of an active user (a session caller needs
  Django's CSRF check);
- a ``application/json`` body with a ``Content-Length`` within ``MAX_REQUEST_BYTES``, a
  JSON object that ``PostMessageSerializer`` would accept as it is;
- a host Django accepts (``ALLOWED_HOSTS``), and nothing Django's security or common
  middleware would redirect or refuse;
- a creation that succeeds.

Anything else, a refusal of the service included (its transaction rolled back, so
nothing was made), goes to Django as it came: the body already read is handed on first.
So every error, and every request this path does not know, is answered by the REST API
itself, and a test compares what both paths answer.

Of the middleware (``settings.MIDDLEWARE``), this path runs the request checks of the
security and common middleware and the response headers of the security and clickjacking
middleware; the others do nothing to such a request (WhiteNoise serves only static
files, a token caller has no session, CSRF and messages, and DRF's views are CSRF-exempt)
except django-prometheus, whose request metrics do not see these posts
(``chat_one_step_posts_total`` counts them). A deployment that adds middleware turns this
path off, and says so at start-up: it would not run there.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import Error as DatabaseError
from django.http import HttpResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.security import SecurityMiddleware

from streaming import database, representation, services
from streaming.auth import cached_user, header, resolve_user, token_from_header
from streaming.errors import ServiceError
from streaming.jsonbody import InvalidBody, body_limit, decode_json_body
from streaming.models import Message
from streaming.reading import MessageState
from streaming.storable import is_storable

log = logging.getLogger(__name__)

Receive = Callable[[], Awaitable[dict[str, Any]]]

# What settings.MIDDLEWARE may hold for this path to answer as Django would (see above).
ACCOUNTED_MIDDLEWARE = frozenset(
    f"chatsite.middleware.{name}"
    for name in (
        "PrometheusBeforeMiddleware", "SecurityMiddleware", "WhiteNoiseMiddleware",
        "SessionMiddleware", "CommonMiddleware", "CsrfViewMiddleware",
        "AuthenticationMiddleware", "MessageMiddleware", "XFrameOptionsMiddleware",
        "PrometheusAfterMiddleware",
    )
)  # fmt: skip
POST_FIELDS = ("content", "params", "model")


@dataclass(slots=True)
class Created:
    """A started answer: the REST 201's body, the headers Django's middleware would have
    set on it, and the answer's state for its stream."""

    body: dict[str, Any]
    headers: list[tuple[bytes, bytes]]
    state: MessageState


@cache
def available() -> bool:
    unknown = sorted(set(settings.MIDDLEWARE) - ACCOUNTED_MIDDLEWARE)
    if unknown:
        log.warning(
            "one-step posts go through Django: middleware %s is not one the lean path "
            "accounts for (streaming.transports.leanpost)",
            ", ".join(unknown),
        )
    return not unknown


@cache
def _middleware() -> tuple[SecurityMiddleware, CommonMiddleware, XFrameOptionsMiddleware]:
    def unused(request: Any) -> Any:
        raise AssertionError("only the middleware's hooks are called")

    return SecurityMiddleware(unused), CommonMiddleware(unused), XFrameOptionsMiddleware(unused)


def _request(scope: dict[str, Any]) -> ASGIRequest | None:
    """Django's request for ``scope`` (its body is not needed), when Django's middleware
    would let it through to the view unchanged."""
    security, common, _ = _middleware()
    request = ASGIRequest(scope, io.BytesIO())
    try:
        request.get_host()  # ALLOWED_HOSTS
        if security.process_request(request) or common.process_request(request):
            return None
    except Exception:
        return None
    return request


def _response_headers(request: ASGIRequest) -> list[tuple[bytes, bytes]]:
    security, _, clickjacking = _middleware()
    response = clickjacking.process_response(
        request, security.process_response(request, HttpResponse())
    )
    return [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in response.headers.items()
        if name.lower() != "content-type"
    ]


def _declared_json(scope: dict[str, Any]) -> int | None:
    """The declared length of a JSON body within the limit, else None."""
    media_type = (header(scope, b"content-type") or "").partition(";")[0].strip()
    length = header(scope, b"content-length")
    if media_type != "application/json" or length is None or not length.isdigit():
        return None
    limit = body_limit()
    return int(length) if not limit or int(length) <= limit else None


def _is_text(value: Any, longest: int, *, blank: bool) -> bool:
    return (
        isinstance(value, str)
        and (blank or value != "")
        and len(value) <= longest
        and is_storable(value)
    )


def _post(body: bytes) -> dict[str, Any] | None:
    """The body's fields when ``PostMessageSerializer`` takes it as it is, else None."""
    try:
        data = decode_json_body(body)
    except InvalidBody:
        return None
    if not isinstance(data, dict):
        return None
    content, params, model = data.get("content"), data.get("params"), data.get("model", "")
    if not _is_text(content, settings.MAX_MESSAGE_CHARS, blank=False):
        return None
    if not (params is None or isinstance(params, dict)) or not _is_text(model, 200, blank=True):
        return None
    return {"content": content, "params": params, "model": model}


class _Replay:
    """``receive`` that gives back what was already received, then the rest."""

    def __init__(self, received: list[dict[str, Any]], receive: Receive) -> None:
        self.received = received
        self.receive = receive

    async def __call__(self) -> dict[str, Any]:
        if self.received:
            return self.received.pop(0)
        return await self.receive()


async def _body(receive: Receive, length: int) -> tuple[bytes | None, list[dict[str, Any]]]:
    """The whole body (None if the client left first or it outgrew its ``length``), and
    the messages it came in."""
    received: list[dict[str, Any]] = []
    body = b""
    while True:
        message = await receive()
        received.append(message)
        if message["type"] != "http.request":
            return None, received
        body += message.get("body", b"")
        if len(body) > length:
            return None, received
        if not message.get("more_body"):
            return body, received


def _create(
    scope: dict[str, Any],
    user: Any,
    post: dict[str, Any],
    absolute: representation.Absolute,
) -> tuple[dict[str, Any], MessageState] | None:
    """In a database thread: resolve the token if the loop could not, create the
    exchange as the REST view does, and describe it as its 201 does. None when Django
    must answer instead (nothing was made)."""
    if user is None:
        user = resolve_user(scope)
    if not user.is_authenticated:
        return None
    conversation_id = scope["url_route"]["kwargs"].get("conversation_id")
    try:
        exchange = services.create_exchange(
            user, conversation_id, post["content"], post["params"], model=post["model"]
        )
    except (ServiceError, DatabaseError):
        return None
    question, answer = exchange.user_message, exchange.assistant_message
    assert question is not None
    body = {
        "user_message": _described(question, exchange.siblings, absolute),
        "message": _described(answer, exchange.siblings, absolute),
    }
    return body, MessageState.of(answer)


def _described(
    message: Message, siblings: dict[str, list[str]], absolute: representation.Absolute
) -> dict[str, Any]:
    return representation.message_data(message, siblings[str(message.id)], absolute)


async def create(scope: dict[str, Any], receive: Receive) -> Created | Receive:
    """The started answer, or the ``receive`` Django must be called with instead."""
    key = token_from_header(header(scope, b"authorization"))
    length = _declared_json(scope)
    if not available() or scope.get("query_string") or not key or length is None:
        return receive
    request = _request(scope)
    if request is None:
        return receive
    body, received = await _body(receive, length)
    replay = _Replay(received, receive)
    post = None if body is None else _post(body)
    if post is None:
        return replay
    # A token this process holds costs no trip; else it is resolved with the creation.
    made = await database.run(_create, scope, cached_user(key), post, request.build_absolute_uri)
    if made is None:
        return replay
    created, state = made
    return Created(created, _response_headers(request), state)
