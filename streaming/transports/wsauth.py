"""WebSocket handshake rules (cross-site WebSocket hijacking protection).

- ``Authorization: Token <key>`` (or ``Bearer``) at the handshake: the token decides; no
  Origin needed (non-browser clients).
- Otherwise the session cookie is used only when the ``Origin`` is one of our hosts
  (``ALLOWED_HOSTS``/``CSRF_TRUSTED_ORIGINS``); a foreign Origin is refused at the
  handshake, and a missing Origin connects anonymous (a first ``auth`` frame with a token
  may still authenticate it). Browsers always send Origin, so a page on another site can
  never ride on the user's cookie.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.http.request import validate_host

from streaming.auth import header, token_from_header


def origin_allowed(origin: str) -> bool:
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    if origin.rstrip("/") in {o.rstrip("/") for o in settings.CSRF_TRUSTED_ORIGINS}:
        return True
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    return validate_host(host, settings.ALLOWED_HOSTS)


class WebSocketAuthMiddleware:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        """Decide which credentials count, without a database call: the consumer accepts
        at once and resolves the user (``streaming.auth.resolve_user``) off the handshake,
        so a busy database never holds a handshake past the server's connect timeout."""
        if scope["type"] != "websocket":
            return await self.inner(scope, receive, send)
        if token_from_header(header(scope, b"authorization")) is not None:
            return await self.inner(scope, receive, send)  # the token decides
        origin = header(scope, b"origin")
        if origin is None:
            # Not a browser: the cookie must not authenticate it.
            scope = {k: v for k, v in scope.items() if k != "session"}
        elif not origin_allowed(origin):
            message = await receive()
            if message["type"] == "websocket.connect":
                await send({"type": "websocket.close", "code": 4403})
            return None
        return await self.inner(scope, receive, send)
