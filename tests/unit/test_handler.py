"""The Django ASGI handler enters a request's thread once for its middleware and view,
and keeps request threads for later requests."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Mapping
from typing import Any

import pytest
from asgiref.sync import AsyncToSync, SyncToAsync

from chatsite.handler import RequestThreads, SyncStackHandler
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


async def _request(
    scope: dict[str, Any], handler: SyncStackHandler | None = None
) -> tuple[int, bytes]:
    sent: list[Mapping[str, Any]] = []
    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the disconnect watch waits here until cancelled
        raise AssertionError

    async def send(message: Mapping[str, Any]) -> None:
        sent.append(message)

    await (handler or SyncStackHandler())(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[threading.Thread]]:
    """The threads each ``sync_to_async`` call ran in, and the threads ``async_to_sync``
    calls were made from, while a request is served. Thread objects, not idents: an
    ident is reused once its thread has ended."""
    seen: dict[str, list[threading.Thread]] = {"into_thread": [], "back_to_loop": []}
    into, back = SyncToAsync.__call__, AsyncToSync.__call__

    async def counted_into(self: SyncToAsync, *args: Any, **kwargs: Any) -> Any:
        func = self.func

        def where(*a: Any, **k: Any) -> Any:
            seen["into_thread"].append(threading.current_thread())
            return func(*a, **k)

        self.func = where
        return await into(self, *args, **kwargs)

    def counted_back(self: AsyncToSync, *args: Any, **kwargs: Any) -> Any:
        seen["back_to_loop"].append(threading.current_thread())
        return back(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counted_into)
    monkeypatch.setattr(AsyncToSync, "__call__", counted_back)
    return seen


async def test_a_request_runs_its_middleware_and_view_in_one_call_into_its_thread(
    account: Account, hops: dict[str, list[threading.Thread]]
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
    account: Account, hops: dict[str, list[threading.Thread]]
) -> None:
    status, body = await _request(_scope("/api/conversations/", ""))
    assert status == 401
    assert json.loads(body)["error"]["code"] == "not_authenticated"

    status, body = await _request(_scope("/api/messages/not-a-uuid/", account.token))
    assert status == 404
    assert hops["back_to_loop"] == []


async def test_later_requests_are_served_by_the_kept_thread(
    account: Account, hops: dict[str, list[threading.Thread]]
) -> None:
    handler = SyncStackHandler()
    for _ in range(3):
        status, body = await _request(_scope("/api/conversations/", account.token), handler)
        assert status == 200, body

    # Three calls per request, all in one thread: Django's own handler starts a thread
    # per request (and asgiref another to join it).
    assert len(hops["into_thread"]) == 9
    assert len(set(hops["into_thread"])) == 1
    assert hops["into_thread"][0].name.startswith("request")
    assert len(handler.threads.idle) == 1


def test_concurrent_requests_get_threads_of_their_own_and_a_bounded_number_is_kept() -> None:
    threads = RequestThreads(keep=1)
    first, second = threads.take(), threads.take()
    assert first is not second
    threads.give(first, clean=True)
    threads.give(second, clean=True)  # past ``keep``: shut down
    assert threads.idle == [first]
    with pytest.raises(RuntimeError):  # shut down: it takes no more work
        second.submit(int)
    assert threads.take() is first


def test_a_thread_whose_request_did_not_end_normally_is_not_kept() -> None:
    threads = RequestThreads(keep=4)
    executor = threads.take()
    threads.give(executor, clean=False)
    assert threads.idle == []
    with pytest.raises(RuntimeError):
        executor.submit(int)
