"""What ``POST /v1/chat/completions`` refuses, and how: every refusal is OpenAI's error
object naming the field as the caller spelled it, and leaves nothing stored."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai

from tests.api.calls import client, new_conversation

FAST = {"ttft_ms": 0, "tokens_per_second": 1000}
ASK = [{"role": "user", "content": "hi"}]
TOOL_WITHOUT_CALL = (
    "messages with role 'tool' must be a response to a preceding message with 'tool_calls'"
)
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}


def v1(
    api: httpx.Client,
    token: str,
    body: Any,
    *,
    content_type: str | None = "application/json",
    conversation: str | None = None,
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    if conversation is not None:
        headers["X-Conversation-Id"] = conversation
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return api.post("/v1/chat/completions", content=raw, headers=headers)


def answered(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    return response.json()


def refused(response: httpx.Response, param: str | None, status: int = 400) -> dict[str, Any]:
    """OpenAI's error object (``type``, ``param``) on our shape (``field``, ``message``
    starting with the field's name), as the endpoint answers every refusal."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error", error
    assert error["status"] == status
    if param is not None:
        assert error["field"] == param
        assert error["message"].startswith(f"{param}: "), error
    return error


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "simulated", "messages": ASK, "simulation": {"text": "ok", **FAST}, **fields}


def stored_params(api: httpx.Client, response: httpx.Response) -> dict[str, Any]:
    message = answered(response)["id"].removeprefix("chatcmpl-")
    return api.get(f"/api/messages/{message}/").json()["params"]


def conversation_count(api: httpx.Client) -> int:
    return api.get("/api/conversations/").json()["count"]


def test_token_limits_null_means_absent_and_errors_name_the_field_as_sent(daphne, account):
    server = daphne()
    with client(server, account.token) as api:
        sent = v1(api, account.token, body(max_completion_tokens=None, max_tokens=7))
        assert stored_params(api, sent)["max_tokens"] == 7
        sent = v1(api, account.token, body(max_completion_tokens=9, max_tokens=None))
        assert stored_params(api, sent)["max_tokens"] == 9
        sent = v1(api, account.token, body(max_completion_tokens=None, max_tokens=None))
        assert "max_tokens" not in stored_params(api, sent)
        before = conversation_count(api)

        over = refused(
            v1(api, account.token, body(max_completion_tokens=5000)), "max_completion_tokens"
        )
        assert "4096" in over["message"]
        refused(v1(api, account.token, body(max_tokens=5000)), "max_tokens")
        refused(
            v1(api, account.token, body(max_tokens=5000, max_completion_tokens=10**9)),
            "max_completion_tokens",
        )
        usage = {"stream": True, "stream_options": {"include_usage": "yes"}}
        refused(v1(api, account.token, body(**usage)), "stream_options.include_usage")
        assert conversation_count(api) == before


INTEGERS = [
    ("n", True),
    ("n", 1.0),
    ("max_tokens", 100.0),
    ("max_tokens", True),
    ("max_completion_tokens", 100.0),
    ("max_completion_tokens", False),
    ("seed", 7.0),
    ("seed", True),
    ("seed", "7"),
]


def test_integer_fields_take_integers_only(daphne, account):
    server = daphne()
    with client(server, account.token) as api:
        for field, value in INTEGERS:
            error = refused(v1(api, account.token, body(**{field: value})), field)
            assert error["message"] == f"{field}: must be an integer", (field, value)
        assert conversation_count(api) == 0
        answered(v1(api, account.token, body(n=1, max_completion_tokens=5, seed=-3)))


def test_a_number_no_encoder_can_write_back_is_refused_where_it_is(daphne, account):
    """Integers beyond 64 bits and numbers past a double's range are refused by the
    body's parser, naming the value as the caller spelled its path."""
    server = daphne()
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 2**64}}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    maximum = "tools[0].function.parameters.properties.n.maximum"
    with client(server, account.token) as api:
        for fields, param in (({"seed": 2**70}, "seed"), ({"tools": tools}, maximum)):
            error = refused(v1(api, account.token, body(**fields)), param)
            assert error["message"].endswith("is outside -2^63..2^64-1"), error
        raw = json.dumps(body(temperature=1.0)).replace(
            '"temperature": 1.0', '"temperature": 1e999'
        )
        error = refused(v1(api, account.token, raw.encode()), "temperature")
        assert error["message"] == "temperature: number 1e999 is too large", error
        assert conversation_count(api) == 0


