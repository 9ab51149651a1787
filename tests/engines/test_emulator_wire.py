"""Pins the emulator's raw bytes to vLLM's wire format (``docs/vllm-wire.md``).

The fault tests are only as trustworthy as the emulator they run against, so its output
is checked here byte for byte, independent of our client, and against captures of the
real vLLM 0.32 (``tests/emulator/captures``, served without parsers as the emulator is).
"""

from __future__ import annotations

import codecs
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from streaming.engines.simulated import tokenize
from tests.emulator.server import reset_emulator, run_emulator, wait_for_request_end
from tests.emulator.vllm_emulator import DEFAULT_MODEL, VLLM_VERSION

FAST = {"ttft_ms": 0, "tokens_per_second": 0}
M = DEFAULT_MODEL
CAPTURES = Path(__file__).resolve().parents[1] / "emulator" / "captures"


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
    """Two values the emulator chooses itself: the timestamp and the prompt size."""
    created = int(re.search(rb'"created":(\d+)', raw).group(1))  # type: ignore[union-attr]
    prompt = re.search(rb'"prompt_tokens":(\d+)', raw)
    return created, int(prompt.group(1)) if prompt else 0


def fingerprint(raw: bytes) -> str:
    """The third: ``system_fingerprint``, ``vllm-<version>-<8 hex digits>`` per server."""
    return re.search(rb'"system_fingerprint":"(vllm-[0-9.]+-[0-9a-f]{8})"', raw).group(1).decode()  # type: ignore[union-attr]


def chunks_of(raw: bytes) -> list[dict[str, Any]]:
    return [
        json.loads(line[6:]) for line in raw.decode().split("\n\n") if line.startswith("data: {")
    ]


def shape(chunk: Any) -> Any:
    """A chunk's keys, in order, all the way down (values other than objects dropped)."""
    if isinstance(chunk, dict):
        return [(key, shape(value)) for key, value in chunk.items()]
    if isinstance(chunk, list):
        return [shape(item) for item in chunk[:1]]
    return None


def kinds(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """One chunk of each kind (role, text, empty text, finish, usage) as its shape."""
    found: dict[str, Any] = {}
    for chunk in chunks:
        if not chunk["choices"]:
            kind = "usage"
        elif "role" in chunk["choices"][0]["delta"]:
            kind = "role"
        elif chunk["choices"][0]["finish_reason"] is not None:
            kind = "finish"
        else:
            kind = "text" if chunk["choices"][0]["delta"]["content"] else "empty"
        found.setdefault(kind, shape(chunk))
    return found


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
            '"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}',
            *(
                head
                + '"choices":[{"index":0,"delta":{"content":'
                + f'"{text}"'
                + '},"logprobs":null,"finish_reason":null,"token_ids":null}]}'
                for text in contents
            ),
            head + '"choices":[{"index":0,"delta":{"content":""},'
            '"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null}]}',
            head + '"choices":[],"usage":'
            f'{{"prompt_tokens":{prompt},"total_tokens":{prompt + completion},'
            f'"completion_tokens":{completion}}},"system_fingerprint":"{fingerprint(raw)}"}}',
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


def test_chunks_have_the_real_servers_fields_in_its_order(client: httpx.Client) -> None:
    text = "Hi 日本 and 🚀 and more words after it"
    _, length = stream_bytes(client, chat_body({**FAST, "text": text}, max_tokens=12), "w1")
    _, stop = stream_bytes(client, chat_body({**FAST, "text": text}), "w2")
    real_length = kinds(chunks_of((CAPTURES / "vllm-0.32-length.txt").read_bytes()))
    real_stop = kinds(chunks_of((CAPTURES / "vllm-0.32-stop.txt").read_bytes()))

    assert set(real_length) == {"role", "text", "empty", "finish", "usage"}
    assert set(real_stop) == {"role", "text", "finish", "usage"}
    for emulated, real in (
        (kinds(chunks_of(length)), real_length),
        (kinds(chunks_of(stop)), real_stop),
    ):
        assert {kind: emulated.get(kind) for kind in real} == real


def test_default_output_has_empty_chunks_one_token_each(client: httpx.Client) -> None:
    _, raw = stream_bytes(client, chat_body(FAST), "wire-default")

    chunks = chunks_of(raw)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert {"content": ""} in deltas[1:]  # a token that ends inside a character
    text = "".join(d["content"] for d in deltas)
    assert "こんにちは" in text and "🚀" in text and "```python" in text
    usage = chunks[-1]["usage"]
    content_chunks = len(deltas) - 1
    assert usage["completion_tokens"] == content_chunks  # the last one is the end


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
        "token_ids": None,
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
    assert b'"usage"' not in empty_options  # include_usage defaults to false


def test_role_follows_last_message_without_generation_prompt(client: httpx.Client) -> None:
    body = chat_body(FAST, add_generation_prompt=False)
    _, raw = stream_bytes(client, body, "wire-role")

    assert b'"delta":{"role":"user","content":""}' in raw


def test_id_falls_back_to_a_generated_one(client: httpx.Client) -> None:
    with client.stream("POST", "/v1/chat/completions", json=chat_body(FAST)) as response:
        first = next(response.iter_lines())

    assert re.match(r'data: \{"id":"chatcmpl-[0-9a-f]{16}"', first)


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
            "message": "Stream options can only be defined when `stream=True`. "
            "(parameter=stream_options)",
            "type": "BadRequestError",
            "param": "stream_options",
            "code": 400,
        }
    }


