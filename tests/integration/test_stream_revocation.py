"""An HTTP stream ends when the credentials it was opened with do, as a WebSocket does: a
deleted token or a logout ends the user's open SSE streams (the stream of a message, a
one-step post's answer, a ``/v1`` stream, which says so in an in-band error) without
their ``done``, and reconnecting is refused 401, while another user's stream goes on to
its end (docs/protocol.md). A session that expires by age ends its streams too."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.contrib.sessions.models import Session
from django.utils import timezone
from rest_framework.authtoken.models import Token

from tests.integration.test_ws_revocation import _log_in
from tests.support.clients import auth, create_conversation, post_message, wait_for_status

pytestmark = pytest.mark.asyncio

# Long enough to be streaming still when the credentials go, whatever the machine's pace.
LONG = {"max_tokens": 4096, "simulation": {"length": 4096, "tokens_per_second": 20, "ttft_ms": 0}}
SHORT = {"simulation": {"length": 60, "tokens_per_second": 20, "ttft_ms": 0}}


class Reader:
    """One open stream, read in a task: ``started`` once its first text came. Reads SSE
    data lines itself: a ``/v1`` stream ends with ``data: [DONE]``, which is not JSON."""

    def __init__(self, client: httpx.AsyncClient, method: str, url: str, **kwargs: Any) -> None:
        self.started = asyncio.Event()
        self.kinds: list[str] = []
        self.task = asyncio.create_task(self._read(client, method, url, kwargs))

    async def _read(self, client: httpx.AsyncClient, method: str, url: str, kwargs: Any) -> None:
        async with client.stream(method, url, **kwargs) as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line[6:]
                data = {} if payload == "[DONE]" else json.loads(payload)
                if "error" in data:  # a /v1 stream's in-band error
                    self.kinds.append(f"error:{data['error']['code']}")
                    continue
                self.kinds.append(str(data.get("type", "chunk" if data else payload)))
                if self.kinds[-1] in ("delta", "chunk"):
                    self.started.set()

    async def ended(self) -> list[str]:
        """The kinds of data it got (event types, ``chunk``, ``[DONE]``), once the server
        ended the response."""
        await asyncio.wait_for(self.task, 60)
        return self.kinds


def one_step(server: Any, browser: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Reader:
    """A signed-in page's post answered with its stream (its session and CSRF token)."""
    page = {"X-CSRFToken": browser.cookies["csrftoken"], "Origin": server.url}
    return Reader(
        browser,
        "POST",
        url,
        json=body,
        headers={**page, "Referer": server.url + "/", "Accept": "text/event-stream"},
    )


async def test_a_deleted_token_ends_the_users_open_streams(
    daphne, account, other_account, needs_redis
) -> None:
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as api:
        conversation = await create_conversation(api, account.token)
        message = (await post_message(api, account.token, conversation, "long", **LONG))["id"]
        theirs_conversation = await create_conversation(api, other_account.token)
        readers = [
            Reader(api, "GET", f"/api/messages/{message}/stream/", headers=auth(account.token)),
            Reader(
                api,
                "POST",
                "/api/messages/",
                json={"content": "one step", "params": LONG},
                headers={**auth(account.token), "Accept": "text/event-stream"},
            ),
            Reader(
                api,
                "POST",
                "/v1/chat/completions",
                content=json.dumps(
                    {
                        "model": "simulated",
                        "stream": True,
                        "messages": [{"role": "user", "content": "v1"}],
                        "max_completion_tokens": LONG["max_tokens"],
                        "simulation": LONG["simulation"],
                    }
                ),
                headers={**auth(account.token), "Content-Type": "application/json"},
            ),
        ]
        theirs = Reader(
            api,
            "POST",
            f"/api/conversations/{theirs_conversation}/messages/",
            json={"content": "theirs", "params": SHORT},
            headers={**auth(other_account.token), "Accept": "text/event-stream"},
        )
        for reader in [*readers, theirs]:
            await asyncio.wait_for(reader.started.wait(), 30)

        await sync_to_async(Token.objects.filter(key=account.token).delete)()
        for reader in readers[:2]:
            kinds = await reader.ended()
            assert "done" not in kinds, kinds
        # /v1 says so in the stream, which the openai SDK raises: a stream that just
        # ended read as the answer's end, its text cut short.
        assert (await readers[2].ended())[-2:] == ["error:credentials_revoked", "[DONE]"]
        assert (await theirs.ended())[-1] == "done"
        again = await api.get(f"/api/messages/{message}/stream/", headers=auth(account.token))
        assert again.status_code == 401


