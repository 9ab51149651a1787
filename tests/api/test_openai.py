"""The OpenAI-compatible endpoint with the official ``openai`` package as the client,
against a real Daphne process (simulated engine, or the vLLM emulator as the engine)."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.api.calls import assert_error, client, new_conversation, read_to_end
from tests.emulator.server import wait_for_request_end
from tests.support.clients import auth, create_conversation
from tests.support.leaving import ended_status, held_owner, leave, seen_gone, send_request
from tests.support.wsclient import ChatSocket

EMOJI_TEXT = "Family 👨‍👩‍👧‍👦, flag 🇯🇵, thumbs 👍🏽 – and 日本語 too."
FAST = {"ttft_ms": 0, "tokens_per_second": 1000}


def sdk(server, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=token, max_retries=0, timeout=30)


def test_models_and_non_streaming_completion_is_persisted(daphne, account):
    server = daphne()
    ai = sdk(server, account.token)
    assert [m.id for m in ai.models.list().data] == ["simulated"]

    raw = ai.chat.completions.with_raw_response.create(
        model="simulated",
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": [{"type": "text", "text": "Once more, with emoji"}]},
        ],
        max_tokens=200,
        extra_body={"simulation": {"text": EMOJI_TEXT, **FAST}},
    )
    answer = raw.parse()
    assert answer.object == "chat.completion"
    assert answer.model == "simulated"
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == EMOJI_TEXT
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage.completion_tokens > 0
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    message_id = raw.headers["x-message-id"]
    assert answer.id == f"chatcmpl-{message_id}"

    conversation = raw.headers["x-conversation-id"]
    with client(server, account.token) as api:
        stored = api.get(f"/api/conversations/{conversation}/messages/").json()["results"]
        assert [(m["role"], m["content"]) for m in stored] == [
            ("system", "You are terse."),
            ("user", "Say hello"),
            ("assistant", "Hello."),
            ("user", "Once more, with emoji"),
            ("assistant", EMOJI_TEXT),
        ]
        assert stored[-1]["id"] == message_id
        assert stored[-1]["status"] == "complete"
        assert stored[-1]["params"]["max_tokens"] == 200
        title = api.get(f"/api/conversations/{conversation}/").json()["title"]
        assert title == "Say hello", "a conversation is titled by its first question"

    # An answer ended by a stop sequence, before the engine's last chunk, still knows
    # what its prompt cost, in the usage and in its record.
    asked = {
        "model": "simulated",
        "messages": [{"role": "user", "content": "Say hello, then more"}],
        "extra_body": {"simulation": {"text": "Hello there, hello again", **FAST}},
    }
    whole = ai.chat.completions.create(**asked)
    stopped = ai.chat.completions.with_raw_response.create(**asked, stop=["there"])
    cut = stopped.parse()
    assert (cut.choices[0].message.content, cut.choices[0].finish_reason) == ("Hello ", "stop")
    assert cut.usage.prompt_tokens == whole.usage.prompt_tokens > 0
    # "Hello" and " there" were generated: the first token counts though the chunk
    # carrying it also told the prompt's cost.
    assert cut.usage.completion_tokens == 2
    with client(server, account.token) as api:
        record = api.get(f"/api/messages/{stopped.headers['x-message-id']}/").json()
        assert record["termination"]["prompt_tokens"] == whole.usage.prompt_tokens
        assert record["termination"]["completion_tokens"] == 2


def test_streaming_completion_chunks_emoji_usage_and_done(daphne, account):
    server = daphne()
    ai = sdk(server, account.token)
    stream = ai.chat.completions.create(
        model="simulated",
        messages=[{"role": "user", "content": "stream please"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"simulation": {"text": EMOJI_TEXT, "ttft_ms": 0, "tokens_per_second": 200}},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(content) >= 2, "the answer must arrive in several chunks"
    assert "".join(content) == EMOJI_TEXT
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop"
    assert finishes[:-1] == [None] * (len(finishes) - 1)
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1
    assert all(c.object == "chat.completion.chunk" for c in chunks)

    message_id = chunks[0].id.removeprefix("chatcmpl-")
    with client(server, account.token) as api:
        stored = api.get(f"/api/messages/{message_id}/").json()
        assert stored["content"] == EMOJI_TEXT
        assert stored["status"] == "complete"


def test_wire_format_has_role_chunk_in_band_error_and_done(daphne, account):
    """The raw bytes, as any OpenAI client sees them, for a mid-stream engine error."""
    server = daphne()
    body = {
        "model": "simulated",
        "messages": [{"role": "user", "content": "fail halfway"}],
        "stream": True,
        "simulation": {"length": 20, "error_after_tokens": 5, **FAST},
    }
    headers = {"Authorization": f"Bearer {account.token}"}
    with (
        httpx.Client(base_url=server.url, timeout=30) as http,
        http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert response.headers["x-accel-buffering"] == "no"
        frames = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    payloads = [json.loads(f) for f in frames[:-1]]
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "error" in payloads[-1]
    assert payloads[-1]["error"]["message"]
    assert all("choices" in p for p in payloads[:-1])
    assert not any(p["choices"][0]["finish_reason"] for p in payloads[:-1])

    ai = sdk(server, account.token)
    stream = ai.chat.completions.create(
        model="simulated",
        messages=[{"role": "user", "content": "fail again"}],
        stream=True,
        extra_body={"simulation": {"length": 20, "error_after_tokens": 5, **FAST}},
    )
    with pytest.raises(openai.APIError):
        list(stream)
    with pytest.raises(openai.InternalServerError) as failed:
        ai.chat.completions.create(
            model="simulated",
            messages=[{"role": "user", "content": "and without streaming"}],
            extra_body={"simulation": {"length": 20, "error_after_tokens": 5, **FAST}},
        )
    assert failed.value.status_code == 502


def test_x_conversation_id_appends_to_the_callers_conversation(daphne, account, other_account):
    server = daphne()
    ai = sdk(server, account.token)
    with client(server, account.token) as api:
        conversation = new_conversation(api, title="kept", system_prompt="Answer in French.")
    for question in ("first", "second"):
        ai.chat.completions.create(
            model="simulated",
            messages=[{"role": "user", "content": question}],
            extra_headers={"X-Conversation-Id": conversation},
            extra_body={"simulation": {"text": f"re {question}", **FAST}},
        )
    with client(server, account.token) as api:
        stored = api.get(f"/api/conversations/{conversation}/messages/").json()["results"]
        assert [m["content"] for m in stored] == ["first", "re first", "second", "re second"]
        assert api.get("/api/conversations/").json()["count"] == 1

    intruder = sdk(server, other_account.token)
    with pytest.raises(openai.NotFoundError):
        intruder.chat.completions.create(
            model="simulated",
            messages=[{"role": "user", "content": "let me in"}],
            extra_headers={"X-Conversation-Id": conversation},
        )
    with client(server, other_account.token) as api:
        assert api.get("/api/conversations/").json()["count"] == 0
    # Only the spelling the REST paths take names it, as on the WebSocket.
    for spelling in (conversation.upper(), conversation.replace("-", ""), f"{{{conversation}}}"):
        with pytest.raises(openai.NotFoundError) as elsewhere:
            ai.chat.completions.create(
                model="simulated",
                messages=[{"role": "user", "content": "third"}],
                extra_headers={"X-Conversation-Id": spelling},
            )
        assert elsewhere.value.body["param"] == "X-Conversation-Id"
    with client(server, account.token) as api:
        assert api.get(f"/api/conversations/{conversation}/messages/").json()["count"] == 4


def test_errors_are_openai_shaped_and_name_the_field(daphne, account):
    server = daphne()
    with pytest.raises(openai.AuthenticationError):
        sdk(server, "not-a-token").models.list()
    with pytest.raises(openai.AuthenticationError):
        sdk(server, "not-a-token").chat.completions.create(
            model="simulated", messages=[{"role": "user", "content": "hi"}]
        )
    ai = sdk(server, account.token)
    with pytest.raises(openai.NotFoundError) as missing:
        ai.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.body["param"] == "model"
    image = [{"type": "image_url"}]
    reply_last = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    cases = [
        ({"temperature": 5}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [""]}, "stop"),
        ({"n": 2}, "n"),
        ({"extra_body": {"simulation": {"nope": 1}}}, "simulation.nope"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"presence_penalty": -1}, "presence_penalty"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"max_completion_tokens": 5000}, "max_completion_tokens"),
        ({"extra_body": {"top_k": 5}}, "top_k"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "  "}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": image}]}, "messages[0].content[0]"),
        ({"messages": reply_last}, "messages[1].role"),
        ({"messages": []}, "messages"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tool_choice": "always"}, "tool_choice"),
        ({"tool_choice": "auto"}, "tool_choice"),  # no tools to choose from
        ({"messages": [{"role": "tool", "content": "21 C"}]}, "messages[0].tool_call_id"),
        (
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{"id": "c"}]},
                    {"role": "user", "content": "x"},
                ]
            },
            "messages[0].tool_calls[0].function.name",
        ),
    ]

    def called(*calls: dict) -> dict:
        asked = {"role": "assistant", "content": None, "tool_calls": list(calls)}
        return {"messages": [asked, {"role": "user", "content": "x"}]}

    def call(id: str = "c", name: str = "f", arguments: str = "{}", **more: str) -> dict:
        return {"id": id, **more, "function": {"name": name, "arguments": arguments}}

    # A history's calls are held to what the calls they stand for are.
    at = "messages[0].tool_calls"
    cases += [
        (called(call(id="c" * 201)), f"{at}[0].id"),
        (called(call(name="f" * 65)), f"{at}[0].function.name"),
        (called(call(name="no spaces")), f"{at}[0].function.name"),
        (called(call(arguments="x" * 32_001)), f"{at}[0].function.arguments"),
        (called(call(type="custom")), f"{at}[0].type"),
        (called(*[call(id=f"c{i}") for i in range(129)]), at),
    ]
    for overrides, param in cases:
        arguments = {"model": "simulated", "messages": [{"role": "user", "content": "hi"}]}
        arguments.update(overrides)
        with pytest.raises(openai.BadRequestError) as invalid:
            ai.chat.completions.create(**arguments)
        assert invalid.value.body["param"] == param, (overrides, invalid.value.body)
        assert invalid.value.body["field"] == param
        assert invalid.value.body["type"] == "invalid_request_error"
        # What the SDK shows (only the message) names the parameter, as OpenAI's do.
        assert str(invalid.value).startswith(f"Error code: 400 - {param}: "), str(invalid.value)
    with client(server, account.token) as api:
        assert api.get("/api/conversations/").json()["count"] == 0, "refused calls leave nothing"
        refused = api.get("/v1/chat/completions")
        assert_error(refused, 405, "method_not_allowed")
        assert refused.headers["allow"] == "POST"
        # A GET's resource answers HEAD (no body), and says so when refusing another method.
        head = api.head("/v1/models")
        assert (head.status_code, head.content) == (200, b""), head
        assert head.headers["content-type"].startswith("application/json")
        assert api.post("/v1/models", json={}).headers["allow"] == "GET, HEAD"
        # A URL no route takes, under /v1/, in the same shape as every /v1 answer.
        for path in ("/v1/nope", "/v1/chat/completions/"):
            error = assert_error(api.get(path), 404, "not_found")
            assert (error["type"], error["param"]) == ("invalid_request_error", None), error


def test_models_retrieve_and_default_valued_parameters(daphne, account):
    server = daphne()
    ai = sdk(server, account.token)
    model = ai.models.retrieve("simulated")
    assert (model.id, model.object, model.owned_by) == ("simulated", "model", "simulator")
    with pytest.raises(openai.NotFoundError) as missing:
        ai.models.retrieve("org/other-model")
    assert missing.value.body["param"] == "model"
    assert missing.value.body["code"] == "model_not_found"
    assert "org/other-model" in str(missing.value)

    # The values that mean "as if absent" (what many clients send) are accepted, and so
    # is bookkeeping that cannot change the answer.
    answer = ai.chat.completions.create(
        model="simulated",
        messages=[{"role": "user", "content": "defaults"}],
        frequency_penalty=0,
        presence_penalty=0.0,
        response_format={"type": "text"},
        metadata={"team": "a"},
        user="end-user-1",
        extra_body={"simulation": {"text": "ok", **FAST}},
    )
    assert answer.choices[0].message.content == "ok"


def test_closing_the_sdk_stream_aborts_the_engine_request(daphne, account, emulator):
    server = daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model")
    ai = sdk(server, account.token)
    assert [m.id for m in ai.models.list().data] == ["test-model"]
    stream = ai.chat.completions.create(
        model="test-model",
        messages=[{"role": "user", "content": '[[emu {"tokens": 3000, "tokens_per_second": 40}]]'}],
        stream=True,
    )
    received = ""
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            received += chunk.choices[0].delta.content
        if len(received) > 10:
            break
    stream.close()
    message_id = chunk.id.removeprefix("chatcmpl-")

    record = wait_for_request_end(emulator, f"{message_id}.0", timeout=10)
    assert record["outcome"] == "aborted"
    assert record["tokens_sent"] < 3000
    with client(server, account.token) as api:
        events = read_to_end(api, message_id)
        assert events[-1]["status"] == "abandoned"
        stored = api.get(f"/api/messages/{message_id}/").json()
        assert stored["status"] == "abandoned"
        assert stored["termination"]["status"] == "abandoned"
        assert stored["content"].startswith(received)


def test_closing_the_sdk_stream_leaves_an_answer_someone_else_reads(daphne, account):
    """The call's answer is a conversation's message: another reader of it (the page
    following the conversation) keeps it going after the caller closes its stream, and
    reads it to its end."""
    server = daphne()
    ai = sdk(server, account.token)
    stream = ai.chat.completions.create(
        model="simulated",
        messages=[{"role": "user", "content": "a long one"}],
        stream=True,
        extra_body={"simulation": {"length": 60, "tokens_per_second": 40, "ttft_ms": 0}},
    )
    first = next(chunk for chunk in stream if chunk.choices and chunk.choices[0].delta.content)
    message_id = first.id.removeprefix("chatcmpl-")
    events: list[dict] = []
    reading = threading.Event()

    def follow(api: httpx.Client) -> None:
        with api.stream("GET", f"/api/messages/{message_id}/stream/") as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    reading.set()  # attached: its first events are replayed at once
                    if events[-1]["type"] == "done":
                        return

    with client(server, account.token) as api, ThreadPoolExecutor(1) as thread:
        follower = thread.submit(follow, api)
        assert reading.wait(10)
        stream.close()
        follower.result(timeout=20)
        stored = api.get(f"/api/messages/{message_id}/").json()
    assert events[-1]["status"] == "complete"
    assert stored["status"] == "complete"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_a_caller_gone_before_its_answer_exists_leaves_it_unread(daphne, account, stream):
    """A caller that leaves while its call is still making the answer (here: waiting on
    its owner's row, which the test holds): the answer is made all the same, and is
    abandoned as soon as it exists, as when the caller closes its stream. It ran to its
    end for nobody, holding one of the user's answers (a concurrency limit of 1: every
    other call of theirs refused) meanwhile."""
    server = daphne(MAX_CONCURRENT_GENERATIONS_PER_USER="1")
    long = {"length": 200, "tokens_per_second": 50, "ttft_ms": 0}
    body = {
        "model": "simulated",
        "messages": [{"role": "user", "content": "never read"}],
        "stream": stream,
        "simulation": long,
    }
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        conversation = await create_conversation(api, account.token)
        headers = {"Authorization": f"Bearer {account.token}", "X-Conversation-Id": conversation}
        async with held_owner(account.user.pk) as held:
            caller = await send_request(server, "POST", "/v1/chat/completions", headers, body)
            await held.waited_on()
            await leave(caller)
            await seen_gone(api)
        assert await ended_status(conversation) == "abandoned"
        again = await api.post(
            "/v1/chat/completions",
            json={**body, "stream": False, "simulation": FAST},
            headers=headers,
        )
        assert again.status_code == 200, "the user's one answer was free again"


def test_emulator_engine_streams_emoji_intact(daphne, account, emulator):
    server = daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model")
    ai = sdk(server, account.token)
    directive = json.dumps({"text": EMOJI_TEXT, "ttft_ms": 0, "tokens_per_second": 500})
    prompt = f"[[emu {directive}]]"
    stream = ai.chat.completions.create(
        model="test-model", messages=[{"role": "user", "content": prompt}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == EMOJI_TEXT
    answer = ai.chat.completions.create(
        model="test-model", messages=[{"role": "user", "content": prompt}]
    )
    assert answer.choices[0].message.content == EMOJI_TEXT
    assert answer.usage.completion_tokens > 0


def test_a_tool_loop_on_the_simulated_engine(daphne, account):
    server = daphne()
    ai = sdk(server, account.token)
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {}}}
    arguments = '{"zone": "Asia/Tokyo"}'
    raw = ai.chat.completions.with_raw_response.create(
        model="simulated",
        messages=[{"role": "user", "content": "What time is it in Tokyo?"}],
        tools=[tool],
        tool_choice="auto",
        extra_body={"simulation": {"tool_call": {"name": "get_time", "arguments": arguments}}},
    )
    first = raw.parse()
    [call] = first.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_time", arguments)
    assert first.choices[0].finish_reason == "tool_calls"
    assert first.choices[0].message.content is None

    conversation = raw.headers["x-conversation-id"]
    ai.chat.completions.create(
        model="simulated",
        messages=[{"role": "tool", "tool_call_id": call.id, "content": "09:00"}],
        extra_body={"simulation": {"text": "It is nine in Tokyo.", **FAST}},
        extra_headers={"X-Conversation-Id": conversation},
    )
    with client(server, account.token) as api:
        stored = api.get(f"/api/conversations/{conversation}/messages/").json()["results"]
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[1]["tool_calls"][0]["id"] == call.id
    assert (stored[2]["tool_call_id"], stored[2]["content"]) == (call.id, "09:00")
    assert stored[3]["content"] == "It is nine in Tokyo."


def test_an_empty_tool_result_reaches_the_engine(daphne, account, emulator):
    """A tool that printed nothing answered: its result is in the prompt of the answer
    to it and of every later one, after the call it answers."""
    server = daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model")
    ai = sdk(server, account.token)
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    done = '[[emu {"text": "done", "ttft_ms": 0}]]'
    raw = ai.chat.completions.with_raw_response.create(
        model="test-model",
        tools=tools,
        messages=[
            {"role": "user", "content": f"look it up {done}"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": ""},
        ],
    )
    later = ai.chat.completions.with_raw_response.create(
        model="test-model",
        tools=tools,
        messages=[{"role": "user", "content": f"and then? {done}"}],
        extra_headers={"X-Conversation-Id": raw.headers["x-conversation-id"]},
    )
    for response, roles in (
        (raw, ["user", "assistant", "tool"]),
        (later, ["user", "assistant", "tool", "assistant", "user"]),
    ):
        record = wait_for_request_end(emulator, f"{response.headers['x-message-id']}.0")
        asked = record["body"]["messages"]
        assert [m["role"] for m in asked] == roles
        assert asked[2] == {"role": "tool", "content": "", "tool_call_id": "call_1"}


def test_text_parts_reach_the_engine_one_to_a_line(daphne, account, emulator):
    """A message's text parts are joined as vLLM joins them for a text model's template,
    one to a line: a caller's instruction and its text are not run together."""
    server = daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model")
    ai = sdk(server, account.token)
    done = '[[emu {"text": "Bonjour", "ttft_ms": 0}]]'
    raw = ai.chat.completions.with_raw_response.create(
        model="test-model",
        messages=[
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Translate to French:"},
                    {"type": "text", "text": f"Good morning {done}"},
                ],
            },
        ],
    )
    record = wait_for_request_end(emulator, f"{raw.headers['x-message-id']}.0")
    asked = [(m["role"], m["content"]) for m in record["body"]["messages"]]
    question = f"Translate to French:\nGood morning {done}"
    assert asked == [("system", "Be brief."), ("user", question)]
    with client(server, account.token) as api:
        conversation = raw.headers["x-conversation-id"]
        stored = api.get(f"/api/conversations/{conversation}/messages/").json()["results"]
        assert stored[1]["content"] == question


