"""Which WebSocket handshakes reach the application, and which with a session: the token
decides for a socket that brings one (a malformed token included: it never falls back to
the cookie), a handshake without Origin connects without the cookie, a foreign Origin is
refused, and only a handshake from the site itself goes through the session middleware."""

from __future__ import annotations

from typing import Any

import pytest

from streaming.transports.wsauth import WebSocketAuthMiddleware


class Recorder:
    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scopes.append(scope)


def handshake(*headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {
        "type": "websocket",
        "path": "/ws/chat/",
        "scheme": "ws",
        "headers": [(b"host", b"localhost"), *headers],
    }


async def connect_message() -> dict[str, Any]:
    return {"type": "websocket.connect"}


@pytest.mark.parametrize(
    "headers",
    [
        [(b"authorization", b"Token abc123")],
        [(b"authorization", b"Bearer abc123"), (b"origin", b"https://evil.example")],
        [(b"authorization", b"Token ")],  # malformed: anonymous, never the cookie
        [(b"cookie", b"sessionid=xyz")],  # no Origin: not a browser
    ],
)
async def test_a_handshake_whose_cookie_cannot_count_skips_the_session(
    headers: list[tuple[bytes, bytes]],
) -> None:
    inner = Recorder()
    scope = handshake(*headers)
    await WebSocketAuthMiddleware(inner)(scope, connect_message, None)
    assert inner.scopes == [scope]
    assert "session" not in inner.scopes[0]


@pytest.mark.parametrize(
    "origin",
    [
        b"https://evil.example",
        # The site's own host, but not as a browser sends an origin.
        b"http://localhost/",
        b"http://localhost/path",
        b"HTTP://localhost",
        b"http://LOCALHOST",
        b"http://user@localhost",
    ],
)
async def test_a_foreign_origin_is_refused_before_any_session(settings: Any, origin: bytes) -> None:
    settings.ALLOWED_HOSTS = ["localhost"]
    inner, sent = Recorder(), []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = handshake((b"cookie", b"sessionid=xyz"), (b"origin", origin))
    await WebSocketAuthMiddleware(inner)(scope, connect_message, send)
    assert inner.scopes == []
    assert sent == [{"type": "websocket.close", "code": 4403}]


async def test_a_handshake_from_the_site_itself_gets_its_session(settings: Any) -> None:
    settings.ALLOWED_HOSTS = ["localhost"]
    inner = Recorder()
    key = "k" * 32
    scope = handshake((b"cookie", f"sessionid={key}".encode()), (b"origin", b"http://localhost"))
    await WebSocketAuthMiddleware(inner)(scope, connect_message, None)
    assert len(inner.scopes) == 1
    assert inner.scopes[0]["session"].session_key == key
