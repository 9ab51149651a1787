"""Two models behind two servers: the simulated engine (the default) and the real vLLM
(``ENGINE_MODELS``). Each conversation's answers come from its model, a message may
choose another, and ``/v1/models`` lists both."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.support.clients import auth, create_conversation, post_message, read_sse, text_of
from tests.vllm import planted
from tests.vllm.conftest import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio]

SIMULATED = "An answer from the simulator, not from the tiny model."


async def test_each_conversation_answers_from_its_model(daphne, account, vllm_server: VLLMServer):
    server = daphne(ENGINE_MODELS=json.dumps({vllm_server.model: vllm_server.url}))
    ai = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=account.token, max_retries=0)
    listed = [m.id for m in (await ai.models.list()).data]
    from_v1 = await ai.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Say hello"}]
    )
    await ai.close()
    simulation = {"text": SIMULATED, "ttft_ms": 0, "tokens_per_second": 500}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        on_tiny = await create_conversation(client, account.token, model="tiny")
        on_default = await create_conversation(client, account.token)
        tiny = await post_message(client, account.token, on_tiny, "Say hello")
        simulated = await post_message(
            client, account.token, on_default, "Say hello", simulation=simulation
        )
        # A message may choose another model than its conversation's (in a conversation
        # of its own: a question never follows an answer still streaming).
        also_default = await create_conversation(client, account.token)
        response = await client.post(
            f"/api/conversations/{also_default}/messages/",
            json={"content": "Say hello", "model": "tiny"},
            headers=auth(account.token),
        )
        assert response.status_code == 201, response.text
        chosen = response.json()["message"]
        answers = {}
        for name, message in (("tiny", tiny), ("simulated", simulated), ("chosen", chosen)):
            answers[name] = [
                e.data for e in (await read_sse(client, account.token, message["id"])).events
            ]
        unknown = await client.post(
            "/api/conversations/", json={"model": "no-such-model"}, headers=auth(account.token)
        )

    assert listed == ["simulated", "tiny"]
    assert from_v1.choices[0].message.content == planted.NORMAL
    assert text_of(answers["tiny"]) == text_of(answers["chosen"]) == planted.NORMAL
    assert text_of(answers["simulated"]) == SIMULATED
    assert [answers[n][0]["model"] for n in ("tiny", "simulated", "chosen")] == [
        "tiny",
        "simulated",
        "tiny",
    ]
    assert (tiny["model"], simulated["model"], chosen["model"]) == ("tiny", "simulated", "tiny")
    assert unknown.status_code == 400
    assert unknown.json()["error"]["field"] == "model"