async def test_a_call_with_history_is_titled_by_its_first_question(daphne, account, emulator):
    """A call's earlier turns make a new conversation, which the engine titles by what it
    was first asked, not by the last message, the one it answered: the title request
    quotes the first user message (the emulator writes the title its directive says)."""
    server = daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model")
    tab = await ChatSocket.connect(server.ws_url, account.token)
    await tab.send({"type": "subscribe", "topic": "user"})
    await tab.recv_until("subscribed")
    first = '[[emu {"text": "Rivers of Europe", "ttft_ms": 0}]] Which rivers cross Europe?'
    last = '[[emu {"text": "The Danube is long.", "ttft_ms": 0}]] And the Danube?'
    body = {
        "model": "test-model",
        "messages": [
            {"role": "user", "content": first},
            {"role": "assistant", "content": "The Rhine and the Danube, among others."},
            {"role": "user", "content": last},
        ],
    }
    headers = {"Authorization": f"Bearer {account.token}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        response = await api.post("/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == "The Danube is long."
        conversation = response.headers["x-conversation-id"]
        async with asyncio.timeout(30):
            while True:
                frame = await tab.recv()
                if frame.get("event") == "conversation.updated" and frame["title"] != first:
                    break
        assert (frame["conversation"], frame["title"]) == (conversation, "Rivers of Europe")
        record = await asyncio.to_thread(wait_for_request_end, emulator, f"title-{conversation}")
        [asked] = record["body"]["messages"]
        assert first in asked["content"] and last not in asked["content"]
        assert "The Danube is long." in asked["content"], "with the answer it titles"
        shown = await api.get(f"/api/conversations/{conversation}/", headers=auth(account.token))
        stored = shown.json()
        assert (stored["title"], stored["title_source"]) == ("Rivers of Europe", "model")
    await tab.close()


def test_an_answer_the_engine_refused_is_not_retried_by_the_sdk(daphne, account, emulator):
    """The SDK retries a 502 twice by default; a refusal would be refused again, each
    retry storing one more failed answer, so the server tells it not to."""
    server = daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model")
    ai = openai.OpenAI(base_url=f"{server.url}/v1", api_key=account.token, timeout=30)
    refused = '[[emu {"error_before": 400, "error_message": "no such thing"}]]'
    with pytest.raises(openai.APIStatusError) as raised:
        ai.chat.completions.create(
            model="test-model", messages=[{"role": "user", "content": refused}]
        )
    assert raised.value.status_code == 502
    assert raised.value.response.headers["x-should-retry"] == "false"
    asked = [
        r
        for r in httpx.get(f"{emulator}/_emulator/requests").json()
        if "no such thing" in json.dumps(r["body"])
    ]
    assert len(asked) == 1
    # A failure that may pass is left to the client's retry policy.
    with httpx.Client(base_url=server.url, timeout=30) as http:
        failed = http.post(
            "/v1/chat/completions",
            headers={"Authorization": f"Bearer {account.token}"},
            json={
                "model": "test-model",
                "messages": [{"role": "user", "content": '[[emu {"error_before": 503}]]'}],
            },
        )
    assert failed.status_code == 502
    assert "x-should-retry" not in failed.headers


def test_a_full_conversation_is_not_retried_by_the_sdk(daphne, account):
    """The SDK retries a 409 twice by default; a full conversation stays full, so the
    refusal says not to (each retry would read the whole conversation for nothing), where
    a conflict that passes (an answer still streaming) is left to the client's policy."""
    server = daphne(MAX_CONVERSATION_MESSAGES=3)
    sent: list[str] = []
    http = openai.DefaultHttpxClient(event_hooks={"request": [lambda r: sent.append(r.url.path)]})
    ai = openai.OpenAI(
        base_url=f"{server.url}/v1", api_key=account.token, timeout=30, http_client=http
    )
    asked = {
        "model": "simulated",
        "messages": [{"role": "user", "content": "one"}],
        "extra_body": {"simulation": {"text": "ok", **FAST}},
    }
    raw = ai.chat.completions.with_raw_response.create(**asked)
    conversation = {"X-Conversation-Id": raw.headers["x-conversation-id"]}
    ai.chat.completions.create(**asked, extra_headers=conversation)  # 4 messages: full
    with pytest.raises(openai.ConflictError) as raised:
        ai.chat.completions.create(**asked, extra_headers=conversation)
    assert raised.value.code == "conversation_full"
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert sent == ["/v1/chat/completions"] * 3, "the refusal was not retried"

    with client(server, account.token) as api:
        streaming = new_conversation(api)
        body = {
            "model": "simulated",
            "stream": True,
            "messages": [{"role": "user", "content": "a long one"}],
            "simulation": {"length": 2000, "tokens_per_second": 20, "ttft_ms": 0},
        }
        headers = {"Authorization": f"Bearer {account.token}", "X-Conversation-Id": streaming}
        with api.stream("POST", "/v1/chat/completions", json=body, headers=headers) as answer:
            assert answer.status_code == 200
            busy = api.post("/v1/chat/completions", json={**body, "stream": False}, headers=headers)
            assert (busy.status_code, busy.json()["error"]["code"]) == (409, "conflict")
            assert "x-should-retry" not in busy.headers
