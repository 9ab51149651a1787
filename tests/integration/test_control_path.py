"""Control never waits on other consumers: Stop and abandonment reach the generating
process while it serves many OpenAI-compatible streams (which used to hold the shared
receive lock of the Channels layer for as long as they lasted)."""

from __future__ import annotations

import contextlib
import json

import httpx
import pytest

from tests.support.clients import (
    auth,
    create_conversation,
    iter_sse,
    post_message,
    wait_for_status,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("needs_redis")]

LONG = {"length": 4000, "tokens_per_second": 20}
OPEN_STREAMS = 10


async def open_completion_stream(
    stack: contextlib.AsyncExitStack, client: httpx.AsyncClient, token: str
) -> None:
    """A `/v1` stream that stays open, read up to its first content chunk."""
    body = {
        "model": "simulated",
        "stream": True,
        "messages": [{"role": "user", "content": "keep going"}],
        "simulation": LONG,
    }
    headers = {"Authorization": f"Bearer {token}"}
    response = await stack.enter_async_context(
        client.stream("POST", "/v1/chat/completions", json=body, headers=headers)
    )
    assert response.status_code == 200
    lines = response.aiter_lines()
    async for line in lines:
        if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
            assert "error" not in json.loads(line[6:])
            return
    raise AssertionError("the stream ended before its first token")


async def first_event(client: httpx.AsyncClient, token: str, message_id: str) -> None:
    url = f"/api/messages/{message_id}/stream/"
    async with client.stream("GET", url, headers=auth(token)) as response:
        async for item in iter_sse(response):
            if not isinstance(item, str) and item.data["type"] == "delta":
                return  # leave: the only reader goes away


async def test_stop_and_abandonment_with_openai_streams_open(two_processes, account):
    env = {"MAX_CONCURRENT_GENERATIONS_PER_USER": 20, "STREAM_ABANDON_GRACE": "0"}
    async with (
        two_processes(**env) as (_, _, ca, cb),
        contextlib.AsyncExitStack() as streams,
    ):
        for _ in range(OPEN_STREAMS):
            await open_completion_stream(streams, ca, account.token)
        # One conversation each: a question never follows an answer still streaming.
        conversations = [await create_conversation(ca, account.token) for _ in range(3)]
        answers = [
            await post_message(ca, account.token, conversation, f"answer {i}", simulation=LONG)
            for i, conversation in enumerate(conversations)
        ]
        # Stop each from the other process: the cancel answers with the final state once
        # the generating process confirmed the end (it waits at most STOP_WAIT for it).
        for answer in answers:
            stopped = await cb.post(
                f"/api/messages/{answer['id']}/cancel/", headers=auth(account.token)
            )
            assert stopped.status_code == 200
            assert stopped.json()["status"] == "cancelled", stopped.json()

        # Abandonment: the only reader, on the other process, leaves after one delta.
        lonely = await post_message(ca, account.token, conversations[0], "alone", simulation=LONG)
        await first_event(cb, account.token, lonely["id"])
        ended = await wait_for_status(cb, account.token, lonely["id"], limit=10)
        assert ended["status"] == "abandoned"
