"""The Django ASGI handler enters a request's thread once for its middleware and view."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Mapping
from typing import Any

import pytest
from asgiref.sync import AsyncToSync, SyncToAsync

from chatsite.handler import SyncStackHandler
from tests.conftest import Account


def _scope(path: str, token: str = "", method: str = "GET") -> dict[str, Any]:
    headers = [(b"host", b"testserver")]
    if token:
        headers.append((b"authorization", f"Token {token}".encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }


async def _request(scope: dict[str, Any]) -> tuple[int, bytes]:
    sent: list[Mapping[str, Any]] = []
    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the disconnect watch waits here until cancelled
        raise AssertionError

    async def send(message: Mapping[str, Any]) -> None:
        sent.append(message)

    await SyncStackHandler()(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """The threads each ``sync_to_async`` call ran in, and how many ``async_to_sync``
    calls were made, while a request is served."""
    seen: dict[str, list[int]] = {"into_thread": [], "back_to_loop": []}
    into, back = SyncToAsync.__call__, AsyncToSync.__call__

    async def counted_into(self: SyncToAsync, *args: Any, **kwargs: Any) -> Any:
        func = self.func

        def where(*a: Any, **k: Any) -> Any:
            seen["into_thread"].append(threading.get_ident())
            return func(*a, **k)

        self.func = where
        return await into(self, *args, **kwargs)

    def counted_back(self: AsyncToSync, *args: Any, **kwargs: Any) -> Any:
        seen["back_to_loop"].append(threading.get_ident())
        return back(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counted_into)
    monkeypatch.setattr(AsyncToSync, "__call__", counted_back)
    return seen


async def test_a_request_runs_its_middleware_and_view_in_one_call_into_its_thread(
    account: Account, hops: dict[str, list[int]]
) -> None:
    status, body = await _request(_scope("/api/conversations/", account.token))

    assert status == 200, body
    assert json.loads(body)["results"] == []
    # request_started's receivers, the stack with the view, the response's close: the
    # stock handler also went back to the loop from inside the stack, and in again.
    assert hops["back_to_loop"] == []
    assert len(hops["into_thread"]) == 3
    assert len(set(hops["into_thread"])) == 1  # the request's one thread


async def test_errors_come_from_the_synchronous_stack_as_before(
    account: Account, hops: dict[str, list[int]]
) -> None:
    status, body = await _request(_scope("/api/conversations/", ""))
    assert status == 401
    assert json.loads(body)["error"]["code"] == "not_authenticated"

    status, body = await _request(_scope("/api/messages/not-a-uuid/", account.token))
    assert status == 404
    assert hops["back_to_loop"] == []
