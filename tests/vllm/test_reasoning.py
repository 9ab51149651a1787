"""Reasoning from the real vLLM (the qwen3 reasoning parser) as a channel of its own:
``reasoning`` events over SSE and WebSocket, resumed exactly, persisted apart from the
answer, and ``delta.reasoning`` / ``message.reasoning`` on ``/v1``."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.support.clients import auth, create_conversation, post_message, read_sse, text_of
from tests.support.wsclient import ChatSocket
from tests.vllm import planted
from tests.vllm.conftest import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio]

PONDER = f"Please {planted.PONDER} this"
MARKERS = (planted.THINK_START, planted.THINK_END)


@pytest.fixture
def chat(daphne, vllm_server: VLLMServer):
    return daphne(ENGINE_URL=vllm_server.url, ENGINE_MODEL=vllm_server.model)


def reasoning_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "reasoning")


async def test_reasoning_over_sse_and_websocket_resumed_and_persisted(chat, account):
    async with httpx.AsyncClient(base_url=chat.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(client, account.token, conversation, PONDER)
        whole = [e.data for e in (await read_sse(client, account.token, message["id"])).events]
        # A reader that dropped inside the reasoning resumes exactly after its cursor.
        cursor = next(e["seq"] for e in whole if e["type"] == "reasoning") + 3
        tail = await read_sse(client, account.token, message["id"], last_event_id=cursor)
        resumed = [e.data for e in tail.events]

        ws = await ChatSocket.connect(chat.ws_url, account.token)
        created = await ws.create(conversation, PONDER, {})
        over_ws = await ws.events_until_done(created[-1]["message_id"])
        await ws.close()
        stored = (
            await client.get(f"/api/messages/{message['id']}/", headers=auth(account.token))
        ).json()

    for events in (whole, over_ws):
        kinds = [e["type"] for e in events]
        assert kinds[0] == "start" and kinds[-1] == "done"
        # All the reasoning comes before the answer, and neither holds the other.
        assert kinds.index("delta") > max(i for i, k in enumerate(kinds) if k == "reasoning")
        assert reasoning_of(events) == planted.REASONING
        assert text_of(events) == planted.REASONED_ANSWER
        assert not any(marker in text_of(events) for marker in MARKERS)
    rest = [e for e in whole if e["seq"] > cursor]
    assert (reasoning_of(resumed), text_of(resumed)) == (reasoning_of(rest), text_of(rest))
    assert resumed[0]["seq"] > cursor and resumed[-1] == whole[-1]
    done = whole[-1]
    assert (done["status"], done["ended_in_reasoning"]) == ("complete", False)
    assert done["reasoning_tokens"] > 0
    assert done["reasoning_ttft_ms"] < done["ttft_ms"]
    assert stored["reasoning"] == planted.REASONING
    assert stored["content"] == planted.REASONED_ANSWER
    assert stored["segments"][0]["reasoning_end_offset"] == len(planted.REASONING)


async def continued(client, token: str, message_id: str, after: int) -> list[dict[str, Any]]:
    response = await client.post(f"/api/messages/{message_id}/continue/", headers=auth(token))
    assert response.status_code == 202, response.text
    assert response.json()["after"] == after
    return [e.data for e in (await read_sse(client, token, message_id, after=after)).events]


async def test_cut_while_reasoning_then_continue(chat, account):
    async with httpx.AsyncClient(base_url=chat.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        # <think> and five tokens of reasoning.
        message = await post_message(client, account.token, conversation, PONDER, max_tokens=6)
        first = [e.data for e in (await read_sse(client, account.token, message["id"])).events]
        second = await continued(client, account.token, message["id"], first[-1]["seq"])
        final = (
            await client.get(f"/api/messages/{message['id']}/", headers=auth(account.token))
        ).json()

    done = first[-1]
    assert (done["status"], done["ended_in_reasoning"], text_of(first)) == ("truncated", True, "")
    assert done["ttft_ms"] is None and done["reasoning_ttft_ms"] is not None
    thought = reasoning_of(first)
    assert thought and planted.REASONING.startswith(thought)
    # The Continue sends the reasoning so far; the chat template closes it (as Qwen3's
    # does), so the model answers.
    assert (reasoning_of(second), text_of(second)) == ("", planted.REASONED_ANSWER)
    assert (second[-1]["status"], second[-1]["ended_in_reasoning"]) == ("complete", False)
    assert (final["reasoning"], final["content"]) == (thought, planted.REASONED_ANSWER)


async def test_continue_in_the_answer_of_a_reasoning_model(chat, account):
    async with httpx.AsyncClient(base_url=chat.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(client, account.token, conversation, PONDER, max_tokens=21)
        first = [e.data for e in (await read_sse(client, account.token, message["id"])).events]
        assert first[-1]["status"] == "truncated"
        assert text_of(first) and first[-1]["ended_in_reasoning"] is False
        second = await continued(client, account.token, message["id"], first[-1]["seq"])
        final = (
            await client.get(f"/api/messages/{message['id']}/", headers=auth(account.token))
        ).json()

    assert reasoning_of(second) == ""  # told the reasoning is over: no second thinking
    assert text_of(first) + text_of(second) == planted.REASONED_ANSWER
    assert (final["reasoning"], final["content"]) == (planted.REASONING, planted.REASONED_ANSWER)


async def test_v1_streams_delta_reasoning_and_returns_message_reasoning(chat, account):
    ai = openai.AsyncOpenAI(base_url=f"{chat.url}/v1", api_key=account.token, max_retries=0)
    stream = await ai.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PONDER}], stream=True
    )
    reasoning, content = [], []
    async for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning.append((delta.model_extra or {}).get("reasoning") or "")
            content.append(delta.content or "")
    whole = await ai.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PONDER}]
    )
    await ai.close()

    assert "".join(reasoning) == planted.REASONING
    assert "".join(content) == planted.REASONED_ANSWER
    message = whole.choices[0].message
    assert message.content == planted.REASONED_ANSWER
    assert (message.model_extra or {}).get("reasoning") == planted.REASONING
    assert whole.usage is not None
    details = whole.usage.completion_tokens_details
    assert details is not None and details.reasoning_tokens and details.reasoning_tokens > 0


async def test_a_stop_string_in_the_reasoning_does_not_stop_the_answer(chat, account):
    """Stop strings apply to the answer only (docs/protocol.md): one the reasoning holds
    ("four") ended the answer inside its reasoning, with no answer at all, when vLLM was
    given it; one in the answer still stops it."""
    async with httpx.AsyncClient(base_url=chat.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        kept = await post_message(client, account.token, conversation, PONDER, stop=["four"])
        kept_events = [e.data for e in (await read_sse(client, account.token, kept["id"])).events]
        cut = await post_message(client, account.token, conversation, PONDER, stop=["is 4"])
        cut_events = [e.data for e in (await read_sse(client, account.token, cut["id"])).events]
    assert reasoning_of(kept_events) == planted.REASONING
    assert text_of(kept_events) == planted.REASONED_ANSWER
    assert kept_events[-1]["status"] == "complete"
    assert reasoning_of(cut_events) == planted.REASONING
    assert text_of(cut_events) == planted.REASONED_ANSWER[: planted.REASONED_ANSWER.index("is 4")]
    assert (cut_events[-1]["status"], cut_events[-1]["stop_reason"]) == ("stopped", "is 4")
