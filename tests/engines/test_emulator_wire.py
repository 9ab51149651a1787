"""Pins the emulator's raw bytes to vLLM's wire format (``docs/vllm-wire.md``).

The vLLM client is only as trustworthy as the emulator it is tested against, so the
emulator's output is checked here byte for byte, independent of our client.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from streaming.engines.simulated import tokenize
from tests.emulator.server import reset_emulator, run_emulator, wait_for_request_end
from tests.emulator.vllm_emulator import DEFAULT_MODEL, VLLM_VERSION

FAST = {"ttft_ms": 0, "tokens_per_second": 0}
M = DEFAULT_MODEL


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    with run_emulator() as base_url:
        yield base_url


@pytest.fixture
def client(emulator: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=emulator, timeout=5) as client:
        yield client


def chat_body(directive: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    content = "Hi" if directive is None else f"Hi [[emu {json.dumps(directive)}]]"
    body: dict[str, Any] = {
        "model": M,
        "messages": [{"role": "user", "content": content}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    body.update(fields)
    return body


def stream_bytes(
    client: httpx.Client, body: dict[str, Any], request_id: str
) -> tuple[httpx.Response, bytes]:
    with client.stream(
        "POST", "/v1/chat/completions", json=body, headers={"X-Request-Id": request_id}
    ) as response:
        return response, response.read()


def created_and_prompt(raw: bytes) -> tuple[int, int]:
    """The two values the emulator chooses itself: the timestamp and the prompt size."""
    created = int(re.search(rb'"created":(\d+)', raw).group(1))  # type: ignore[union-attr]
    prompt = re.search(rb'"prompt_tokens":(\d+)', raw)
    return created, int(prompt.group(1)) if prompt else 0


def test_exact_stream_bytes(client: httpx.Client) -> None:
    body = chat_body({**FAST, "text": "Hi🚀", "chunk_tokens": [1]})
    response, raw = stream_bytes(client, body, "wire-1")
    created, prompt = created_and_prompt(raw)

    head = (
        '{"id":"chatcmpl-wire-1","object":"chat.completion.chunk",'
        f'"created":{created},"model":"{M}",'
    )
    # One chunk per token (the simulator's tokenizer): a token that ends inside the emoji
    # carries "" (no complete character yet), the one that completes it carries all of it.
    tokens = tokenize("Hi🚀")
    assert len(tokens) > 2, "the emoji is split across tokens"
    decoder = codecs.getincrementaldecoder("utf-8")()
    contents = [decoder.decode(token) for token in tokens]
    assert "" in contents and contents[-1].endswith("🚀")
    completion = len(tokens) + 1  # + end of sequence
    expected = "".join(
        f"data: {event}\n\n"
        for event in [
            head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            '"logprobs":null,"finish_reason":null}]}',
            *(
                head
                + '"choices":[{"index":0,"delta":{"content":'
                + f'"{text}"'
                + '},"logprobs":null,"finish_reason":null}]}'
                for text in contents
            ),
            head + '"choices":[{"index":0,"delta":{"content":""},'
            '"logprobs":null,"finish_reason":"stop","stop_reason":null}]}',
            head + '"choices":[],"usage":'
            f'{{"prompt_tokens":{prompt},"total_tokens":{prompt + completion},'
            f'"completion_tokens":{completion}}}}}',
            "[DONE]",
        ]
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert raw.decode() == expected
    assert "🚀".encode() in raw  # UTF-8 on the wire, not \\u escapes


def test_only_bare_data_events(client: httpx.Client) -> None:
    _, raw = stream_bytes(client, chat_body(FAST), "wire-bare")

    events = raw.decode().split("\n\n")
    assert events[-1] == ""
    assert all(e.startswith("data: ") and "\n" not in e for e in events[:-1])
    for event in events[:-2]:
        payload = event.removeprefix("data: ")
        assert payload == json.dumps(json.loads(payload), separators=(",", ":"), ensure_ascii=False)


def test_default_output_has_empty_chunks_and_multi_token_chunks(client: httpx.Client) -> None:
    _, raw = stream_bytes(client, chat_body(FAST), "wire-default")

    chunks = [json.loads(e[6:]) for e in raw.decode().split("\n\n")[:-2]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert {"content": ""} in deltas[1:]
    text = "".join(d["content"] for d in deltas)
    assert "こんにちは" in text and "🚀" in text and "```python" in text
    usage = chunks[-1]["usage"]
    content_chunks = len(deltas) - 1
    assert usage["completion_tokens"] > content_chunks  # some chunks carried several tokens


def test_stop_string_is_held_back_then_cut(client: httpx.Client) -> None:
    body = chat_body({**FAST, "text": "one two STOP three", "chunk_tokens": [1]}, stop=[" STOP"])
    _, raw = stream_bytes(client, body, "wire-stop")

    choices = [json.loads(e[6:])["choices"] for e in raw.decode().split("\n\n")[:-2]]
    steps = [(c[0]["delta"].get("content"), c[0]["finish_reason"]) for c in choices if c]
    # " STOP" holds back 4 characters: "one" waits, then is released; the match cuts the rest.
    assert steps == [("", None), ("", None), ("one", None), (" two", "stop")]
    assert choices[-2][0]["stop_reason"] == " STOP"


def test_length_sends_last_text_with_the_reason(client: httpx.Client) -> None:
    body = chat_body({**FAST, "text": "one two three", "chunk_tokens": [1]}, max_tokens=2)
    _, raw = stream_bytes(client, body, "wire-length")

    final = json.loads(raw.decode().split("\n\n")[-4][6:])["choices"][0]
    assert final == {
        "index": 0,
        "delta": {"content": " two"},
        "logprobs": None,
        "finish_reason": "length",
        "stop_reason": None,
    }


def test_max_completion_tokens_wins_over_max_tokens(client: httpx.Client) -> None:
    directive = {**FAST, "text": "one two three", "chunk_tokens": [1]}
    body = chat_body(directive, max_tokens=3, max_completion_tokens=1)
    _, raw = stream_bytes(client, body, "wire-mct")

    assert b'"content":"one"},"logprobs":null,"finish_reason":"length"' in raw


def test_in_band_error_uses_json_dumps_spacing(client: httpx.Client) -> None:
    directive = {**FAST, "text": "one two", "chunk_tokens": [1], "error_after_tokens": 1}
    _, raw = stream_bytes(client, chat_body(directive, error_message="x"), "wire-err")

    assert raw.endswith(
        b'data: {"error": {"message": "emulated engine error", "type": "BadRequestError", '
        b'"param": null, "code": 400}}\n\ndata: [DONE]\n\n'
    )
    assert b'"content":"one"' in raw
    assert b'"usage"' not in raw


def test_error_at_zero_tokens_comes_before_the_role_chunk(client: httpx.Client) -> None:
    _, raw = stream_bytes(client, chat_body({**FAST, "error_after_tokens": 0}), "wire-err0")

    assert raw.startswith(b'data: {"error": {')


def test_usage_chunk_only_with_stream_options(client: httpx.Client) -> None:
    body = chat_body(FAST)
    del body["stream_options"]
    _, without = stream_bytes(client, body, "wire-nousage")
    _, empty_options = stream_bytes(client, chat_body(FAST, stream_options={}), "wire-empty")

    assert b'"usage"' not in without
    assert b'"choices":[],"usage"' in empty_options  # include_usage defaults to true


def test_role_follows_last_message_without_generation_prompt(client: httpx.Client) -> None:
    body = chat_body(FAST, add_generation_prompt=False)
    _, raw = stream_bytes(client, body, "wire-role")

    assert b'"delta":{"role":"user","content":""}' in raw


def test_id_falls_back_to_a_generated_one(client: httpx.Client) -> None:
    with client.stream("POST", "/v1/chat/completions", json=chat_body(FAST)) as response:
        first = next(response.iter_lines())

    assert re.match(r'data: \{"id":"chatcmpl-[0-9a-f]{32}"', first)


def test_drop_closes_without_done(emulator: str) -> None:
    body = chat_body({**FAST, "text": "one two three", "chunk_tokens": [1], "drop_after_tokens": 1})
    received = b""
    with (
        httpx.Client(base_url=emulator, timeout=5) as client,
        pytest.raises(httpx.RemoteProtocolError),
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        for part in response.iter_raw():
            received += part

    assert b'"content":"one"' in received
    assert b"[DONE]" not in received


# --- errors before the stream ---------------------------------------------------------------


def test_stream_options_without_stream_is_400(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json=chat_body(FAST, stream=False))

    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": "Stream options can only be defined when `stream=True`.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    }


def test_continue_final_with_generation_prompt_is_400(client: httpx.Client) -> None:
    body = chat_body(FAST, continue_final_message=True, add_generation_prompt=True)
    response = client.post("/v1/chat/completions", json=body)

    assert response.status_code == 400
    assert "Cannot set both `continue_final_message`" in response.json()["error"]["message"]


def test_unknown_model_is_404(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json=chat_body(FAST, model="x"))

    assert response.status_code == 404
    assert response.content == (
        b'{"error":{"message":"The model `x` does not exist.","type":"NotFoundError",'
        b'"param":null,"code":404}}'
    )


def test_wrong_content_type_is_415(client: httpx.Client) -> None:
    response = client.post(
        "/v1/chat/completions",
        content=json.dumps(chat_body(FAST)),
        headers={"Content-Type": "text/plain"},
    )

    assert response.status_code == 415
    assert response.json()["error"]["code"] == 415


def test_bad_directive_is_400(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json=chat_body({"no_such_key": 1}))

    assert response.status_code == 400
    assert "invalid emulator directive" in response.json()["error"]["message"]


def test_api_key_401_is_bare() -> None:
    with run_emulator(api_key="k") as base_url, httpx.Client(base_url=base_url) as client:
        denied = client.post("/v1/chat/completions", json=chat_body(FAST))
        allowed = client.post(
            "/v1/chat/completions",
            json=chat_body(FAST),
            headers={"Authorization": "Bearer k"},
        )
        health = client.get("/health")

    assert (denied.status_code, denied.content) == (401, b'{"error":"Unauthorized"}')
    assert allowed.status_code == 200
    assert health.status_code == 200  # only /v1 is guarded


# --- non-streaming and other endpoints ------------------------------------------------------


def test_non_streaming_completion(client: httpx.Client) -> None:
    body = chat_body({**FAST, "text": "Hello 🚀"}, stream=False)
    del body["stream_options"]
    response = client.post("/v1/chat/completions", json=body, headers={"X-Request-Id": "ns-1"})

    data = response.json()
    assert response.status_code == 200
    assert (data["id"], data["object"], data["model"]) == ("chatcmpl-ns-1", "chat.completion", M)
    choice = data["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == "Hello 🚀"
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", None)
    # The emoji is split across tokens; + 1 for the end of sequence.
    assert data["usage"]["completion_tokens"] == len(tokenize("Hello 🚀")) + 1 > 3


def test_health_models_version(client: httpx.Client) -> None:
    health = client.get("/health")
    models = client.get("/v1/models").json()
    version = client.get("/version").json()

    assert (health.status_code, health.content) == (200, b"")
    assert models["object"] == "list"
    card = models["data"][0]
    assert (card["id"], card["object"], card["owned_by"]) == (M, "model", "vllm")
    assert card["max_model_len"] == 4096
    assert version == {"version": VLLM_VERSION}


# --- records --------------------------------------------------------------------------------


def test_client_close_is_recorded_as_aborted(client: httpx.Client, emulator: str) -> None:
    body = chat_body({"ttft_ms": 0, "tokens_per_second": 200, "tokens": 1000})
    with client.stream(
        "POST", "/v1/chat/completions", json=body, headers={"X-Request-Id": "wire-abort"}
    ) as response:
        next(response.iter_lines())

    record = wait_for_request_end(emulator, "wire-abort", timeout=2)
    assert record["outcome"] == "aborted"
    assert record["tokens_sent"] < 1000
    assert record["headers"]["x-request-id"] == "wire-abort"
    assert record["body"]["messages"][0]["role"] == "user"


def test_records_list_and_reset(client: httpx.Client, emulator: str) -> None:
    stream_bytes(client, chat_body(FAST), "wire-listed")
    listed = client.get("/_emulator/requests").json()
    reset_emulator(emulator)

    assert "wire-listed" in [r["request_id"] for r in listed]
    assert client.get("/_emulator/requests").json() == []
    assert client.get("/_emulator/requests/wire-listed").status_code == 404
