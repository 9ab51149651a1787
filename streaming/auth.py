"""Who is on the other end of a stream.

Channels consumers bypass Django middleware and DRF, so SSE and WebSocket authenticate
here: ``Authorization: Token <key>`` (or ``Bearer <key>``, for OpenAI clients) with DRF
tokens, else the user of the session that Channels' ``SessionMiddlewareStack`` put in the
scope. The user is resolved in a database thread together with whatever the caller asked
for (Channels' ``AuthMiddlewareStack`` would resolve it first, in Channels' one database
thread, on every stream open and WebSocket handshake).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any, cast

from django.conf import settings
from django.contrib.auth import get_user
from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest
from django.http.cookie import parse_cookie

from streaming import database, tokens


def header(scope: dict[str, Any], name: bytes) -> str | None:
    """The value of the request header ``name`` (lower case) as Django reads it: a header
    sent more than once is its values joined by commas (RFC 9110, section 5.3). Taking
    the first made one request mean two things: two ``Authorization`` headers were a
    401 on REST and the first header's user on the streams and ``/v1``."""
    values = [value for key, value in scope.get("headers", ()) if key == name]
    if not values:
        return None
    return b",".join(values).decode("latin-1")


def token_from_header(value: str | None) -> str | None:
    """The key of an ``Authorization`` header (None: no header, or one with nothing but
    whitespace in it; "": present but not a token, which never falls back to the
    session). Read as DRF reads it for the REST API: two parts split on ASCII whitespace,
    so one header means the same everywhere."""
    parts = value.encode("latin-1").split() if value else []
    if not parts:
        return None
    if len(parts) == 2 and parts[0].lower() in (b"token", b"bearer"):
        return parts[1].decode("latin-1")
    return ""


def token_of(scope: dict[str, Any]) -> str | None:
    """Which credentials a request authenticates with, as every entry point takes them
    (the REST API's authentication reads its header with ``token_from_header`` too): a
    token's key; "" for an ``Authorization`` header that is no token, refused and never
    taken for the session; None for no token sent, when the session (if any) decides."""
    return token_from_header(header(scope, b"authorization"))


def by_session(scope: dict[str, Any]) -> bool:
    """Whether a request authenticates with its session (if any): it sent no token."""
    return token_of(scope) is None


# What a request that authenticated nobody is told, in the REST API's words: DRF's when
# nothing was sent, the token classes' for a header that is no token or an unknown key.
NOT_PROVIDED = "Authentication credentials were not provided."
INVALID_HEADER = "Invalid token header."
INVALID_TOKEN = "Invalid token."
INACTIVE = "User inactive or deleted."


class InactiveUser(AnonymousUser):
    """Who a token of an inactive user authenticates: nobody, as for an unknown key, but
    known as such, so the refusal can say why as the REST API does, without another
    query on the 401's path."""


def refusal(scope: dict[str, Any], user: Any) -> str:
    """The 401's message for a request whose credentials authenticated nobody (``user``,
    as ``resolve_user`` or ``authenticate`` gave it)."""
    key = token_of(scope)
    if key is None:
        return NOT_PROVIDED
    if not key:
        return INVALID_HEADER
    return INACTIVE if isinstance(user, InactiveUser) else INVALID_TOKEN


def token_user(key: str) -> Any | None:
    """The user of an API token (active or not), None for an unknown key; mostly without
    a database trip (``streaming.tokens``). Synchronous: a database thread calls it."""
    return tokens.cache().user_for(key)


def _user_for_token(key: str) -> Any:
    user = token_user(key)
    if user is None:
        return AnonymousUser()
    return user if user.is_active else InactiveUser()


def cached_user(key: str) -> Any | None:
    """The user of a token this process holds (no query: the event loop may ask), an
    anonymous one for a cached inactive user, or None when only the database can tell."""
    user = tokens.cache().cached(key)
    if user is None:
        return None
    return user if user.is_active else InactiveUser()


async def user_for_token(key: str) -> Any:
    user = cached_user(key)
    return user if user is not None else await database.run(_user_for_token, key)


@dataclass(slots=True)
class _SessionOf:
    """What ``django.contrib.auth.get_user`` needs of a request."""

    session: Any


def session_user(scope: dict[str, Any]) -> Any:
    """The user of the scope's session as the session store holds it now: read afresh on
    every call, never from the copy loaded at the handshake, so that a socket's recheck
    sees a logout (the session flushed) or a password change (its hash no longer
    matching) as a new request would."""
    session = scope.get("session")
    key = session.session_key if session is not None else None
    if not key:
        return AnonymousUser()
    store = import_module(settings.SESSION_ENGINE).SessionStore(key)
    return get_user(cast(HttpRequest, _SessionOf(store)))


def with_session(scope: dict[str, Any]) -> dict[str, Any]:
    """``scope`` as Channels' session middleware would give it, for a route outside that
    middleware whose request was already accepted with its session (a one-step post: the
    CSRF check was its creation's): the session its cookie names, which ``session_user``
    reads afresh on every check. A scope that has a session, or one that sent a token
    (never the session), is returned as it is. Nothing is read from the store here."""
    if "session" in scope or not by_session(scope):
        return scope
    cookies = header(scope, b"cookie")
    key = parse_cookie(cookies).get(settings.SESSION_COOKIE_NAME) if cookies else None
    return {**scope, "session": import_module(settings.SESSION_ENGINE).SessionStore(key)}


def resolve_user(scope: dict[str, Any]) -> Any:
    """The caller's user (synchronous: a database thread resolves it, together with what
    the caller asked for, in one trip)."""
    key = token_of(scope)
    if key is not None:
        return _user_for_token(key) if key else AnonymousUser()
    return session_user(scope)


def known_user(scope: dict[str, Any]) -> Any | None:
    """``resolve_user``'s answer when this process knows it without a query (a token it
    holds, an ``Authorization`` header that is no token), else None."""
    key = token_of(scope)
    if key == "":
        return AnonymousUser()
    return cached_user(key) if key else None


async def authenticate(scope: dict[str, Any]) -> Any:
    """``resolve_user`` from async code: a token this process holds costs no trip to a
    database thread (most requests of a user after their first)."""
    user = known_user(scope)
    return user if user is not None else await database.run(resolve_user, scope)
