"""Which WebSocket handshakes go through the session middleware: the token decides for a
socket that brings one, so its handshake skips the session entirely, a malformed token
included (it never falls back to the cookie)."""

from __future__ import annotations

from typing import Any

import pytest

from streaming.transports.wsauth import SessionUnlessToken


class Recorder:
    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scopes.append(scope)


def handshake(*headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"type": "websocket", "path": "/ws/chat/", "headers": [*headers]}


@pytest.mark.parametrize(
    ("headers", "with_token"),
    [
        ([(b"authorization", b"Token abc123")], True),
        ([(b"authorization", b"Bearer abc123")], True),
        ([(b"authorization", b"Token ")], True),  # malformed: anonymous, never the cookie
        ([(b"cookie", b"sessionid=xyz"), (b"origin", b"http://testserver")], False),
        ([], False),
    ],
)
async def test_a_token_at_the_handshake_skips_the_session(
    headers: list[tuple[bytes, bytes]], with_token: bool
) -> None:
    token, session = Recorder(), Recorder()
    scope = handshake(*headers)
    await SessionUnlessToken(token, session)(scope, None, None)
    assert (token.scopes, session.scopes) == (([scope], []) if with_token else ([], [scope]))