def test_every_message_is_held_to_the_length_limit(daphne, account):
    server = daphne()
    long = "x" * 200_000
    cases = [
        ([{"role": "user", "content": long}, {"role": "assistant", "content": "b"}, *ASK], 0),
        ([{"role": "system", "content": long}, *ASK], 0),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": long}, *ASK], 1),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
                {"role": "assistant", "content": [{"type": "text", "text": "y" * 32_001}]},
                *ASK,
            ],
            3,
        ),
    ]
    with client(server, account.token) as api:
        for messages, index in cases:
            error = refused(
                v1(api, account.token, body(messages=messages)), f"messages[{index}].content"
            )
            assert "32000" in error["message"]
        assert conversation_count(api) == 0
        fits = [{"role": "user", "content": "z" * 32_000}, {"role": "assistant", "content": "b"}]
        answered(v1(api, account.token, body(messages=[*fits, *ASK])))


def test_a_tool_result_must_answer_a_preceding_tool_call(daphne, account):
    server = daphne()
    called = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    cases = [
        ([{"role": "tool", "tool_call_id": "call_1", "content": "09:00"}], 0),
        ([{"role": "tool", "tool_call_id": "call_1", "content": "09:00"}, *ASK], 0),
        (
            [
                {"role": "user", "content": "time?"},
                called,
                {"role": "tool", "tool_call_id": "call_2", "content": "09:00"},
            ],
            2,
        ),
        (
            [
                {"role": "user", "content": "time?"},
                {"role": "assistant", "content": "I will not call it"},
                {"role": "tool", "tool_call_id": "call_1", "content": "09:00"},
            ],
            2,
        ),
        # The call comes after its result: not preceding.
        (
            [
                {"role": "user", "content": "time?"},
                {"role": "tool", "tool_call_id": "call_1", "content": "09:00"},
                called,
                *ASK,
            ],
            1,
        ),
    ]
    with client(server, account.token) as api:
        for messages, index in cases:
            error = refused(
                v1(api, account.token, body(messages=messages)), f"messages[{index}].tool_call_id"
            )
            assert error["message"] == f"messages[{index}].tool_call_id: {TOOL_WITHOUT_CALL}"
        assert conversation_count(api) == 0

        # A result answering a call earlier in the same request is a tool loop's next turn.
        messages = [
            {"role": "user", "content": "time?"},
            called,
            {"role": "tool", "tool_call_id": "call_1", "content": "09:00"},
        ]
        first = v1(api, account.token, body(messages=messages))
        conversation = first.headers["x-conversation-id"]
        answered(first)

        # Continuing a stored conversation: its stored calls precede the new messages.
        again = {"role": "tool", "tool_call_id": "call_1", "content": "09:01"}
        answered(v1(api, account.token, body(messages=[again]), conversation=conversation))
        answered(v1(api, account.token, body(messages=[again, *ASK]), conversation=conversation))
        unknown = {"role": "tool", "tool_call_id": "call_9", "content": "09:02"}
        error = refused(
            v1(api, account.token, body(messages=[unknown]), conversation=conversation),
            "messages[0].tool_call_id",
        )
        assert TOOL_WITHOUT_CALL in error["message"]
        refused(
            v1(api, account.token, body(messages=[*ASK, unknown]), conversation=conversation),
            "messages[1].tool_call_id",
        )
        # A conversation that holds no call at all (made through the REST API).
        plain = new_conversation(api)
        refused(
            v1(api, account.token, body(messages=[again]), conversation=plain),
            "messages[0].tool_call_id",
        )
        assert conversation_count(api) == 2
        stored = api.get(f"/api/conversations/{conversation}/messages/").json()["results"]
        assert [m["role"] for m in stored] == [
            *("user", "assistant", "tool", "assistant"),
            *("tool", "assistant"),
            *("tool", "user", "assistant"),
        ]
        assert api.get(f"/api/conversations/{plain}/messages/").json()["count"] == 0


