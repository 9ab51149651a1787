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


async def authenticate(scope: dict[str, Any]) -> Any:
    key = token_from_header(header(scope, b"authorization"))
    if key is not None:
        return await user_for_token(key) if key else AnonymousUser()
    user = scope.get("user")
    if user is None:
        return AnonymousUser()
    # Channels' lazy user: resolve it off the event loop thread.
    return await database.run(lambda: user if user.is_authenticated else AnonymousUser())
