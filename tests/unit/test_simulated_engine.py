from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from streaming.detokenize import Detokenizer
from streaming.engines import simulated
from streaming.engines.base import ChatTurn, EngineChunk, EngineError, EngineRequest, ModelInfo
from streaming.engines.simulated import CORPUS, SimulatedEngine, validate_simulation
from streaming.shape import has_unclosed_code_block, json_validity

FAST = {"ttft_ms": 0, "tokens_per_second": 100_000}
MIXED = (
    "Hello! こんにちは、世界。مرحبا بالعالم. नमस्ते दुनिया। 你好\uff0c世界\uff01\n"
    "👨\u200d👩\u200d👧\u200d👦 🇯🇵🇮🇳 👋🏽 ❤\ufe0f\u200d🔥\n```python\nprint('ok')\n```"
)


def make_request(
    prompt: str = "Tell me something.", simulation: dict[str, Any] | None = None, **fields: Any
) -> EngineRequest:
    return EngineRequest(
        messages=[ChatTurn("user", prompt)],
        request_id="req-1",
        simulation={**FAST, **(simulation or {})},
        **fields,
    )


async def collect(request: EngineRequest) -> list[EngineChunk]:
    return [chunk async for chunk in SimulatedEngine().stream(request)]


def tokens_of(chunks: list[EngineChunk]) -> list[bytes]:
    return [chunk.token_bytes for chunk in chunks if chunk.token_bytes is not None]


def text_of(chunks: list[EngineChunk]) -> str:
    detok = Detokenizer()
    return "".join(detok.feed(token) for token in tokens_of(chunks)) + detok.flush()


def splits_characters(token: bytes) -> bool:
    try:
        token.decode()
    except UnicodeDecodeError:
        return True
    return False


async def test_same_prompt_and_seed_give_the_same_stream() -> None:
    first = await collect(make_request(seed=7))
    second = await collect(make_request(seed=7))
    assert tokens_of(first) == tokens_of(second)
    others = {tuple(tokens_of(await collect(make_request(seed=seed)))) for seed in range(6)}
    assert len(others) > 1


async def test_default_answers_are_whole_corpus_documents_of_realistic_length() -> None:
    for seed in range(12):
        chunks = await collect(make_request(seed=seed))
        assert text_of(chunks) in CORPUS
        assert 100 <= len(chunks) <= 500


def test_corpus_covers_the_hard_cases() -> None:
    joined = "".join(CORPUS)
    for needle in (
        "simulat",
        "```python",
        "こんにちは",
        "مرحبا",
        "नमस्ते",
        "你好",
        "\u200d",
        "🇯🇵",
        "🏽",
    ):
        assert needle in joined
    assert any(json_validity(doc) is True for doc in CORPUS)
    assert not any(has_unclosed_code_block(doc) for doc in CORPUS)
    assert "\ufffd" not in joined


async def test_multibyte_characters_are_split_across_tokens() -> None:
    chunks = await collect(make_request(simulation={"length": 3000}, max_tokens=3000))
    assert len(chunks) == 3000
    assert sum(splits_characters(token) for token in tokens_of(chunks)) > 300
    assert all(1 <= len(token) <= 7 for token in tokens_of(chunks))


async def test_text_parameter_is_reproduced_exactly() -> None:
    chunks = await collect(make_request(simulation={"text": MIXED}))
    assert text_of(chunks) == MIXED
    assert any(splits_characters(token) for token in tokens_of(chunks))
    assert all(chunk.tokens == 1 and chunk.emitted_at is not None for chunk in chunks)


async def test_natural_end_reports_stop_and_usage() -> None:
    prompt = "x" * 41
    chunks = await collect(make_request(prompt, simulation={"text": "short answer"}))
    first, *body, last = chunks
    # The first chunk says what the prompt cost (an answer that ends early records it):
    # 11 tokens of text, 4 of the message's template and 3 of the cue to answer.
    assert first.usage is not None and first.usage.prompt_tokens == 18
    assert all(chunk.finish_reason is None and chunk.usage is None for chunk in body)
    assert (last.finish_reason, last.stop_reason) == ("stop", None)
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (18, len(chunks))


async def test_the_prompt_costs_more_the_more_it_says() -> None:
    """A prompt is counted from its messages' text and what a chat template adds to each:
    a longer one costs more, another message more again, and a short one is never free
    (a prompt of "hi" was reported as 0 tokens)."""

    async def cost(*turns: ChatTurn) -> int:
        request = EngineRequest(
            messages=list(turns), request_id="req-1", simulation={**FAST, "text": "ok"}
        )
        last = (await collect(request))[-1]
        assert last.usage is not None
        return last.usage.prompt_tokens

    short = await cost(ChatTurn("user", "hi"))
    longer = await cost(ChatTurn("user", "hi " * 100))
    with_system = await cost(ChatTurn("system", "Be brief."), ChatTurn("user", "hi"))
    assert 0 < short < longer
    assert short < with_system


async def test_max_tokens_cuts_with_length_on_the_last_token() -> None:
    chunks = await collect(make_request(max_tokens=5))
    assert len(chunks) == 5
    assert [chunk.finish_reason for chunk in chunks] == [None] * 4 + ["length"]
    assert chunks[-1].tokens == 1
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


