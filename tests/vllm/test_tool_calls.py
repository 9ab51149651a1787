"""Tool calls from the real vLLM (the hermes tool-call parser): a tool loop through
``/v1`` with the openai SDK as the client, every turn persisted, and tools as message
params on our own protocol (``tool_call`` events)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.support.clients import auth, create_conversation, post_message, read_sse
from tests.vllm import planted
from tests.vllm.conftest import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio]

QUESTION = "What is the weather in Paris?"


@pytest.fixture
def chat(daphne, vllm_server: VLLMServer):
    return daphne(ENGINE_URL=vllm_server.url, ENGINE_MODEL=vllm_server.model)


async def test_a_tool_loop_through_v1_with_every_turn_persisted(chat, account):
    ai = openai.AsyncOpenAI(base_url=f"{chat.url}/v1", api_key=account.token, max_retries=0)
    messages: list[dict] = [{"role": "user", "content": QUESTION}]
    raw = await ai.chat.completions.with_raw_response.create(
        model="tiny", messages=messages, tools=[planted.WEATHER_TOOL], stream=True
    )
    conversation = raw.headers["x-conversation-id"]
    pieces, finish, content = [], None, ""
    async for chunk in raw.parse():
        if chunk.choices:
            pieces.extend(chunk.choices[0].delta.tool_calls or [])
            content += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert content == ""
    assert pieces[0].id and pieces[0].type == "function"
    assert pieces[0].function.name == planted.TOOL_NAME
    arguments = "".join(p.function.arguments or "" for p in pieces)
    assert json.loads(arguments) == {"city": "Paris"}
    call_id = pieces[0].id

    # The app runs the tool and hands the result back, in the same conversation.
    result = json.dumps({"sky": "sunny"})
    follow_up = [{"role": "tool", "tool_call_id": call_id, "content": result}]
    answer = await ai.chat.completions.create(
        model="tiny",
        messages=follow_up,
        tools=[planted.WEATHER_TOOL],
        extra_headers={"X-Conversation-Id": conversation},
    )
    await ai.close()
    assert answer.choices[0].message.content == planted.AFTER_TOOL
    assert answer.choices[0].finish_reason == "stop"

    async with httpx.AsyncClient(base_url=chat.url, timeout=30) as client:
        stored = (
            await client.get(
                f"/api/conversations/{conversation}/messages/", headers=auth(account.token)
            )
        ).json()["results"]
    assert [(m["role"], m["content"]) for m in stored] == [
        ("user", QUESTION),
        ("assistant", ""),
        ("tool", result),
        ("assistant", planted.AFTER_TOOL),
    ]
    call = stored[1]["tool_calls"][0]
    assert (call["id"], call["function"]["name"]) == (call_id, planted.TOOL_NAME)
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert stored[1]["termination"]["finish_reason"] == "tool_calls"
    assert stored[1]["status"] == "complete"
    assert stored[2]["tool_call_id"] == call_id


async def test_tools_as_message_params_stream_tool_call_events(chat, account):
    async with httpx.AsyncClient(base_url=chat.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, QUESTION, tools=[planted.WEATHER_TOOL]
        )
        events = [e.data for e in (await read_sse(client, account.token, message["id"])).events]

    calls = [e for e in events if e["type"] == "tool_call"]
    assert calls[0]["name"] == planted.TOOL_NAME and calls[0]["id"]
    assert "".join(e["arguments"] for e in calls) == planted.TOOL_ARGUMENTS
    assert {e["index"] for e in calls} == {0}
    assert not [e for e in events if e["type"] == "delta" and e["text"]]
    assert (events[-1]["status"], events[-1]["finish_reason"]) == ("complete", "tool_calls")
