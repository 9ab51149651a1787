"""An open WebSocket loses its access when its credentials do, as a request does: a
deleted token, a token given to another user or a deactivated user closes the user's
sockets (4401) in every process, through control, while other users' sockets stay open
(docs/protocol.md)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx
import pytest
import websockets
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.utils import timezone
from rest_framework.authtoken.models import Token

from tests.support.wsclient import ChatSocket

pytestmark = pytest.mark.asyncio

REVOKED = 4401


async def close_code(ws: ChatSocket) -> int | None:
    """The code the server closed ``ws`` with; a socket the server keeps open (its
    heartbeats go on) fails the test after a minute instead of holding it."""
    with pytest.raises(websockets.ConnectionClosed) as closed:
        async with asyncio.timeout(60):
            while True:
                await ws.conn.recv()
    received = closed.value.rcvd
    return None if received is None else received.code


async def still_open(ws: ChatSocket) -> bool:
    await ws.send({"type": "ping", "ref": "still"})
    while True:
        frame = await asyncio.wait_for(ws.recv(), 30)
        if frame.get("type") == "pong":
            return frame.get("ref") == "still"


async def test_revoked_credentials_close_the_users_sockets_everywhere(
    daphne, account, other_account, make_account, needs_redis
):
    servers = [daphne("a"), daphne("b")]
    mine = [await ChatSocket.connect(server.ws_url, account.token) for server in servers]
    # A socket that authenticated with an auth frame, not its handshake.
    framed = await ChatSocket.connect(servers[1].ws_url, None)
    await framed.send({"type": "auth", "token": account.token})
    assert (await framed.recv())["type"] == "authenticated"
    others = [await ChatSocket.connect(server.ws_url, other_account.token) for server in servers]
    for ws in [*mine, framed, *others]:
        assert await still_open(ws)

    await sync_to_async(Token.objects.filter(key=account.token).delete)()
    for ws in [*mine, framed]:
        assert await close_code(ws) == REVOKED
    for ws in others:
        assert await still_open(ws)

    # A deactivated user, with a token that still exists.
    later = await sync_to_async(make_account)("dora")
    socket = await ChatSocket.connect(servers[0].ws_url, later.token)
    assert await still_open(socket)
    later.user.is_active = False
    await sync_to_async(later.user.save)()
    assert await close_code(socket) == REVOKED
    # A token given to another user (the admin's token page can): the sockets opened with
    # it were its old owner's.
    given = await sync_to_async(make_account)("erin")
    socket = await ChatSocket.connect(servers[1].ws_url, given.token)
    assert await still_open(socket)
    token = await Token.objects.aget(key=given.token)
    token.user = await User.objects.acreate(username="frank")
    await sync_to_async(token.save)()
    assert await close_code(socket) == REVOKED
    # A change that leaves the user able to sign in closes nothing.
    other_account.user.first_name = "Mallory"
    await sync_to_async(other_account.user.save)()
    for ws in others:
        assert await still_open(ws)
        await ws.close()


async def _log_in(server, account) -> httpx.AsyncClient:
    """A browser's session on ``server``, signed in through the login form."""
    browser = httpx.AsyncClient(base_url=server.url, timeout=30)
    await browser.get("/accounts/login/")
    signed_in = await browser.post(
        "/accounts/login/",
        data={
            "username": account.username,
            "password": account.password,
            "csrfmiddlewaretoken": browser.cookies["csrftoken"],
        },
    )
    assert signed_in.status_code == 302, signed_in.text
    return browser


async def test_a_logout_closes_the_sockets_of_that_session_everywhere(daphne, account, needs_redis):
    """A socket opened with the session cookie ends with the session: the logout (on any
    process) closes it with 4401, while a socket of the same user's other session stays."""
    a, b = daphne("a"), daphne("b")
    leaving, staying = await _log_in(a, account), await _log_in(a, account)
    sockets = [await _session_socket(b, browser) for browser in (leaving, staying)]
    # A socket that has sent nothing yet: its first frame after the logout must not find
    # the user its handshake resolved before it.
    silent = await _session_socket(b, leaving, send=False)
    out = await leaving.post(
        "/accounts/logout/", headers={"X-CSRFToken": leaving.cookies["csrftoken"]}
    )
    assert out.status_code in (200, 302), out.text
    assert await close_code(sockets[0]) == REVOKED
    assert await close_code(silent) == REVOKED
    assert await still_open(sockets[1])
    await sockets[1].close()
    for browser in (leaving, staying):
        await browser.aclose()


async def _session_socket(server, browser: httpx.AsyncClient, send: bool = True) -> ChatSocket:
    """A socket opened with ``browser``'s session cookie; with ``send``, one whose frames
    showed that the cookie authenticated it."""
    cookie = f"sessionid={browser.cookies['sessionid']}"
    ws = await ChatSocket.connect(server.ws_url, origin=server.url, headers={"Cookie": cookie})
    if send:
        assert await still_open(ws)
        await ws.send({"type": "subscribe", "topic": "user"})
        assert (await ws.recv())["type"] == "subscribed", "the cookie authenticated it"
    return ws


async def test_a_session_that_expires_by_age_closes_its_sockets(daphne, account):
    """Nothing announces a session's expiry: a socket opened with it checks it again
    every ``STREAM_SESSION_RECHECK`` and is closed with 4401 once it expired, while a
    socket whose session still stands passes its checks and stays open."""
    server = daphne(STREAM_SESSION_RECHECK="0.2")
    expiring, lasting = await _log_in(server, account), await _log_in(server, account)
    gone, kept = [await _session_socket(server, browser) for browser in (expiring, lasting)]
    key = expiring.cookies["sessionid"]
    expired = await sync_to_async(Session.objects.filter(session_key=key).update)(
        expire_date=timezone.now() - timedelta(seconds=1)
    )
    assert expired == 1
    assert await close_code(gone) == REVOKED
    assert await still_open(kept)
    await kept.close()
    for browser in (expiring, lasting):
        await browser.aclose()