async def test_exact_fit_is_not_reported_as_truncated() -> None:
    count = len(await collect(make_request(simulation={"text": MIXED})))
    chunks = await collect(make_request(simulation={"text": MIXED}, max_tokens=count))
    assert chunks[-1].finish_reason == "stop"


async def test_length_parameter_continues_the_source_text() -> None:
    chunks = await collect(make_request(simulation={"text": "ab ", "length": 50}))
    assert len(chunks) == 50
    assert text_of(chunks).startswith("ab ab ab ")
    assert chunks[-1].finish_reason == "stop"


async def test_empty_text_ends_with_one_bookkeeping_chunk() -> None:
    chunks = await collect(make_request(simulation={"text": ""}))
    assert len(chunks) == 1
    assert (chunks[0].tokens, chunks[0].token_bytes, chunks[0].finish_reason) == (0, None, "stop")


async def test_continuation_picks_up_where_the_partial_answer_stopped() -> None:
    full = text_of(await collect(make_request(seed=3)))
    partial = full[:57]
    continued = make_request(seed=3, continue_final=True)
    continued.messages.append(ChatTurn("assistant", partial))
    assert partial + text_of(await collect(continued)) == full


async def test_continuation_of_an_exact_text() -> None:
    request = make_request(simulation={"text": MIXED}, continue_final=True)
    request.messages.append(ChatTurn("assistant", MIXED[:20]))
    assert text_of(await collect(request)) == MIXED[20:]


@pytest.mark.parametrize("after", [0, 3])
async def test_error_after_tokens(after: int) -> None:
    stream = SimulatedEngine().stream(make_request(simulation={"error_after_tokens": after}))
    received = []
    with pytest.raises(EngineError) as caught:
        async for chunk in stream:
            received.append(chunk)
    assert len(received) == after
    assert caught.value.as_dict() == {
        "message": "simulated engine failure",
        "type": "InternalServerError",
        "code": 500,
    }


async def test_stall_goes_silent_until_cancelled() -> None:
    stream = SimulatedEngine().stream(make_request(simulation={"stall_after_tokens": 2}))
    assert (await anext(stream)).tokens == 1
    assert (await anext(stream)).tokens == 1
    waiting = asyncio.create_task(anext(stream))
    done, _ = await asyncio.wait({waiting}, timeout=0.05)
    assert not done  # an observation window, not synchronisation: nothing may arrive
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_cancel_while_waiting_for_the_first_token_is_prompt() -> None:
    stream = SimulatedEngine().stream(make_request(simulation={"ttft_ms": 60_000}))
    waiting = asyncio.create_task(anext(stream))
    done, _ = await asyncio.wait({waiting}, timeout=0.02)
    assert not done
    started = time.monotonic()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    # Far below the 60 s the first token was due in, whatever the machine's load.
    assert time.monotonic() - started < 30, "the cancel waited for the first token"
    assert asyncio.all_tasks() == {asyncio.current_task()}  # nothing left running


async def test_aclose_between_tokens_stops_the_stream() -> None:
    request = make_request(simulation={"tokens_per_second": 0.01})
    stream = SimulatedEngine().stream(request)
    assert (await anext(stream)).tokens == 1
    await stream.aclose()
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
    assert asyncio.all_tasks() == {asyncio.current_task()}


class VirtualClock:
    """The running loop's clock, advanced by the engine's sleeps instead of waited on:
    the schedule a run follows, exactly, whatever else the machine is doing."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        loop = asyncio.get_running_loop()
        self.start = self.now = loop.time()
        monkeypatch.setattr(loop, "time", lambda: self.now)
        monkeypatch.setattr(simulated.asyncio, "sleep", self.sleep)

    async def sleep(self, delay: float) -> None:
        self.now += max(delay, 0.0)

    async def run(self, request: EngineRequest, late: dict[int, float]) -> list[float]:
        """When each chunk came, with the consumer busy for ``late[i]`` seconds after
        chunk ``i``."""
        times = []
        async for _chunk in SimulatedEngine().stream(request):
            times.append(self.now - self.start)
            self.now += late.get(len(times) - 1, 0.0)
        return times


async def test_timing_follows_ttft_and_rate_without_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first token at the time to first token, token k k gaps later give or take its
    jitter; a consumer 50 ms late at token 10 gets the tokens due meanwhile at once and
    the rest on the same schedule (lateness does not shift it)."""
    clock = VirtualClock(monkeypatch)
    request = make_request(simulation={"ttft_ms": 40, "tokens_per_second": 500, "length": 50})
    times = await clock.run(request, late={10: 0.05})
    gap, jitter = 1 / 500, SimulatedEngine().jitter / 2
    assert len(times) == 50 and times == sorted(times)
    assert times[0] == pytest.approx(0.040)
    back = times[10] + 0.05
    for k, at in enumerate(times):
        due = 0.040 + k * gap
        if k > 10 and due + gap * jitter < back:
            assert at == pytest.approx(back), f"{k}: due while the consumer was away"
        else:
            assert abs(at - due) <= gap * jitter + 1e-9, f"{k}: on its schedule"
    # Not 50 ms behind it: the lateness was caught up, not carried.
    assert abs(times[-1] - (0.040 + 49 * gap)) <= gap * jitter + 1e-9


