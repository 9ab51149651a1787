"""The one-step ``POST`` of a message, created without Django's request cycle and DRF.

Posting a message is the path of every answer, and Django's handler, its middleware and a
DRF view around one call of ``services.create_exchange`` cost more than the call itself.
This path makes the same call and describes the result the same way
(``streaming.representation``), and takes only requests whose answer it can give exactly
as the REST API would:

- ``POST /api/conversations/<id>/messages/`` or ``POST /api/messages/`` with no query
  string (``?wait=`` is Django's), asking for ``text/event-stream`` (``onestep``);
- an ``Authorization: Token`` or ``Bearer`` key of an active user, or the session of an
  active user with a request that passes Django's CSRF check (as DRF's session
  authentication runs it), unless sessions are saved on every request or secret keys
  are rotating (``SECRET_KEY_FALLBACKS``: resolving the user may move the session);
- a ``application/json`` body with a ``Content-Length`` within ``MAX_REQUEST_BYTES``, a
  JSON object that the route's serializer would accept as it is;
- a host Django accepts (``ALLOWED_HOSTS``), and nothing Django's security or common
  middleware would redirect or refuse;
- a creation that succeeds.

Anything else, a refusal of the service included (its transaction rolled back, so
nothing was made), goes to Django as it came: the body already read is handed on first.
So every error, and every request this path does not know, is answered by the REST API
itself, and a test compares what both paths answer.

Django's middleware (``settings.MIDDLEWARE``) is run hook by hook, in its order: the
request checks of the security, session and common middleware, the CSRF check, and the
response hooks that give the 201 its headers (clickjacking, CSRF, common, session, which
saves a session changed on the way and sets its cookie, security). The others do nothing
to such a request (WhiteNoise serves only static files, authentication is resolved here
as its lazy user would be, messages are never read or written) except django-prometheus,
whose request metrics do not see these posts (``chat_one_step_posts_total`` counts them).
A deployment whose ``MIDDLEWARE`` is not exactly this list turns the path off, and says so
at start-up.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, cast

from django.conf import settings
from django.contrib.auth import get_user
from django.contrib.sessions.middleware import SessionMiddleware
from django.core.handlers.asgi import ASGIRequest
from django.db import Error as DBError
from django.http import HttpRequest, HttpResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.csrf import CsrfViewMiddleware
from django.middleware.security import SecurityMiddleware

from streaming import database, representation, services
from streaming.auth import cached_user, header, resolve_user, token_of
from streaming.errors import IDEMPOTENCY_META, REPLAYED_HEADER, ServiceError
from streaming.jsonbody import InvalidBody, body_limit, decode_json_body, media_type
from streaming.models import Message
from streaming.reading import MessageState
from streaming.storable import is_storable

log = logging.getLogger(__name__)

Receive = Callable[[], Awaitable[dict[str, Any]]]

# What settings.MIDDLEWARE must be for this path to answer as Django would (see above).
ACCOUNTED_MIDDLEWARE = tuple(
    f"chatsite.middleware.{name}"
    for name in (
        "PrometheusBeforeMiddleware", "SecurityMiddleware", "WhiteNoiseMiddleware",
        "SessionMiddleware", "CommonMiddleware", "CsrfViewMiddleware",
        "AuthenticationMiddleware", "MessageMiddleware", "XFrameOptionsMiddleware",
        "PrometheusAfterMiddleware",
    )
)  # fmt: skip


@dataclass(slots=True)
class Created:
    """A started answer: the REST 201's body, the headers Django's middleware would have
    set on it, the answer's state for its stream, and whose it is."""

    body: dict[str, Any]
    headers: list[tuple[bytes, bytes]]
    state: MessageState
    user_id: int


@cache
def available() -> bool:
    if tuple(settings.MIDDLEWARE) == ACCOUNTED_MIDDLEWARE:
        return True
    log.warning(
        "one-step posts go through Django: MIDDLEWARE is not the list the lean path "
        "accounts for (streaming.transports.leanpost): %s",
        ", ".join(settings.MIDDLEWARE),
    )
    return False


class _CsrfCheck(CsrfViewMiddleware):
    """Django's CSRF check as DRF's session authentication runs it: the reason for a
    refusal instead of a 403 page."""

    def _reject(self, request: HttpRequest, reason: str) -> Any:
        return reason


@dataclass(frozen=True, slots=True)
class _Middleware:
    """The hooks of ``settings.MIDDLEWARE`` that act on a message post (see above), made
    once as Django's handler makes its middleware once."""

    security: SecurityMiddleware
    session: SessionMiddleware
    common: CommonMiddleware
    csrf: _CsrfCheck
    clickjacking: XFrameOptionsMiddleware


def _unused(request: Any) -> Any:
    raise AssertionError("only the middleware's hooks are called, never a view")


@cache
def _middleware() -> _Middleware:
    return _Middleware(
        SecurityMiddleware(_unused),
        SessionMiddleware(_unused),
        CommonMiddleware(_unused),
        _CsrfCheck(_unused),
        XFrameOptionsMiddleware(_unused),
    )


def _request(scope: dict[str, Any]) -> ASGIRequest | None:
    """Django's request for ``scope`` (its body is not needed), when Django's middleware
    would let it through to the view unchanged."""
    middleware = _middleware()
    request = ASGIRequest(scope, io.BytesIO())
    try:
        request.get_host()  # ALLOWED_HOSTS
        if middleware.security.process_request(request):
            return None
        middleware.session.process_request(request)  # lazy: read only if asked
        if middleware.common.process_request(request):
            return None
    except Exception:
        return None
    return request


