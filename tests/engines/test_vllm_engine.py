"""VLLMEngine against the vLLM emulator over real sockets.

Run without Django: ``.venv/bin/pytest tests/engines -p no:django -q``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from streaming.engines.base import (
    ChatTurn,
    EngineChunk,
    EngineContextFull,
    EngineError,
    EngineRequest,
    EngineTimeout,
    EngineUnavailable,
    ModelInfo,
)
from streaming.engines.simulated import tokenize
from streaming.engines.vllm import VLLMEngine, _ChunkParser, _error_from_body, _no_room
from tests.emulator.server import await_request_end, run_emulator
from tests.emulator.vllm_emulator import DEFAULT_MODEL, DEFAULT_TEXT

FAST = {"ttft_ms": 0, "tokens_per_second": 0}


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    with run_emulator() as base_url:
        yield base_url


@pytest.fixture
async def engine(emulator: str):
    engine = VLLMEngine(emulator, DEFAULT_MODEL, read_timeout=5.0)
    yield engine
    await engine.aclose()


def make_request(
    directive: dict[str, Any] | None = None, *, prompt: str = "Say something", **fields: Any
) -> EngineRequest:
    content = prompt if directive is None else f"{prompt} [[emu {json.dumps(directive)}]]"
    fields.setdefault("messages", [ChatTurn("user", content)])
    return EngineRequest(request_id=f"test-{uuid.uuid4().hex[:12]}", **fields)


async def collect(engine: VLLMEngine, request: EngineRequest) -> list[EngineChunk]:
    return [chunk async for chunk in engine.stream(request)]


async def collect_until_error(
    engine: VLLMEngine, request: EngineRequest
) -> tuple[list[EngineChunk], EngineError]:
    chunks: list[EngineChunk] = []
    with pytest.raises(EngineError) as caught:
        async for chunk in engine.stream(request):
            chunks.append(chunk)
    return chunks, caught.value


async def record_of(base_url: str, request_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base_url) as client:
        return (await client.get(f"/_emulator/requests/{request_id}")).json()


async def set_health(base_url: str, healthy: bool) -> None:
    async with httpx.AsyncClient(base_url=base_url) as client:
        response = await client.post("/_emulator/health", json={"healthy": healthy})
        response.raise_for_status()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- chunk parsing -------------------------------------------------------------------------


async def test_default_stream_yields_text_then_one_final_chunk(engine: VLLMEngine) -> None:
    chunks = await collect(engine, make_request(FAST))

    assert "".join(c.text for c in chunks) == DEFAULT_TEXT
    # role and empty-content chunks are folded away: every chunk but the last has text
    assert all(c.text for c in chunks[:-1])
    assert [c.finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    final = chunks[-1]
    assert (final.finish_reason, final.stop_reason) == ("stop", None)
    assert final.usage is not None
    assert final.usage.completion_tokens == len(tokenize(DEFAULT_TEXT)) + 1  # + EOS
    assert final.usage.prompt_tokens > 0
    assert sum(c.tokens for c in chunks) == final.usage.completion_tokens


async def test_empty_content_chunk_is_folded_into_the_next_text(engine: VLLMEngine) -> None:
    # "🚀" is several byte tokens: vLLM sends "" until the last, then the whole character.
    chunks = await collect(engine, make_request({**FAST, "text": "🚀!", "chunk_tokens": [1]}))

    emoji = len(tokenize("🚀"))
    assert emoji > 1
    assert [(c.text, c.tokens) for c in chunks[:-1]] == [("🚀", emoji), ("!", 1)]
    assert (chunks[-1].text, chunks[-1].finish_reason, chunks[-1].tokens) == ("", "stop", 1)


async def test_multi_token_chunks_are_reconciled_with_usage(engine: VLLMEngine) -> None:
    request = make_request({**FAST, "text": "one two three four five six", "chunk_tokens": [3]})
    chunks = await collect(engine, request)

    assert [c.text for c in chunks] == ["one two three", " four five six", ""]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 7
    assert sum(c.tokens for c in chunks) == 7


async def test_stop_strings_are_the_generations_not_the_engines(
    engine: VLLMEngine, emulator: str
) -> None:
    """vLLM is not given the stop strings: it matches them on its raw output, reasoning
    included, where they must not apply. The generation cuts the answer (its tests)."""
    request = make_request(
        {**FAST, "text": "one two STOP three", "chunk_tokens": [1]}, stop=["STOP"]
    )
    chunks = await collect(engine, request)

    assert "".join(c.text for c in chunks) == "one two STOP three"
    assert "stop" not in (await record_of(emulator, request.request_id))["body"]


async def test_stop_token_id_reason_is_an_int(engine: VLLMEngine) -> None:
    chunks = await collect(engine, make_request({**FAST, "text": "ok", "stop_token_id": 151645}))

    assert (chunks[-1].finish_reason, chunks[-1].stop_reason) == ("stop", 151645)


async def test_length_finish_carries_the_last_text(engine: VLLMEngine) -> None:
    request = make_request(
        {**FAST, "text": "one two three four", "chunk_tokens": [1]}, max_tokens=3
    )
    chunks = await collect(engine, request)

    assert [c.text for c in chunks] == ["one", " two", " three"]
    assert (chunks[-1].finish_reason, chunks[-1].stop_reason) == ("length", None)
    assert sum(c.tokens for c in chunks) == 3


async def test_abort_finish_reason_is_passed_on(engine: VLLMEngine) -> None:
    request = make_request({**FAST, "text": "one two three", "abort_after_tokens": 1})
    chunks = await collect(engine, request)

    assert chunks[-1].finish_reason == "abort"


# --- what we send ---------------------------------------------------------------------------


async def test_request_body_and_request_id(engine: VLLMEngine, emulator: str) -> None:
    request = make_request(
        FAST, max_tokens=64, temperature=0.5, top_p=0.9, seed=7, stop=["\n\n", "END"]
    )
    await collect(engine, request)

    record = await record_of(emulator, request.request_id)
    assert record["headers"]["x-request-id"] == request.request_id
    assert record["completion_id"] == f"chatcmpl-{request.request_id}"
    body = record["body"]
    assert body["model"] == DEFAULT_MODEL
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert (body["max_completion_tokens"], body["max_tokens"]) == (64, 64)
    assert (body["temperature"], body["top_p"], body["seed"]) == (0.5, 0.9, 7)
    assert "stop" not in body  # the generation's to match, on the answer only
    assert "continue_final_message" not in body


async def test_unset_sampling_fields_are_not_sent(engine: VLLMEngine, emulator: str) -> None:
    request = make_request(FAST)
    await collect(engine, request)

    body = (await record_of(emulator, request.request_id))["body"]
    assert not {"temperature", "top_p", "seed", "stop"} & body.keys()


async def test_continue_final_sends_both_flags(engine: VLLMEngine, emulator: str) -> None:
    partial = "Hello! This is the vLLM"
    request = make_request(
        messages=[
            ChatTurn("user", f"Say something [[emu {json.dumps(FAST)}]]"),
            ChatTurn("assistant", partial),
        ],
        continue_final=True,
    )
    chunks = await collect(engine, request)

    body = (await record_of(emulator, request.request_id))["body"]
    assert body["continue_final_message"] is True
    assert body["add_generation_prompt"] is False
    assert body["messages"][-1] == {"role": "assistant", "content": partial}
    # Past its reasoning: Qwen3's template and vLLM's qwen3 parser take what follows as
    # answer, not reasoning.
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "".join(c.text for c in chunks) == DEFAULT_TEXT[len(partial) :]


async def test_connections_are_reused(engine: VLLMEngine, emulator: str) -> None:
    first, second = make_request(FAST), make_request(FAST)
    await collect(engine, first)
    await collect(engine, second)

    # Same client address = same TCP connection: the stream was read to its end.
    assert (await record_of(emulator, first.request_id))["client"] == (
        (await record_of(emulator, second.request_id))["client"]
    )


async def test_base_url_may_end_in_v1(emulator: str) -> None:
    engine = VLLMEngine(f"{emulator}/v1/", DEFAULT_MODEL)
    try:
        assert await engine.health()
        assert (await collect(engine, make_request(FAST)))[-1].finish_reason == "stop"
    finally:
        await engine.aclose()


# --- errors ---------------------------------------------------------------------------------


async def test_http_400_before_stream(engine: VLLMEngine) -> None:
    request = make_request({"error_before": 400, "error_message": "bad prompt"})
    chunks, error = await collect_until_error(engine, request)

    assert chunks == []
    assert type(error) is EngineError
    assert (error.message, error.type, error.code) == ("bad prompt", "BadRequestError", 400)


async def test_max_tokens_is_clamped_to_the_context(engine: VLLMEngine, emulator: str) -> None:
    request = make_request({**FAST, "tokens": 5}, max_tokens=100_000)
    chunks = await collect(engine, request)

    body = (await record_of(emulator, request.request_id))["body"]
    assert body["max_tokens"] == body["max_completion_tokens"] == 4096
    assert chunks[-1].finish_reason == "stop"


async def test_an_answer_that_fills_the_context_says_so() -> None:
    with run_emulator(max_model_len=60) as base_url:
        engine = VLLMEngine(base_url, DEFAULT_MODEL)
        try:
            filled = await collect(engine, make_request({**FAST, "tokens": 500}, max_tokens=500))
            short = await collect(engine, make_request({**FAST, "tokens": 500}, max_tokens=5))
        finally:
            await engine.aclose()

    final = filled[-1]
    assert final.finish_reason == "length" and final.context_full
    assert final.usage is not None
    assert final.usage.prompt_tokens + final.usage.completion_tokens == 60
    assert short[-1].finish_reason == "length" and not short[-1].context_full


@pytest.mark.parametrize("words", [200, 208])  # longer than the context, exactly as long
async def test_a_prompt_that_leaves_no_room_is_context_full(words: int) -> None:
    with run_emulator(max_model_len=60) as base_url:
        engine = VLLMEngine(base_url, DEFAULT_MODEL)
        try:
            # The emulator counts 3 + 4 + ceil(chars / 4) prompt tokens.
            prompt = "x" * (words if words != 208 else (60 - 7) * 4)
            _, error = await collect_until_error(engine, make_request(FAST, prompt=prompt))
        finally:
            await engine.aclose()

    assert type(error) is EngineContextFull
    assert (error.type, error.code) == ("ContextFull", "context_full")
    assert "context" in error.message


async def test_a_bad_request_type_is_read_as_openais_name(engine: VLLMEngine) -> None:
    directive = {**FAST, "error_after_tokens": 1, "error_type": "Bad Request"}
    _, error = await collect_until_error(engine, make_request(directive))

    assert (error.type, error.code) == ("BadRequestError", 400)


async def test_unknown_model_is_a_404(emulator: str) -> None:
    engine = VLLMEngine(emulator, "no/such-model")
    try:
        _, error = await collect_until_error(engine, make_request(FAST))
    finally:
        await engine.aclose()

    assert error.as_dict() == {
        "message": f"The model `no/such-model` does not exist. Valid aliases: {DEFAULT_MODEL}.",
        "type": "NotFoundError",
        "code": 404,
    }


async def test_bare_unauthorized_401_and_a_working_key() -> None:
    with run_emulator(api_key="sekrit") as base_url:
        anonymous = VLLMEngine(base_url, DEFAULT_MODEL)
        keyed = VLLMEngine(base_url, DEFAULT_MODEL, api_key="sekrit")
        try:
            _, error = await collect_until_error(anonymous, make_request(FAST))
            chunks = await collect(keyed, make_request(FAST))
        finally:
            await anonymous.aclose()
            await keyed.aclose()

    assert (error.message, error.type, error.code) == ("Unauthorized", "AuthenticationError", 401)
    assert chunks[-1].finish_reason == "stop"


async def test_non_json_error_body(engine: VLLMEngine, caplog) -> None:
    """A page that is no error object (a proxy's, with an address in it) is told to the
    operators' log, never to the record the user reads."""
    page = "<h1>Internal Server Error</h1> from 10.0.0.7:8000"
    request = make_request({"error_before": 500, "error_body": page})
    _, error = await collect_until_error(engine, request)

    assert (error.type, error.code) == ("InternalServerError", 500)
    assert error.message == "HTTP 500: a body that is no error object"
    assert "10.0.0.7" in caplog.text


async def test_gateway_errors_mean_unavailable(engine: VLLMEngine) -> None:
    request = make_request({"error_before": 502, "error_body": "<html>Bad Gateway 10.0.0.7</html>"})
    _, error = await collect_until_error(engine, request)

    assert isinstance(error, EngineUnavailable)
    assert "502" in error.message and "10.0.0.7" not in error.message


async def test_in_band_error_after_text(engine: VLLMEngine, emulator: str) -> None:
    request = make_request(
        {
            **FAST,
            "text": "one two three four",
            "chunk_tokens": [1],
            "error_after_tokens": 2,
            "error_message": "engine exploded",
            "error_type": "InternalServerError",
            "error_code": 500,
        }
    )
    chunks, error = await collect_until_error(engine, request)

    assert [c.text for c in chunks] == ["one", " two"]
    assert type(error) is EngineError
    assert error.as_dict() == {
        "message": "engine exploded",
        "type": "InternalServerError",
        "code": 500,
    }
    assert (await record_of(emulator, request.request_id))["outcome"] == "completed"


async def test_dropped_connection_is_engine_disconnected(engine: VLLMEngine, emulator: str) -> None:
    request = make_request(
        {**FAST, "text": "one two three four", "chunk_tokens": [1], "drop_after_tokens": 2}
    )
    chunks, error = await collect_until_error(engine, request)

    assert [c.text for c in chunks] == ["one", " two"]
    assert (error.type, error.code) == ("EngineDisconnected", "disconnected")
    assert (await record_of(emulator, request.request_id))["outcome"] == "dropped"


async def test_stall_is_engine_timeout_and_aborts_upstream(emulator: str) -> None:
    engine = VLLMEngine(emulator, DEFAULT_MODEL, read_timeout=0.3)
    request = make_request(
        {**FAST, "text": "one two three four", "chunk_tokens": [1], "stall_after_tokens": 2}
    )
    try:
        chunks, error = await collect_until_error(engine, request)
    finally:
        await engine.aclose()

    assert [c.text for c in chunks] == ["one", " two"]
    assert isinstance(error, EngineTimeout)
    assert (error.type, error.code) == ("EngineTimeout", "engine_timeout")
    async with asyncio.timeout(2):
        record = await await_request_end(emulator, request.request_id)
    assert (record["outcome"], record["stalled"]) == ("aborted", True)


async def test_slow_first_token_within_read_timeout_is_fine(emulator: str) -> None:
    engine = VLLMEngine(emulator, DEFAULT_MODEL, read_timeout=1.0)
    try:
        chunks = await collect(engine, make_request({"ttft_ms": 300, "text": "late"}))
    finally:
        await engine.aclose()

    assert "".join(c.text for c in chunks) == "late"


async def test_unreachable_port_is_engine_unavailable() -> None:
    engine = VLLMEngine(f"http://127.0.0.1:{free_port()}", DEFAULT_MODEL)
    try:
        _, error = await collect_until_error(engine, make_request(FAST))
        healthy = await engine.health()
    finally:
        await engine.aclose()

    assert isinstance(error, EngineUnavailable)
    assert error.code == "engine_unavailable"
    assert healthy is False


# --- cancellation ---------------------------------------------------------------------------


async def test_closing_the_iterator_aborts_the_request(engine: VLLMEngine, emulator: str) -> None:
    request = make_request({"ttft_ms": 0, "tokens_per_second": 100, "tokens": 500})
    stream = engine.stream(request)
    first = await anext(stream)
    await anext(stream)
    await stream.aclose()

    async with asyncio.timeout(2):
        record = await await_request_end(emulator, request.request_id)
    assert first.text
    assert record["outcome"] == "aborted"
    assert record["tokens_sent"] < 50
    assert record["ended_at"] - record["started_at"] < 1.0


async def test_cancelling_the_task_aborts_the_request(engine: VLLMEngine, emulator: str) -> None:
    request = make_request({"ttft_ms": 0, "tokens_per_second": 100, "tokens": 500})
    got_one = asyncio.Event()

    async def consume() -> None:
        async for _ in engine.stream(request):
            got_one.set()

    task = asyncio.create_task(consume())
    await got_one.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    async with asyncio.timeout(2):
        record = await await_request_end(emulator, request.request_id)
    assert record["outcome"] == "aborted"


async def test_cancel_before_first_token_aborts_too(engine: VLLMEngine, emulator: str) -> None:
    request = make_request({"ttft_ms": 5000, "text": "never"})
    task = asyncio.create_task(collect(engine, request))
    async with asyncio.timeout(2):
        await _wait_until_seen(emulator, request.request_id)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    async with asyncio.timeout(2):
        record = await await_request_end(emulator, request.request_id)
    assert (record["outcome"], record["chunks_sent"]) == ("aborted", 0)


async def _wait_until_seen(base_url: str, request_id: str) -> None:
    async with httpx.AsyncClient(base_url=base_url) as client:
        while True:
            if (await client.get(f"/_emulator/requests/{request_id}")).status_code == 200:
                return
            await asyncio.sleep(0.01)


# --- models and health ----------------------------------------------------------------------


async def test_models(engine: VLLMEngine) -> None:
    assert await engine.models() == [ModelInfo(DEFAULT_MODEL, "vllm", 4096)]


async def test_health_follows_the_server(engine: VLLMEngine, emulator: str) -> None:
    assert await engine.health() is True
    await set_health(emulator, False)
    try:
        assert await engine.health() is False
    finally:
        await set_health(emulator, True)


# --- shapes the emulator does not produce ---------------------------------------------------


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return json.dumps({"id": "chatcmpl-x", "choices": [choice], **extra})


def test_continuous_usage_stats_give_exact_token_counts() -> None:
    parser = _ChunkParser()
    events = [
        _chunk({"role": "assistant", "content": ""}, usage={"completion_tokens": 0}),
        _chunk({"content": "ab"}, usage={"completion_tokens": 3}),
        _chunk({"content": ""}, usage={"completion_tokens": 4}),
        _chunk({"content": "c"}, usage={"completion_tokens": 5}),
        _chunk({"content": ""}, "stop", usage={"completion_tokens": 6}),
    ]
    chunks = [c for event in events for c in parser.feed(event)]
    final = parser.finish()

    assert [(c.text, c.tokens) for c in chunks] == [("ab", 3), ("c", 2)]
    assert (final.finish_reason, final.tokens, final.usage) == ("stop", 1, None)


def test_the_first_output_says_what_the_prompt_cost() -> None:
    """With continuous usage stats the prompt's tokens come on every chunk: told once, on
    the first chunk yielded, so an answer stopped before vLLM's last chunk records them."""
    parser = _ChunkParser()
    usage = {"prompt_tokens": 37, "completion_tokens": 0}
    events = [
        _chunk({"role": "assistant", "content": ""}, usage=usage),
        _chunk({"content": "ab"}, usage={**usage, "completion_tokens": 2}),
        _chunk({"content": "c"}, usage={**usage, "completion_tokens": 3}),
    ]
    first, second = [c for event in events for c in parser.feed(event)]

    assert first.usage is not None
    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (37, 2)
    assert second.usage is None


def test_stream_without_finish_reason_is_a_disconnect() -> None:
    parser = _ChunkParser()
    parser.feed(_chunk({"content": "partial"}))

    with pytest.raises(EngineError) as caught:
        parser.finish()
    assert caught.value.type == "EngineDisconnected"


@pytest.mark.parametrize(
    ("body", "status", "expected"),
    [
        # vLLM < 0.10: flat error object
        (
            {"object": "error", "message": "m", "type": "BadRequestError", "code": 400},
            400,
            ("m", "BadRequestError", 400),
        ),
        ({"detail": "Not Found"}, 404, ("Not Found", "NotFoundError", 404)),
        ({"error": "Unauthorized"}, 401, ("Unauthorized", "AuthenticationError", 401)),
        (None, 500, ("HTTP 500: a body that is no error object", "InternalServerError", 500)),
        # vLLM 0.32's validation errors: an HTTP reason phrase for a type
        (
            {"error": {"message": "m", "type": "Bad Request", "param": "body.seed", "code": 400}},
            400,
            ("m", "BadRequestError", 400),
        ),
        (
            {"error": {"message": "m", "type": "Not Found", "code": 404}},
            404,
            ("m", "NotFoundError", 404),
        ),
        (
            {"error": {"message": "m", "type": "Internal Server Error", "code": 500}},
            500,
            ("m", "InternalServerError", 500),
        ),
    ],
)
def test_error_body_shapes(body: Any, status: int, expected: tuple[str, str, int]) -> None:
    error = _error_from_body(body, status=status, text="oops")

    assert (error.message, error.type, error.code) == expected


@pytest.mark.parametrize(
    ("param", "no_room"),
    [("max_tokens", True), (["max_tokens"], False), ({"max_tokens": 1}, False), (7, False)],
)
def test_only_a_400_naming_a_context_param_is_context_full(param: Any, no_room: bool) -> None:
    """The engine's ``param`` is read as a name only when it is one: anything else (an
    upstream that is not vLLM) is an ordinary 400, never a crash."""
    body = {"error": {"message": "the maximum context length is 128 tokens", "param": param}}

    assert _no_room(body) is no_room


# --- real captures --------------------------------------------------------------------------

CAPTURES = Path(__file__).resolve().parents[1] / "emulator" / "captures"


def replay(name: str, context: int | None = None) -> tuple[list[EngineChunk], EngineChunk]:
    """Feed a real vLLM 0.32 capture through the client's chunk parser."""
    parser = _ChunkParser(context)
    chunks = []
    for line in (CAPTURES / name).read_text().split("\n\n"):
        if line.startswith("data: {"):
            chunks.extend(parser.feed(line[len("data: ") :]))
    return chunks, parser.finish()


def test_a_real_length_cut_inside_a_character() -> None:
    chunks, final = replay("vllm-0.32-length.txt", context=2048)

    text = "".join(c.text for c in chunks) + final.text
    assert text.endswith("日本") and "\ufffd" not in text  # 語 was cut after one byte
    assert sum(c.tokens for c in chunks) + final.tokens == 30
    assert (final.finish_reason, final.context_full) == ("length", False)


def test_real_reasoning_is_read_from_delta_reasoning() -> None:
    chunks, final = replay("vllm-0.32-reasoning.txt", context=2048)

    reasoning = "".join(c.reasoning for c in chunks)
    answer = "".join(c.text for c in chunks) + final.text
    assert reasoning == "Two and two make four, so the sum is four."
    assert answer == "The answer is 4."
    assert final.usage is not None and final.usage.reasoning_tokens == 17
    assert sum(c.tokens for c in chunks) + final.tokens == final.usage.completion_tokens


def test_reasoning_content_is_read_where_reasoning_is_absent() -> None:
    parser = _ChunkParser()
    events = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"reasoning_content": "hm"}),
        _chunk({"content": "yes"}, "stop"),
    ]
    chunks = [c for event in events for c in parser.feed(event)]

    assert [(c.reasoning, c.text) for c in chunks] == [("hm", "")]
    assert parser.finish().text == "yes"


