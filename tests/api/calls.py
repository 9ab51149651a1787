"""Small synchronous HTTP helpers for the API tests (real sockets, real Daphne)."""

from __future__ import annotations

import json
import os
from typing import Any

import httpx


def client(server: Any, token: str | None = None, **kwargs: Any) -> httpx.Client:
    headers = {"Authorization": f"Token {token}"} if token else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30, **kwargs)


def new_conversation(api: httpx.Client, **fields: Any) -> str:
    response = api.post("/api/conversations/", json=fields)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def post(
    api: httpx.Client,
    conversation: str,
    content: str,
    *,
    wait: bool = False,
    params: dict[str, Any] | None = None,
    **simulation: Any,
) -> httpx.Response:
    """POST a user message; keyword arguments are ``params.simulation`` keys."""
    url = f"/api/conversations/{conversation}/messages/" + ("?wait=true" if wait else "")
    params = dict(params or {})
    if simulation:
        params["simulation"] = simulation
    return api.post(url, json={"content": content, "params": params})


def started(
    api: httpx.Client, conversation: str, content: str, **simulation: Any
) -> dict[str, Any]:
    """Post a message; the assistant message (streaming) of the 201 answer."""
    response = post(api, conversation, content, **simulation)
    assert response.status_code == 201, response.text
    return response.json()["message"]


def read_to_end(api: httpx.Client, message_id: str, until: str = "done") -> list[dict[str, Any]]:
    """The message's SSE events up to its ``done`` (the event to await for an end), or up
    to the first event of type ``until``."""
    events = []
    with api.stream("GET", f"/api/messages/{message_id}/stream/") as response:
        if response.status_code == 204:
            return []
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if events[-1]["type"] == until:
                    break
    return events


def assert_error(response: httpx.Response, status: int, code: str | None = None, field=None):
    """The one error shape (streaming.errors); a validation error's message names its field."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["status"] == status
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code, error
    if field is not None:
        assert error.get("field") == field, error
        assert error["message"].startswith(f"{field}: "), error
    return error


def redis_client() -> Any:
    """A client of the Redis the servers' log is in, or None when the log is in memory."""
    url = os.environ.get("REDIS_URL")
    if not url:
        return None
    import redis

    return redis.Redis.from_url(url)
