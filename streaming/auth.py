"""Who is on the other end of a stream.

Channels consumers bypass Django middleware and DRF, so SSE and WebSocket authenticate
here: ``Authorization: Token <key>`` (or ``Bearer <key>``, for OpenAI clients) with DRF
tokens, else the session user that Channels' ``AuthMiddlewareStack`` put in the scope.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser

from streaming import database


def header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return None


def token_from_header(value: str | None) -> str | None:
    if not value:
        return None
    scheme, _, key = value.strip().partition(" ")
    if scheme.lower() in ("token", "bearer") and key.strip():
        return key.strip()
    return ""  # present but malformed: never fall back to the session


def _user_for_token(key: str) -> Any:
    from rest_framework.authtoken.models import Token

    try:
        token = Token.objects.select_related("user").get(key=key)
    except Token.DoesNotExist:
        return AnonymousUser()
    return token.user if token.user.is_active else AnonymousUser()


async def user_for_token(key: str) -> Any:
    return await database.run(_user_for_token, key)


def resolve_user(scope: dict[str, Any]) -> Any:
    """The caller's user (synchronous: a database thread resolves it, together with what
    the caller asked for, in one trip)."""
    key = token_from_header(header(scope, b"authorization"))
    if key is not None:
        return _user_for_token(key) if key else AnonymousUser()
    user = scope.get("user")
    # Channels' lazy session user resolves here, off the event loop thread.
    if user is None or not user.is_authenticated:
        return AnonymousUser()
    return user


async def authenticate(scope: dict[str, Any]) -> Any:
    return await database.run(resolve_user, scope)
