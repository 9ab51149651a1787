"""Stream clients for tests: SSE over a real HTTP connection, WebSocket via websockets."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class SSEEvent:
    id: str | None
    event: str
    data: dict[str, Any]


@dataclass
class SSEReadResult:
    status: int
    headers: httpx.Headers
    events: list[SSEEvent] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    retry: int | None = None


async def iter_sse(response: httpx.Response) -> AsyncIterator[SSEEvent | str]:
    """Parse an SSE body as it arrives; yields events and comment lines (``": ping"``)."""
    event_id: str | None = None
    name = "message"
    data: list[str] = []
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield SSEEvent(event_id, name, json.loads("\n".join(data)))
            event_id, name, data = None, "message", []
            continue
        if line.startswith(":"):
            yield line
            continue
        key, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if key == "id":
            event_id = value
        elif key == "event":
            name = value
        elif key == "data":
            data.append(value)
        elif key == "retry":
            yield f"retry:{value}"


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Token {token}"}


async def post_message(
    client: httpx.AsyncClient, token: str, conversation: str, content: str, **params: Any
) -> dict[str, Any]:
    response = await client.post(
        f"/api/conversations/{conversation}/messages/",
        json={"content": content, "params": params},
        headers=auth(token),
    )
    assert response.status_code == 201, response.text
    return response.json()["message"]


async def create_conversation(client: httpx.AsyncClient, token: str, **fields: Any) -> str:
    response = await client.post("/api/conversations/", json=fields, headers=auth(token))
    assert response.status_code == 201, response.text
    return response.json()["id"]


async def read_sse(
    client: httpx.AsyncClient,
    token: str,
    message_id: str,
    *,
    after: int | None = None,
    last_event_id: int | None = None,
    stop_after: int | None = None,
) -> SSEReadResult:
    """Read a message's SSE stream to its end (or until ``stop_after`` events, then drop)."""
    headers = auth(token)
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    url = f"/api/messages/{message_id}/stream/"
    if after is not None:
        url += f"?after={after}"
    async with client.stream("GET", url, headers=headers) as response:
        result = SSEReadResult(response.status_code, response.headers)
        if response.status_code != 200:
            await response.aread()
            return result
        async for item in iter_sse(response):
            if isinstance(item, str):
                if item.startswith("retry:"):
                    result.retry = int(item[6:])
                else:
                    result.comments.append(item)
                continue
            result.events.append(item)
            if stop_after is not None and len(result.events) >= stop_after:
                break
    return result


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "delta")


def seqs(events: list[dict[str, Any]]) -> list[int]:
    return [e["seq"] for e in events]


async def wait_for_message(
    client: httpx.AsyncClient,
    token: str,
    message_id: str,
    condition: Callable[[dict[str, Any]], bool],
    limit: float = 30.0,
) -> dict[str, Any]:
    """Poll the message until ``condition`` holds of it: a state another process (or its
    write-behind) reaches in the database, of which there is no event to await."""
    import asyncio

    async with asyncio.timeout(limit):
        while True:
            response = await client.get(f"/api/messages/{message_id}/", headers=auth(token))
            body = response.json()
            if condition(body):
                return body
            await asyncio.sleep(0.05)


async def wait_for_status(
    client: httpx.AsyncClient, token: str, message_id: str, limit: float = 30.0
) -> dict[str, Any]:
    """The message once it is no longer streaming (its end persisted)."""
    return await wait_for_message(
        client, token, message_id, lambda body: body["status"] != "streaming", limit
    )