def test_continue_final_with_generation_prompt_is_400(client: httpx.Client) -> None:
    body = chat_body(FAST, continue_final_message=True, add_generation_prompt=True)
    response = client.post("/v1/chat/completions", json=body)

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"].startswith(
        "continue_final_message and add_generation_prompt are not compatible."
    )
    assert error["param"] is None


def test_unknown_model_is_404(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json=chat_body(FAST, model="x"))

    assert response.status_code == 404
    assert response.content == (
        b'{"error":{"message":"The model `x` does not exist. Valid aliases: '
        + M.encode()
        + b'.","type":"NotFoundError","param":"model","code":404}}'
    )


def test_wrong_content_type_is_a_bad_request(client: httpx.Client) -> None:
    response = client.post(
        "/v1/chat/completions",
        content=json.dumps(chat_body(FAST)),
        headers={"Content-Type": "text/plain"},
    )

    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": "1 validation error:\n  Unsupported Media Type: Only 'application/json' "
            "is allowed",
            "type": "Bad Request",
            "param": None,
            "code": 400,
        }
    }


def test_validation_errors_name_the_body_field(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json={"model": M})

    error = response.json()["error"]
    assert (response.status_code, error["type"], error["param"]) == (
        400,
        "Bad Request",
        "body.messages",
    )


# --- the context ----------------------------------------------------------------------------


def test_max_tokens_over_the_whole_context_is_a_400(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json=chat_body(FAST, max_tokens=4097))

    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "max_tokens=4097 cannot be greater than max_model_len=4096. Please request "
        "fewer output tokens. (parameter=max_tokens, value=4097)",
        "type": "BadRequestError",
        "param": "max_tokens",
        "code": 400,
    }


def test_a_prompt_that_leaves_too_little_room_is_served_to_the_end() -> None:
    with run_emulator(max_model_len=40) as base_url, httpx.Client(base_url=base_url) as client:
        body = chat_body({**FAST, "tokens": 100}, max_tokens=40)
        _, raw = stream_bytes(client, body, "wire-fit")

    chunks = chunks_of(raw)
    usage = chunks[-1]["usage"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 40


def test_a_prompt_as_long_as_the_context_or_longer_is_a_400() -> None:
    with run_emulator(max_model_len=40) as base_url, httpx.Client(base_url=base_url) as client:
        words = "a " * 100
        longer = client.post(
            "/v1/chat/completions",
            json=chat_body(None, messages=[{"role": "user", "content": words}]),
        )
        prompt = longer.json()["error"]["message"].split("at least ")[1].split(" ")[0]
        # The emulator counts 3 + 4 + ceil(chars / 4) prompt tokens: make exactly 40.
        exact = client.post(
            "/v1/chat/completions",
            json=chat_body(None, messages=[{"role": "user", "content": "x" * ((40 - 7) * 4)}]),
        )

    assert longer.status_code == 400 and int(prompt) > 40
    assert longer.json()["error"]["param"] == "input_tokens"
    assert exact.status_code == 400
    assert exact.json()["error"] == {
        "message": "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
        "type": "BadRequestError",
        "param": "max_tokens",
        "code": 400,
    }


# --- ends the engine decides ----------------------------------------------------------------


@pytest.mark.parametrize("reason", ["abort", "repetition"])
def test_engine_side_ends_are_normal_finish_chunks(client: httpx.Client, reason: str) -> None:
    directive = {**FAST, "text": "one two three", f"{reason}_after_tokens": 1}
    response, raw = stream_bytes(client, chat_body(directive), f"wire-{reason}")

    chunks = chunks_of(raw)
    assert response.status_code == 200
    assert chunks[-2]["choices"][0]["finish_reason"] == reason
    assert "usage" in chunks[-1]
    assert raw.endswith(b"data: [DONE]\n\n")


def test_a_dead_engine_core_errors_in_band_then_500_then_exits() -> None:
    with run_emulator() as base_url, httpx.Client(base_url=base_url, timeout=5) as client:
        directive = {**FAST, "text": "one two three", "die_after_tokens": 1}
        _, raw = stream_bytes(client, chat_body(directive), "wire-die")
        health = client.get("/health").status_code
        after = client.post("/v1/chat/completions", json=chat_body(FAST))
        # The server shuts down after that answer, at its next tick (uvicorn checks every
        # 0.1 s): poll until the connection fails, within a bound far above that.
        deadline = time.monotonic() + 30
        with pytest.raises(httpx.TransportError):
            while time.monotonic() < deadline:
                client.get("/health")

    assert raw.endswith(
        b'data: {"error": {"message": "EngineCore encountered an issue. See stack trace '
        b'(above) for the root cause.", "type": "InternalServerError", "param": null, '
        b'"code": 500}}\n\ndata: [DONE]\n\n'
    )
    assert health == 503
    assert after.status_code == 500
    assert after.json()["error"]["type"] == "InternalServerError"


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
    assert list(choice["message"]) == [
        "role",
        "content",
        "refusal",
        "annotations",
        "audio",
        "function_call",
        "reasoning",
    ]
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