def test_a_tool_that_printed_nothing_answered_and_the_title_is_the_first_question(daphne, account):
    """OpenAI takes an empty tool output as a result; a question may not be empty. A new
    conversation made by a call that carries its history is titled by its first
    question, not by the last message (a tool's output, say)."""
    server = daphne()
    called = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    with client(server, account.token) as api:
        messages = [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "what time is it?\nin Paris"},
            called,
            {"role": "tool", "tool_call_id": "call_1", "content": ""},
        ]
        first = v1(api, account.token, body(messages=messages))
        answered(first)
        conversation = first.headers["x-conversation-id"]
        titled = api.get(f"/api/conversations/{conversation}/").json()
        assert titled["title"] == "what time is it?"
        stored = api.get(f"/api/conversations/{conversation}/messages/").json()["results"]
        assert (stored[-2]["role"], stored[-2]["content"]) == ("tool", "")
        for elsewhere in ("00000000-0000-0000-0000-000000000000", "not-an-id"):
            refused(
                v1(api, account.token, body(), conversation=elsewhere),
                "X-Conversation-Id",
                status=404,
            )
        for empty in ("", "  "):
            refused(
                v1(api, account.token, body(messages=[{"role": "user", "content": empty}])),
                "messages[0].content",
            )
        assert conversation_count(api) == 1


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"top_logprobs": 0}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"modalities": ["audio"]}, "modalities"),
    ({"modalities": []}, "modalities"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"verbosity": "low"}, "verbosity"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"moderation": {"mode": "block"}}, "moderation"),
    ({"parallel_tool_calls": False}, "parallel_tool_calls"),
    ({"function_call": "auto"}, "function_call"),
    ({"user": 42}, "user"),
    ({"store": "yes"}, "store"),
    ({"metadata": ["a"]}, "metadata"),
    ({"stream": True, "stream_options": {"include_usage": True, "foo": 1}}, "stream_options.foo"),
]


def test_parameters_that_would_change_the_answer_are_refused(daphne, account):
    server = daphne()
    with client(server, account.token) as api:
        for fields, param in REFUSED:
            refused(v1(api, account.token, body(**fields)), param)

        error = refused(v1(api, account.token, body(foo=1)), "foo")
        assert error["message"] == "foo: Unrecognized request argument supplied: foo"
        error = refused(v1(api, account.token, body(foo=1, bar=None, top_k=5)), "bar")
        assert error["message"] == "bar: Unrecognized request arguments supplied: bar, foo, top_k"
        assert conversation_count(api) == 0


def test_harmless_keys_real_clients_send_are_accepted(daphne, account):
    """Keys that do not change the answer (bookkeeping, caching, billing) are ignored, as
    are the "as if absent" values of the refused ones; the openai SDK sends them as is."""
    server = daphne()
    ai = openai.OpenAI(
        base_url=f"{server.url}/v1", api_key=account.token, max_retries=0, timeout=30
    )
    answer = ai.chat.completions.create(
        model="simulated",
        messages=ASK,
        user="end-user-1",
        metadata={"team": "a"},
        store=True,
        service_tier="auto",
        parallel_tool_calls=True,
        prompt_cache_key="k",
        prompt_cache_retention="24h",
        safety_identifier="hashed",
        prediction={"type": "content", "content": "ok"},
        logit_bias={},
        logprobs=False,
        top_logprobs=None,
        modalities=["text"],
        audio=None,
        verbosity=None,
        n=1,
        extra_body={"simulation": {"text": "ok", **FAST}, "prompt_cache_options": {}},
    )
    assert answer.choices[0].message.content == "ok"
    stream = ai.chat.completions.create(
        model="simulated",
        messages=ASK,
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
        extra_body={"simulation": {"text": "ok", **FAST}},
    )
    assert [c.usage for c in stream][-1].completion_tokens > 0


def test_a_body_not_declared_json_is_415(daphne, account):
    server = daphne()
    with client(server, account.token) as api:
        for content_type in (None, "text/plain", "application/x-www-form-urlencoded", "text/json"):
            response = v1(api, account.token, body(), content_type=content_type)
            error = refused(response, None, status=415)
            assert error["code"] == "unsupported_media_type"
            assert "application/json" in error["message"], error
        assert conversation_count(api) == 0
        for declared in ("application/json; charset=utf-8", "Application/JSON"):
            answered(v1(api, account.token, body(), content_type=declared))
