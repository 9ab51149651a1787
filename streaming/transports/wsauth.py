"""WebSocket handshake rules (cross-site WebSocket hijacking protection).

- ``Authorization: Token <key>`` (or ``Bearer``) at the handshake: the token decides; no
  Origin needed (non-browser clients).
- Otherwise the session cookie is used only when the ``Origin`` is the site itself, by
  the rule Django's CSRF check applies to unsafe requests: scheme, host and port equal to
  the request's own (its ``Host``, which must be in ``ALLOWED_HOSTS``), or an origin of
  ``CSRF_TRUSTED_ORIGINS`` (``https://*.example.com`` for subdomains). A foreign Origin is
  refused at the handshake, and a missing Origin connects anonymous (a first ``auth``
  frame with a token may still authenticate it). Browsers always send Origin, so a page
  on another site (another port included) can never ride on the user's cookie.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.sessions import SessionMiddlewareStack
from django.conf import settings
from django.utils.http import is_same_domain

from streaming.auth import by_session, header
from streaming.transports.hosts import allowed_host


def origin_allowed(origin: str, scope: dict[str, Any]) -> bool:
    """Whether ``origin`` is the site's own or a trusted one. Only an origin as browsers
    serialise it counts (RFC 6454: a lowercase scheme and host, no path, no userinfo):
    nothing else comes from a browser, whose script is what the check is for."""
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    if origin != f"{parts.scheme}://{parts.netloc}".lower() or "@" in parts.netloc:
        return False
    for trusted in settings.CSRF_TRUSTED_ORIGINS:
        allowed = urlsplit(trusted)
        if allowed.scheme != parts.scheme:
            continue
        netloc = allowed.netloc.lower()
        if netloc == parts.netloc.lower():
            return True
        if netloc.startswith("*.") and is_same_domain(parts.netloc.lower(), netloc[1:]):
            return True
    host = allowed_host(scope)
    if host is None:
        return False
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    return origin == f"{scheme}://{host.lower()}"


class WebSocketAuthMiddleware:
    """Channels' session middleware runs only for a handshake whose cookie may count (a
    browser's, from the site itself): for a token, a non-browser or a refused Origin the
    session is never read, yet the middleware would make its store on the process's
    thread-sensitive thread and hold it, its wrapper and two more copies of the scope for
    as long as the socket is open."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.with_session = SessionMiddlewareStack(inner)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        """Decide which credentials count, without a database call: the consumer accepts
        at once and resolves the user (``streaming.auth.resolve_user``) off the handshake,
        so a busy database never holds a handshake past the server's connect timeout."""
        if scope["type"] != "websocket":
            return await self.inner(scope, receive, send)
        if not by_session(scope):
            return await self.inner(scope, receive, send)  # the token decides
        origin = header(scope, b"origin")
        if origin is None:
            # Not a browser: the cookie must not authenticate it.
            return await self.inner(scope, receive, send)
        if not origin_allowed(origin, scope):
            message = await receive()
            if message["type"] == "websocket.connect":
                await send({"type": "websocket.close", "code": 4403})
            return None
        return await self.with_session(scope, receive, send)
