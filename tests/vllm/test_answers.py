"""The product against the real vLLM: every way an answer ends, through the public API
and real transports (a Daphne process whose engine is the session's vLLM server).

The tiny model's answers are exact (``tests.vllm.planted``), so every text is compared
whole; vLLM's own log shows that a Stop or a reader leaving aborted the request there.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest

from tests.support.clients import (
    auth,
    create_conversation,
    iter_sse,
    post_message,
    read_sse,
    text_of,
    wait_for_status,
)
from tests.support.wsclient import ChatSocket
from tests.vllm import planted
from tests.vllm.conftest import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio]

# Tokens before the first byte of 日 in the normal answer: <think></think> and 20 more.
BEFORE_NIHON = 22


@pytest.fixture
def chat(daphne, vllm_server: VLLMServer):
    """``chat(**env)``: a Daphne process whose engine is the real vLLM."""

    def start(**env: Any):
        return daphne(ENGINE_URL=vllm_server.url, ENGINE_MODEL=vllm_server.model, **env)

    return start


async def events_of(client: httpx.AsyncClient, token: str, message_id: str, **kw: Any):
    return [e.data for e in (await read_sse(client, token, message_id, **kw)).events]


async def test_exact_text_over_sse_and_websocket(chat, account):
    server = chat()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(client, account.token, conversation, "Say hello")
        over_sse = await events_of(client, account.token, message["id"])

        ws = await ChatSocket.connect(server.ws_url, account.token)
        created = await ws.create(conversation, "Say hello again", {})
        over_ws = await ws.events_until_done(created[-1]["message_id"])
        await ws.close()
        stored = await wait_for_status(client, account.token, message["id"])

    for events in (over_sse, over_ws):
        assert text_of(events) == planted.NORMAL
        assert events[0]["type"] == "start" and events[0]["model"] == "tiny"
        assert events[-1]["status"] == "complete"
        assert events[-1]["finish_reason"] == "stop"
    assert stored["content"] == planted.NORMAL
    assert stored["termination"]["completion_tokens"] == over_sse[-1]["completion_tokens"] > 50
    assert stored["termination"]["context_full"] is False


async def test_truncated_mid_character_then_continue_to_the_whole_text(chat, account):
    server = chat()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        # The budget ends after the first of the three bytes of 日.
        message = await post_message(
            client, account.token, conversation, "Say hello", max_tokens=BEFORE_NIHON + 1
        )
        first = await events_of(client, account.token, message["id"])
        assert first[-1]["status"] == "truncated"
        partial = text_of(first)
        assert partial == planted.NORMAL[: planted.NORMAL.index("日")]

        texts = [partial]
        after = first[-1]["seq"]
        for _ in range(5):
            response = await client.post(
                f"/api/messages/{message['id']}/continue/", headers=auth(account.token)
            )
            if response.status_code == 409:
                break
            assert response.status_code == 202, response.text
            assert response.json()["after"] == after
            events = await events_of(client, account.token, message["id"], after=after)
            texts.append(text_of(events))
            after = events[-1]["seq"]
            if events[-1]["status"] == "complete":
                break
        stored = await wait_for_status(client, account.token, message["id"])

    assert "".join(texts) == planted.NORMAL
    assert stored["content"] == planted.NORMAL
    assert stored["status"] == "complete"
    assert len(stored["segments"]) == len(texts) > 2
    assert "\ufffd" not in "".join(texts)


async def test_stop_string(chat, account):
    server = chat()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, "Say hello", stop=["planted"]
        )
        events = await events_of(client, account.token, message["id"])

    assert text_of(events) == planted.NORMAL[: planted.NORMAL.index("planted")]
    assert events[-1]["status"] == "stopped"
    assert events[-1]["stop_reason"] == "planted"


async def first_delta_then(client, token: str, message_id: str, action) -> list[dict]:
    """Read the SSE stream; on the first delta, run ``action``; read on to the end."""
    events: list[dict] = []
    acted = False
    async with client.stream(
        "GET", f"/api/messages/{message_id}/stream/", headers=auth(token)
    ) as response:
        async for item in iter_sse(response):
            if isinstance(item, str):
                continue
            events.append(item.data)
            if item.data["type"] == "delta" and not acted:
                acted = True
                if await action() == "drop":
                    return events
            if item.data["type"] == "done":
                break
    return events


async def test_stop_is_cancelled_and_aborts_in_vllm(chat, account, vllm_server: VLLMServer):
    server = chat()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(client, account.token, conversation, f"Talk {planted.FOREVER}")
        message_id = message["id"]

        async def stop() -> None:
            response = await client.post(
                f"/api/messages/{message_id}/cancel/", headers=auth(account.token)
            )
            assert response.status_code == 200, response.text

        events = await first_delta_then(client, account.token, message_id, stop)
        stored = await wait_for_status(client, account.token, message_id)

    assert events[-1]["status"] == "cancelled"
    assert planted.endless(10_000).startswith(text_of(events))
    assert stored["content"] == text_of(events)
    assert await asyncio.to_thread(vllm_server.wait_aborted, f"{message_id}.0")


async def test_abandoned_when_the_reader_leaves_and_aborts_in_vllm(
    chat, account, vllm_server: VLLMServer
):
    server = chat(STREAM_ABANDON_GRACE="0")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(client, account.token, conversation, f"Talk {planted.FOREVER}")

        async def leave() -> str:
            return "drop"

        await first_delta_then(client, account.token, message["id"], leave)
        stored = await wait_for_status(client, account.token, message["id"])

    assert stored["status"] == "abandoned"
    assert planted.endless(10_000).startswith(stored["content"])
    assert await asyncio.to_thread(vllm_server.wait_aborted, f"{message['id']}.0")


async def test_max_tokens_above_the_context_fills_it_and_no_continue_is_offered(
    chat, account, vllm_server: VLLMServer
):
    server = chat()
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        conversation = await create_conversation(client, account.token)
        # A long prompt leaves little room: the answer fills the context soon.
        prompt = "a " * 1900 + f"Talk {planted.FOREVER}"
        message = await post_message(client, account.token, conversation, prompt, max_tokens=4096)
        events = await events_of(client, account.token, message["id"])
        refused = await client.post(
            f"/api/messages/{message['id']}/continue/", headers=auth(account.token)
        )

    done = events[-1]
    assert done["status"] == "truncated"
    assert done["context_full"] is True
    assert done["prompt_tokens"] + done["completion_tokens"] == vllm_server.max_model_len
    assert text_of(events) == planted.endless(len(text_of(events)))
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "context_full"


async def test_a_conversation_longer_than_the_context_says_so(chat, account):
    server = chat()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(client, account.token, conversation, "a " * 2100)
        events = await events_of(client, account.token, message["id"])
    ai = openai.AsyncOpenAI(
        base_url=f"{server.url}/v1", api_key=account.token, max_retries=0, timeout=30
    )
    with pytest.raises(openai.BadRequestError) as refused:
        await ai.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "a " * 2100}]
        )
    await ai.close()
    # Said as a stream says it, and as OpenAI does: the request's fault, not the engine's.
    assert (refused.value.body["code"], refused.value.body["param"]) == ("context_full", "messages")
    assert refused.value.response.headers["x-should-retry"] == "false"

    assert [e["type"] for e in events] == ["start", "error", "done"]
    assert events[1]["error"]["type"] == "ContextFull"
    assert events[-1]["status"] == "error"
    assert events[-1]["error_type"] == "ContextFull"
    assert events[-1]["context_full"] is True


async def test_the_openai_sdk_through_v1(chat, account):
    server = chat()
    ai = openai.AsyncOpenAI(
        base_url=f"{server.url}/v1", api_key=account.token, max_retries=0, timeout=30
    )
    assert [m.id for m in (await ai.models.list()).data] == ["tiny"]
    stream = await ai.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Say hello"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, finish, usage = [], None, None
    async for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    whole = await ai.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Say hello"}]
    )
    await ai.close()

    assert "".join(parts) == planted.NORMAL
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens > 50
    assert whole.choices[0].message.content == planted.NORMAL