async def test_a_continue_sends_the_partial_answers_reasoning(
    engine: VLLMEngine, emulator: str
) -> None:
    request = make_request(
        messages=[
            ChatTurn("user", f"Say something [[emu {json.dumps(FAST)}]]"),
            ChatTurn("assistant", "", reasoning="Let me think"),
        ],
        continue_final=True,
    )
    await collect(engine, request)

    body = (await record_of(emulator, request.request_id))["body"]
    assert body["messages"][-1] == {"role": "assistant", "content": "", "reasoning": "Let me think"}
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_a_real_tool_call_streams_its_name_then_its_arguments() -> None:
    chunks, final = replay("vllm-0.32-tool-call.txt", context=2048)

    pieces = [piece for chunk in [*chunks, final] for piece in chunk.tool_calls]
    assert pieces[0].name == "get_weather" and pieces[0].id.startswith("chatcmpl-tool-")
    assert "".join(p.arguments for p in pieces) == '{"city":"Paris"}'
    assert {p.index for p in pieces} == {0}
    assert final.finish_reason == "tool_calls"
    assert "".join(c.text for c in chunks) + final.text == ""


async def test_tools_tool_calls_and_tool_results_are_sent(
    engine: VLLMEngine, emulator: str
) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    request = make_request(
        messages=[
            ChatTurn("user", f"Weather? [[emu {json.dumps(FAST)}]]"),
            ChatTurn("assistant", "", tool_calls=(call,)),
            ChatTurn("tool", '{"sky":"sunny"}', tool_call_id="c1"),
        ],
        tools=[tool],
        tool_choice="auto",
    )
    await collect(engine, request)

    body = (await record_of(emulator, request.request_id))["body"]
    assert (body["tools"], body["tool_choice"]) == ([tool], "auto")
    assert body["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": '{"sky":"sunny"}', "tool_call_id": "c1"},
    ]