async def test_slow_start_delays_the_first_token(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = VirtualClock(monkeypatch)
    request = make_request(simulation={"slow_start_ms": 40, "length": 1})
    assert (await clock.run(request, late={}))[0] == pytest.approx(0.040)


async def test_models_and_health() -> None:
    engine = SimulatedEngine()
    assert (engine.name, engine.model, engine.accepts_simulation) == (
        "simulated",
        "simulated",
        True,
    )
    assert await engine.models() == [ModelInfo("simulated", "simulator")]
    assert await engine.health() is True


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"bogus": 1}, "bogus"),
        ({"ttft_ms": -1}, "ttft_ms"),
        ({"ttft_ms": "fast"}, "ttft_ms"),
        ({"slow_start_ms": float("nan")}, "slow_start_ms"),
        ({"tokens_per_second": 0}, "tokens_per_second"),
        # Finite, but making waits no loop can make (an infinite gap, an infinite start).
        ({"tokens_per_second": 5e-324}, "tokens_per_second"),
        ({"tokens_per_second": 1e12}, "tokens_per_second"),
        ({"ttft_ms": 1e300}, "ttft_ms"),
        ({"slow_start_ms": 1.7e308}, "slow_start_ms"),
        ({"tokens_per_second": True}, "tokens_per_second"),
        ({"length": 0}, "length"),
        ({"length": 2.5}, "length"),
        ({"text": 3}, "text"),
        ({"reasoning": ["x"]}, "reasoning"),
        ({"reasoning_length": 0}, "reasoning_length"),
        ({"tool_call": {"name": ""}}, "tool_call.name"),
        ({"tool_call": {"name": "f", "arguments": {}}}, "tool_call.arguments"),
        ({"error_after_tokens": -1}, "error_after_tokens"),
        ({"stall_after_tokens": "2"}, "stall_after_tokens"),
        ({"seed": None}, "seed"),
    ],
)
def test_validation_names_the_key(params: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        validate_simulation(params)
    with pytest.raises(ValueError, match=key):
        SimulatedEngine().stream(EngineRequest([], "req", simulation=params))


def test_validation_normalises_numbers() -> None:
    assert validate_simulation({"ttft_ms": 5, "length": 3, "seed": -1}) == {
        "ttft_ms": 5.0,
        "length": 3,
        "seed": -1,
    }


async def test_reasoning_streams_as_text_before_the_answer() -> None:
    chunks = await collect(make_request(simulation={"reasoning": MIXED, "text": "Done 🚀"}))
    thinking = [c for c in chunks if c.reasoning]
    assert "".join(c.reasoning for c in thinking) == MIXED
    assert text_of(chunks) == "Done 🚀"
    first_answer = next(i for i, c in enumerate(chunks) if c.token_bytes is not None)
    assert all(chunks.index(c) < first_answer for c in thinking)
    usage = chunks[-1].usage
    assert usage is not None and usage.reasoning_tokens == sum(c.tokens for c in thinking)
    assert usage.completion_tokens == sum(c.tokens for c in chunks)


async def test_a_budget_spent_on_reasoning_ends_inside_it() -> None:
    chunks = await collect(make_request(simulation={"reasoning_length": 40}, max_tokens=10))
    assert chunks[-1].finish_reason == "length"
    assert tokens_of(chunks) == []
    assert sum(c.tokens for c in chunks) == 10
    assert "\ufffd" not in "".join(c.reasoning for c in chunks)


async def test_a_continue_goes_on_with_the_reasoning_or_the_answer() -> None:
    simulation = {"reasoning": "Step one. Step two.", "text": "The answer."}
    mid_reasoning = make_request(simulation=simulation, continue_final=True)
    mid_reasoning.messages.append(ChatTurn("assistant", "", reasoning="Step one."))
    mid_answer = make_request(simulation=simulation, continue_final=True)
    mid_answer.messages.append(ChatTurn("assistant", "The", reasoning="Step one. Step two."))

    resumed = await collect(mid_reasoning)
    assert "".join(c.reasoning for c in resumed) == " Step two."
    assert text_of(resumed) == "The answer."
    answered = await collect(mid_answer)
    assert "".join(c.reasoning for c in answered) == ""
    assert text_of(answered) == " answer."


async def test_a_tool_call_streams_its_name_then_its_arguments() -> None:
    arguments = '{"city": "Paris", "unit": "C"}'
    chunks = await collect(
        make_request(simulation={"tool_call": {"name": "get_weather", "arguments": arguments}})
    )
    pieces = [piece for chunk in chunks for piece in chunk.tool_calls]
    assert pieces[0].name == "get_weather" and pieces[0].id.startswith("call_")
    assert "".join(p.arguments for p in pieces) == arguments
    assert len(pieces) > 2
    assert tokens_of(chunks) == []
    assert chunks[-1].finish_reason == "tool_calls"
