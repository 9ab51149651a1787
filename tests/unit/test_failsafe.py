"""An exception after a response started is ended here, never handed to Daphne (whose
connection checker dies on it); one before goes on to Daphne's 500."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from streaming.transports.daphne import innermost_send
from streaming.transports.failsafe import EndsStartedResponses

SCOPE = {"type": "http", "method": "POST", "path": "/api/messages/"}


class Boom(Exception):
    pass


def app_sending(*messages: dict[str, Any]) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        for message in messages:
            await send(message)
        raise Boom

    return app


async def run(app: Any, scope: dict[str, Any] = SCOPE) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    await EndsStartedResponses(app)(scope, receive, send)
    return sent


START = {"type": "http.response.start", "status": 200, "headers": []}
PART = {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True}


async def test_before_the_response_started_the_exception_goes_on() -> None:
    with pytest.raises(Boom):
        await run(app_sending())


async def test_after_it_started_the_body_is_ended_and_the_failure_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sent = await run(app_sending(START, PART))
    assert sent == [START, PART, {"type": "http.response.body", "body": b"", "more_body": False}]
    assert "POST /api/messages/ failed after its response started" in caplog.text
    assert "Boom" in caplog.text


async def test_an_ended_body_is_not_ended_again() -> None:
    end = {"type": "http.response.body", "body": b"{}"}
    assert await run(app_sending(START, end)) == [START, end]


async def test_a_client_already_gone_costs_nothing_more() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send(START)
        raise Boom

    calls = 0

    async def failing_send(message: dict[str, Any]) -> None:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise OSError("gone")

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    await EndsStartedResponses(app)(SCOPE, receive, failing_send)
    assert calls == 2


async def test_other_scopes_pass_through() -> None:
    with pytest.raises(Boom):
        await run(app_sending(START), {"type": "websocket", "path": "/ws/chat/"})


async def test_the_servers_send_is_found_behind_it() -> None:
    """The server hooks (the memory bound, direct frame writes) look behind wrappers for
    Daphne's own ``send``; this one must not hide it."""

    async def server_reply(protocol: Any, message: dict[str, Any]) -> None:
        pass

    daphne_send = functools.partial(server_reply, object())
    seen: list[Any] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(innermost_send(send))

    await EndsStartedResponses(app)(SCOPE, None, daphne_send)
    assert seen == [daphne_send]
