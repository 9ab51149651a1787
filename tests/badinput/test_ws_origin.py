"""The session cookie rides a WebSocket only from the site's own origin: scheme, host and
port, as Django's CSRF check compares them for REST (a browser page on another port of
the same host is another site)."""

from __future__ import annotations

import json

import pytest
import websockets
from asgiref.sync import sync_to_async
from django.test import Client

from tests.badinput.test_ws_frames import connect, error_for

pytestmark = pytest.mark.asyncio


async def session_cookie(user) -> str:
    def login() -> str:
        client = Client()
        client.force_login(user)
        return client.cookies["sessionid"].value

    return await sync_to_async(login)()


async def test_only_the_sites_own_origin_may_use_the_cookie(daphne, account):
    server = daphne()
    cookie = {"Cookie": f"sessionid={await session_cookie(account.user)}"}
    port = server.port
    foreign = [
        f"http://localhost:{port + 1}",  # same host name, another port
        f"http://127.0.0.1:{port + 1}",
        f"https://127.0.0.1:{port}",  # another scheme
        "http://127.0.0.1",  # no port: port 80
        "https://evil.example",
        "null",
    ]
    for origin in foreign:
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with connect(server, headers={**cookie, "Origin": origin}):
                pass
        assert refused.value.response.status_code == 403, origin

    async with connect(server, headers={**cookie, "Origin": f"http://127.0.0.1:{port}"}) as ws:
        reply = await error_for(ws, json.dumps({"type": "subscribe", "message_id": "nothing"}))
        assert reply["code"] == "not_found", "the cookie authenticated the socket"


async def test_a_trusted_origin_may_use_the_cookie(daphne, account):
    server = daphne(CSRF_TRUSTED_ORIGINS="https://chat.example.com,https://*.example.org")
    cookie = {"Cookie": f"sessionid={await session_cookie(account.user)}"}
    for origin in ("https://chat.example.com", "https://eu.example.org"):
        async with connect(server, headers={**cookie, "Origin": origin}) as ws:
            reply = await error_for(ws, json.dumps({"type": "subscribe", "message_id": "x"}))
            assert reply["code"] == "not_found", origin
    with pytest.raises(websockets.InvalidStatus):
        async with connect(server, headers={**cookie, "Origin": "http://chat.example.com"}):
            pass