def _session_user(request: ASGIRequest) -> Any | None:
    """The session's user, as DRF's session authentication accepts it: active, and the
    request passing Django's CSRF check (checked first: it changes nothing, where
    resolving the user may rotate or flush the session)."""
    csrf = _middleware().csrf
    csrf.process_request(request)
    if csrf.process_view(request, _unused, (), {}) is not None:
        return None
    user = get_user(request)
    return user if user.is_authenticated and user.is_active else None


def _response_headers(request: ASGIRequest) -> list[tuple[bytes, bytes]]:
    """The headers Django's middleware gives a 201 to ``request``, in the order it runs
    them (a session changed on the way is saved and its cookie set, as Django does)."""
    middleware = _middleware()
    response: Any = HttpResponse(status=201)
    response = middleware.clickjacking.process_response(request, response)
    response = middleware.csrf.process_response(request, response)
    response = middleware.common.process_response(request, response)
    response = middleware.session.process_response(request, response)
    response = middleware.security.process_response(request, response)
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.items()]
    for cookie in response.cookies.values():
        headers.append((b"set-cookie", cookie.output(header="").encode("ascii").strip()))
    return headers


def _declared_json(scope: dict[str, Any]) -> int | None:
    """The declared length of a JSON body within the limit, else None."""
    length = header(scope, b"content-length")
    if media_type(header(scope, b"content-type")) != "application/json" or length is None:
        return None
    if not (length.isascii() and length.isdigit()):  # not "²", which int() refuses
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


_POST_FIELDS = {"content", "params", "model"}
# A post to a conversation may name the answer it goes after; a new conversation has none.
_CONVERSATION_POST_FIELDS = {*_POST_FIELDS, "parent_id"}


def _post(body: bytes, *, new: bool) -> dict[str, Any] | None:
    """The body's fields when the route's serializer (``PostMessageSerializer``, or
    ``ConversationPostSerializer`` for a conversation's) takes it as it is, else None. A
    ``parent_id`` of the wrong form is refused by the service, and so answered by Django."""
    try:
        data = decode_json_body(body)
    except InvalidBody:
        return None
    fields = _POST_FIELDS if new else _CONVERSATION_POST_FIELDS
    if not isinstance(data, dict) or not data.keys() <= fields:
        return None  # refused by Django, naming the key no field takes
    content, params, model = data.get("content"), data.get("params"), data.get("model", "")
    parent_id = data.get("parent_id")
    if not _is_text(content, settings.MAX_MESSAGE_CHARS, blank=False):
        return None
    if not (params is None or isinstance(params, dict)) or not _is_text(model, 200, blank=True):
        return None
    if model != model.strip():  # the serializer trims a model's name, not the content
        return None
    if not (parent_id is None or isinstance(parent_id, str)):
        return None
    return {"content": content, "params": params, "model": model, "parent_id": parent_id}


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
    request: ASGIRequest, key: str | None, user: Any, post: dict[str, Any]
) -> Created | None:
    """In a database thread: resolve the caller if the loop could not (``key``: a
    token, else the session), create the exchange as the REST view does, and describe it
    as its 201 does. None when Django must answer instead (nothing was made)."""
    if user is None:
        user = (
            _session_user(request)
            if key is None
            else resolve_user(cast(dict[str, Any], request.scope))
        )
    if user is None or not user.is_authenticated:
        return None
    conversation_id = request.scope["url_route"]["kwargs"].get("conversation_id")
    try:
        exchange = services.create_exchange(
            user,
            conversation_id,
            post["content"],
            post["params"],
            model=post["model"],
            parent_id=post["parent_id"],
            idempotency_key=request.META.get(IDEMPOTENCY_META),
        )
    except (ServiceError, DBError):
        # Any refusal or database error (Django's InterfaceError is not a DatabaseError):
        # the transaction rolled back, nothing was made.
        return None
    question, answer = exchange.user_message, exchange.assistant_message
    assert question is not None
    absolute = request.build_absolute_uri
    body = {
        "user_message": _described(question, exchange.siblings, absolute),
        "message": _described(answer, exchange.siblings, absolute),
    }
    headers = _response_headers(request)
    if exchange.generation is None:
        headers.append((REPLAYED_HEADER.lower().encode(), b"true"))
    return Created(body, headers, MessageState.of(answer), user.pk)


def _described(
    message: Message, siblings: dict[str, list[str]], absolute: representation.Absolute
) -> dict[str, Any]:
    return representation.message_data(message, siblings[str(message.id)], absolute)


def _caller(scope: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether this path may serve the caller, and its token's key (None: the session)."""
    key = token_of(scope)
    if key is not None:
        return bool(key), key
    cookies = header(scope, b"cookie") or ""
    has_session = f"{settings.SESSION_COOKIE_NAME}=" in cookies
    # While secret keys rotate, resolving a session's user may move it to a new key; if
    # Django then had to answer, it would find the old one gone.
    rotating = bool(settings.SECRET_KEY_FALLBACKS)
    return has_session and not settings.SESSION_SAVE_EVERY_REQUEST and not rotating, None


async def create(scope: dict[str, Any], receive: Receive) -> Created | Receive:
    """The started answer, or the ``receive`` Django must be called with instead."""
    served, key = _caller(scope)
    length = _declared_json(scope)
    if not available() or scope.get("query_string") or not served or length is None:
        return receive
    request = _request(scope)
    if request is None:
        return receive
    body, received = await _body(receive, length)
    replay = _Replay(received, receive)
    new = scope["url_route"]["kwargs"].get("conversation_id") is None
    post = None if body is None else _post(body, new=new)
    if post is None:
        return replay
    # A token this process holds costs no trip; anything else is resolved with the
    # creation, in the same one.
    user = cached_user(key) if key is not None else None
    created = await database.run(_create, request, key, user, post)
    return replay if created is None else created