async def test_a_logout_ends_the_streams_of_that_session(daphne, account, needs_redis) -> None:
    server = daphne()
    browser = await _log_in(server, account)
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as api:
        conversation = await create_conversation(api, account.token)
        message = (await post_message(api, account.token, conversation, "long", **LONG))["id"]
    readers = [
        Reader(browser, "GET", f"/api/messages/{message}/stream/"),
        one_step(server, browser, "/api/messages/", {"content": "x", "params": LONG}),
    ]
    for reader in readers:
        await asyncio.wait_for(reader.started.wait(), 30)
    out = await browser.post(
        "/accounts/logout/", headers={"X-CSRFToken": browser.cookies["csrftoken"]}
    )
    assert out.status_code in (200, 302), out.text
    for reader in readers:
        assert "done" not in await reader.ended()
    again = await browser.get(f"/api/messages/{message}/stream/")
    assert again.status_code == 401
    await browser.aclose()


async def test_a_session_that_expires_by_age_ends_its_streams(
    daphne, account, other_account
) -> None:
    """Nothing announces a session's expiry: a stream opened with it checks it again every
    ``STREAM_SESSION_RECHECK`` and ends without its ``done`` once it expired, while a
    stream whose session still stands runs to its end through every check, and through
    another user's signing in (a revocation of theirs). So do a signed-in page's one-step
    posts, created on the lean path or by Django (a regenerate), whose routes are
    outside the session middleware."""
    server = daphne(STREAM_SESSION_RECHECK="0.2", MAX_CONCURRENT_GENERATIONS_PER_USER="8")
    expiring, lasting = await _log_in(server, account), await _log_in(server, account)
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as api:
        first, second = [await create_conversation(api, account.token) for _ in range(2)]
        long = (await post_message(api, account.token, first, "long", **LONG))["id"]
        short = (await post_message(api, account.token, second, "short", **SHORT))["id"]
        answered = await create_conversation(api, account.token)
        quick = {"simulation": {"length": 2, "tokens_per_second": 200, "ttft_ms": 0}}
        earlier = (await post_message(api, account.token, answered, "earlier", **quick))["id"]
        await wait_for_status(api, account.token, earlier)

    gone = [
        Reader(expiring, "GET", f"/api/messages/{long}/stream/"),
        one_step(server, expiring, "/api/messages/", {"content": "x", "params": LONG}),
    ]
    kept = [
        Reader(lasting, "GET", f"/api/messages/{short}/stream/"),
        one_step(server, lasting, "/api/messages/", {"content": "x", "params": SHORT}),
        one_step(server, lasting, f"/api/messages/{earlier}/regenerate/", {"params": SHORT}),
    ]
    for reader in [*gone, *kept]:
        await asyncio.wait_for(reader.started.wait(), 30)
    (await _log_in(server, other_account)).cookies.clear()  # their revocation, not ours
    key = expiring.cookies["sessionid"]
    expired = await sync_to_async(Session.objects.filter(session_key=key).update)(
        expire_date=timezone.now() - timedelta(seconds=1)
    )
    assert expired == 1
    for reader in gone:
        assert "done" not in await reader.ended()
    for reader in kept:
        assert (await reader.ended())[-1] == "done", "the other session's checks passed"
    again = await expiring.get(f"/api/messages/{long}/stream/")
    assert again.status_code == 401
    for browser in (expiring, lasting):
        await browser.aclose()
