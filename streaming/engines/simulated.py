"""The simulated engine. IT IS A SIMULATOR, NOT A LANGUAGE MODEL.

It never reads the question: it replays canned text from a built-in corpus, picked by a hash
of the conversation and the seed. It exists so the whole streaming path (detokenization,
stop strings, transports, resume, persistence, metrics) can be developed, tested, demoed and
benchmarked without a GPU, with output that is hard in the ways real output is hard:

- it speaks token *bytes*, like a byte-level BPE engine, in chunks of 1-4 bytes that regularly
  split Japanese, Arabic, Devanagari, Chinese and emoji (ZWJ families, flags, skin tones);
- it has realistic timing: a time to first token, then a steady rate with small jitter,
  scheduled against a monotonic start so it does not drift;
- ``request.simulation`` switches faults on per request (error mid-stream, stall, slow start),
  can make it produce an exact text and can make it reason before it answers, as a
  reasoning model behind vLLM's reasoning parser does (see `validate_simulation`).

Like every engine it leaves stop strings to the generation service.
"""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import itertools
import json
import math
import random
import re
import time
from collections.abc import AsyncGenerator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from streaming.engines.base import (
    EngineChunk,
    EngineError,
    EngineRequest,
    ModelInfo,
    ToolCallDelta,
    Usage,
)
from streaming.storable import UNSTORABLE, is_storable

SEPARATOR = "\n\n"

# Each entry is one self-contained answer of roughly 120-400 tokens.
CORPUS: tuple[str, ...] = (
    "This answer comes from the simulated engine: a deterministic stand-in for a language "
    "model, built so that streaming can be developed and tested without a GPU. It is not a "
    "model and it does not read your question.\n\n"
    "Streaming a response well is mostly about the edges. The first token should arrive "
    "quickly, because time to first token is what people feel as responsiveness. After that, "
    "a steady rhythm matters more than raw speed: a stream that stutters feels slower than one "
    "that is evenly paced, even when both finish at the same moment.\n\n"
    "The other edges are the endings. A response can finish naturally, run out of its token "
    "budget, hit a stop sequence, be cancelled by the reader, or fail halfway through. Each of "
    "those should look different to the person reading, and each should be recorded, so that "
    "a cut-off answer can be continued instead of regenerated from scratch.",
    "Here is a checklist for shipping a streaming endpoint:\n\n"
    "1. Measure time to first token at the client, not at the server.\n"
    "2. Send a heartbeat comment every fifteen seconds so proxies keep the connection open.\n"
    "3. Disable response buffering in every proxy between the model and the browser.\n"
    "4. Hold back partial stop sequences until they either match or fail.\n"
    "5. Never emit half of a multi-byte character.\n\n"
    "And a few things that are easy to forget:\n\n"
    "- Give every event an id, so a dropped connection can resume where it left off.\n"
    "- Record why each response ended: complete, truncated, stopped, cancelled or failed.\n"
    "- Bound the memory a slow reader can pin on the server.\n"
    "- Test with Japanese, Arabic and emoji, not only with English.",
    "Here is a small incremental decoder in Python:\n\n"
    "```python\n"
    "import codecs\n\n\n"
    "class Detokenizer:\n"
    '    """Turn token byte strings into text without splitting characters."""\n\n'
    "    def __init__(self) -> None:\n"
    '        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")\n\n'
    "    def feed(self, token: bytes) -> str:\n"
    "        return self._decoder.decode(token)\n\n"
    "    def flush(self) -> str:\n"
    '        return self._decoder.decode(b"", final=True)\n\n\n'
    'if __name__ == "__main__":\n'
    "    detok = Detokenizer()\n"
    '    parts = [b"caf", b"\\xc3", b"\\xa9"]\n'
    '    print("".join(detok.feed(p) for p in parts) + detok.flush())\n'
    "```\n\n"
    "The decoder keeps an incomplete sequence in its buffer until the next token completes "
    "it, so the reader never sees a replacement character.",
    "{\n"
    '  "engine": "simulated",\n'
    '  "note": "This JSON comes from a simulator, not from a language model.",\n'
    '  "stream": {"ttft_ms": 200, "tokens_per_second": 40, "jitter": 0.2},\n'
    '  "greetings": {\n'
    '    "ja": "こんにちは、世界",\n'
    '    "ar": "مرحبا بالعالم",\n'
    '    "hi": "नमस्ते दुनिया",\n'
    '    "zh": "你好，世界",\n'
    '    "emoji": "👋🏽🌍"\n'
    "  },\n"
    '  "endings": ["complete", "truncated", "stopped", "cancelled", "error", "stalled"],\n'
    '  "checks": [\n'
    '    {"name": "utf8_boundaries", "passed": true},\n'
    '    {"name": "stop_hold_back", "passed": true},\n'
    '    {"name": "resume_after_drop", "passed": true, "replayed_events": 17}\n'
    "  ],\n"
    '  "ratio": 1.04,\n'
    '  "next": null\n'
    "}",
    "こんにちは！これはシミュレーターによる応答で、本物の言語モデルではありません。\n\n"
    "ストリーミングでは、文字が届いた順にすぐ画面へ表示されます。日本語の文字はUTF-8で"
    "三バイトになるため、トークンの境界で一文字が分割されることがよくあります。そのため、"
    "受信側では不完全なバイト列を保持し、文字が完成してから表示する必要があります。\n\n"
    "句読点や括弧「」も同じように扱われます。東京、大阪、京都を巡る旅行の計画を立てるときも、"
    "返答は少しずつ流れてきます。",
    "مرحبا! هذا رد من محرك محاكاة، وليس من نموذج لغوي حقيقي.\n\n"
    "يُكتب النص العربي من اليمين إلى اليسار، وتتصل الحروف ببعضها حسب موقعها في الكلمة. "
    "عند البث، تصل الكلمات جزءًا بعد جزء، وقد ينقسم الحرف الواحد بين رمزين لأن كل حرف "
    "عربي يحتاج إلى بايتين في ترميز UTF-8.\n\n"
    "الأرقام مثل 2024 تُكتب من اليسار إلى اليمين حتى داخل الجملة العربية، وهذا اختبار جيد "
    "لعرض النص ثنائي الاتجاه.",
    "नमस्ते! यह एक सिम्युलेटर का उत्तर है, असली भाषा मॉडल का नहीं।\n\n"
    "हिंदी देवनागरी लिपि में लिखी जाती है। इसमें मात्राएँ और हलंत जैसे संयोजक चिह्न अक्षरों "
    "के साथ जुड़ते हैं, जैसे क्षत्रिय, द्वितीय, श्रृंखला और प्रश्न। स्ट्रीमिंग के समय कोई "
    "मात्रा अलग टोकन में आ सकती है, इसलिए पाठ को बाइट के स्तर पर सही ढंग से जोड़ना "
    "आवश्यक है।\n\n"
    "भारत में बाईस अनुसूचित भाषाएँ हैं, और कई लोग रोज़ दो या तीन भाषाएँ बोलते हैं।",
    "你好！这是模拟引擎生成的回答，不是真正的语言模型。\n\n"
    "流式输出的意思是：模型每生成一小段文字，就立刻发送给浏览器，而不是等整段回答写完。"
    "汉字在 UTF-8 中通常占三个字节，所以一个字常常会被拆到两个词元里。接收端必须先把"
    "不完整的字节留住，等字符完整后再显示，否则屏幕上会出现乱码。\n\n"
    "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。",
    "Emoji are where streaming text breaks most visibly 😅. A family like "
    "👨\u200d👩\u200d👧\u200d👦 is seven code points held together by zero-width joiners; "
    "split it carelessly and the reader sees four separate people for a moment.\n\n"
    "Flags are pairs of regional indicators: 🇯🇵 🇮🇳 🇧🇷 🇪🇬 🇺🇦 🇨🇦. Skin tones modify the "
    "emoji before them: 👋🏽 👍🏿 🙌🏻 🧑🏾\u200d💻 👩🏼\u200d🔬.\n\n"
    "Some sequences combine everything: 🏳\ufe0f\u200d🌈 ❤\ufe0f\u200d🔥 "
    "👩🏽\u200d❤\ufe0f\u200d💋\u200d👨🏻 🧑\u200d🤝\u200d🧑. Every one of them should "
    "appear whole, never as a broken box or a stray joiner 🎉.",
)

# What the simulator "thinks" for ``reasoning_length``, cycled as needed.
REASONING = (
    "The simulator is not reasoning: this is canned text standing in for a reasoning "
    "model's thinking, streamed before the answer so the reasoning channel can be seen. "
    "A real model would weigh the question here, step by step, and then answer it. "
)

_PRETOKEN = re.compile(rb" ?[A-Za-z]+| ?[0-9]{1,3}| ?[\x80-\xff]+|\s+|[^\sA-Za-z0-9\x80-\xff]+")
# Number keys: (lowest, highest). Bounded so that the waits they make are times a loop
# can wait (a rate of 5e-324 made an infinite gap, a delay near 1e308 an infinite start).
MAX_SIMULATED_DELAY_MS = 3_600_000.0
FLOAT_KEYS: dict[str, tuple[float, float]] = {
    "ttft_ms": (0.0, MAX_SIMULATED_DELAY_MS),
    "slow_start_ms": (0.0, MAX_SIMULATED_DELAY_MS),
    "tokens_per_second": (0.001, 1_000_000.0),
}
# Integer keys: (lowest, highest). Counts of tokens are bounded so that a stream stays
# something the engine can make (``itertools.islice`` takes at most ``sys.maxsize``); the
# seed is an int64, as a real engine's is.
MAX_SIMULATED_TOKENS = 10**9
INT_KEYS: dict[str, tuple[int, int]] = {
    "length": (1, MAX_SIMULATED_TOKENS),
    "reasoning_length": (1, MAX_SIMULATED_TOKENS),
    "error_after_tokens": (0, MAX_SIMULATED_TOKENS),
    "stall_after_tokens": (0, MAX_SIMULATED_TOKENS),
    "seed": (-(2**63), 2**63 - 1),
}
TEXT_KEYS = ("text", "reasoning")
_KNOWN_KEYS = (*FLOAT_KEYS, *INT_KEYS, *TEXT_KEYS, "tool_call")


class SimulationError(ValueError):
    """A bad ``request.simulation``: ``key`` is the offending key (``None``: the whole
    object), ``message`` what is wrong with it."""

    def __init__(self, key: str | None, message: str) -> None:
        super().__init__(f"simulation.{key}: {message}" if key else f"simulation: {message}")
        self.key = key
        self.message = message


def validate_simulation(params: dict[str, Any]) -> dict[str, Any]:
    """Check ``request.simulation`` and return a normalised copy, or raise
    ``SimulationError`` naming the key.

    Keys: ``ttft_ms`` / ``slow_start_ms`` (0 to an hour in ms, added together before the
    first token), ``tokens_per_second`` (0.001 to a million), ``length`` (int >= 1:
    tokens to produce, continuing the source text as needed), ``text`` (exact text to
    produce),
    ``error_after_tokens`` / ``stall_after_tokens`` (int >= 0: fail / go silent instead of
    producing that token; no effect if the answer is shorter), ``seed`` (int),
    ``reasoning`` (exact reasoning to stream before the answer) or ``reasoning_length``
    (int >= 1: that many tokens of canned reasoning), ``tool_call`` (``{"name",
    "arguments"}``: after the answer's text, none unless ``text`` is given, call this tool
    and finish with ``tool_calls``). Reasoning and tool-call tokens count against
    ``max_tokens`` and the fault counters like the answer's.
    """
    if not isinstance(params, dict):
        raise SimulationError(None, "must be an object")
    clean: dict[str, Any] = {}
    for key, value in params.items():
        if key in FLOAT_KEYS:
            lowest, highest = FLOAT_KEYS[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise SimulationError(key, "must be a number")
            if not (math.isfinite(value) and lowest <= value <= highest):
                raise SimulationError(key, f"must be a number from {lowest:g} to {highest:g}")
            clean[key] = float(value)
        elif key in INT_KEYS:
            low, high = INT_KEYS[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise SimulationError(key, "must be an integer")
            if not low <= value <= high:
                raise SimulationError(key, f"must be an integer from {low} to {high}")
            clean[key] = value
        elif key == "tool_call":
            clean[key] = _validate_tool_call(value)
        elif key in TEXT_KEYS:
            if not isinstance(value, str):
                raise SimulationError(key, "must be a string")
            if not is_storable(value):
                raise SimulationError(key, UNSTORABLE)
            clean[key] = value
        else:
            known = ", ".join(sorted(_KNOWN_KEYS))
            raise SimulationError(key, f"is not a known key (known: {known})")
    return clean


def _validate_tool_call(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or set(value) - {"name", "arguments"}:
        raise SimulationError("tool_call", 'must be {"name": ..., "arguments": ...}')
    name, arguments = value.get("name"), value.get("arguments", "{}")
    if not isinstance(name, str) or not name or not is_storable(name):
        raise SimulationError("tool_call.name", "must be a non-empty string")
    if not isinstance(arguments, str) or not is_storable(arguments):
        raise SimulationError("tool_call.arguments", "must be a string (of JSON)")
    return {"name": name, "arguments": arguments}


def prompt_token_count(texts: Iterable[str]) -> int:
    """What a prompt of messages with these texts costs in tokens, as the simulator reports
    it and the test emulator of vLLM does too (so both engines agree): about four
    characters a token, rounded up for each message, and what a chat template adds (four
    tokens a message, three for the cue to answer). Counted, not tokenized: a prompt may be
    a whole conversation (millions of characters), and this runs on the event loop."""
    return 3 + sum(4 + math.ceil(len(text) / 4) for text in texts)


def tokenize(text: str, seed: int = 0) -> list[bytes]:
    """``text`` as the simulator's byte tokens, the same for the same ``seed`` (the test
    emulator of vLLM tokenizes with this too, so both split text the same way)."""
    return list(_tokenize([text], random.Random(seed)))


def _tokenize(pieces: Iterable[str], rng: random.Random) -> Iterator[bytes]:
    """Split text into byte tokens the way a byte-level BPE roughly would.

    English words (with their leading space) stay whole up to 7 bytes; everything non-ASCII
    is cut into 1-3 byte chunks without regard to character boundaries (so a 4-byte emoji
    is always split), which is exactly the case a detokenizer must survive.
    """
    for piece in pieces:
        for word in _PRETOKEN.findall(piece.encode()):
            if word[-1] < 0x80 and len(word) <= 7:
                yield word
                continue
            low, high = (1, 3) if word[-1] >= 0x80 else (3, 6)
            start = 0
            while start < len(word):
                size = low + int(rng.random() * (high - low + 1))
                yield word[start : start + size]
                start += size


def _corpus_from(doc: int, offset: int) -> Iterator[tuple[str, bool]]:
    """The endless corpus (documents joined by SEPARATOR, cycling) from ``offset`` chars after
    the start of document ``doc``, as (piece, piece_is_a_document) pairs."""
    cycle = sum(len(text) + len(SEPARATOR) for text in CORPUS)
    offset %= cycle
    for index in itertools.count(doc):
        for piece, is_doc in ((CORPUS[index % len(CORPUS)], True), (SEPARATOR, False)):
            if offset >= len(piece):
                offset -= len(piece)
                continue
            yield piece[offset:], is_doc
            offset = 0


def _tool_call_pieces(call: dict[str, str] | None, key: int) -> list[ToolCallDelta]:
    """A tool call as a tool-call parser streams it: the id and name, then the JSON
    arguments a few characters at a time."""
    if call is None:
        return []
    arguments = call["arguments"]
    pieces = [ToolCallDelta(0, id=f"call_{key:016x}", name=call["name"])]
    pieces += [
        ToolCallDelta(0, arguments=arguments[i : i + 6]) for i in range(0, len(arguments), 6)
    ]
    return pieces


def _reasoning(sim: dict[str, Any], partial: str, partial_reasoning: str) -> str:
    """The reasoning still to produce: none once the answer has begun (a Continue past
    it), else what follows the partial reasoning a Continue was given."""
    if partial:
        return ""
    if "reasoning" in sim:
        text = sim["reasoning"]
    elif "reasoning_length" in sim:
        text = REASONING * (1 + sim["reasoning_length"] // 20)
    else:
        return ""
    return text[len(partial_reasoning) :] if text.startswith(partial_reasoning) else text


def _through_first_document(pieces: Iterator[tuple[str, bool]]) -> Iterator[str]:
    for piece, is_doc in pieces:
        yield piece
        if is_doc:
            return


@dataclass(frozen=True, slots=True)
class _Script:
    """Everything a run needs, decided before the first await so a run is reproducible."""

    tokens: Iterator[bytes]
    reasoning: list[bytes]  # the reasoning's tokens, streamed before ``tokens``
    tool_call: list[ToolCallDelta]  # its pieces, streamed after ``tokens``
    first_delay: float  # seconds from start to the first token
    gap: float  # seconds between tokens
    jitter: Iterator[float]  # per token, as a fraction of ``gap``
    max_tokens: int
    prompt_tokens: int
    error_after: int | None
    stall_after: int | None


class SimulatedEngine:
    """A SIMULATOR, NOT A MODEL: deterministic canned output with realistic streaming timing.

    ``ttft_ms`` and ``tokens_per_second`` are the defaults for requests that do not override
    them in ``request.simulation``; ``jitter`` is the spread of each inter-token gap as a
    fraction of the gap (the schedule itself never drifts).
    """

    name = "simulated"
    model = "simulated"
    accepts_simulation = True

    def __init__(
        self, ttft_ms: float = 200.0, tokens_per_second: float = 40.0, jitter: float = 0.2
    ) -> None:
        if ttft_ms < 0 or tokens_per_second <= 0 or not 0 <= jitter < 1:
            raise ValueError("need ttft_ms >= 0, tokens_per_second > 0 and 0 <= jitter < 1")
        self.ttft_ms = ttft_ms
        self.tokens_per_second = tokens_per_second
        self.jitter = jitter

    def stream(self, request: EngineRequest) -> AsyncGenerator[EngineChunk, None]:
        """Validate now (ValueError), then return the stream; closing it stops at once."""
        return self._run(self._script(request, validate_simulation(request.simulation)))

    async def models(self) -> list[ModelInfo]:
        return [ModelInfo("simulated", "simulator")]

    async def health(self) -> bool:
        return True

    def _script(self, request: EngineRequest, sim: dict[str, Any]) -> _Script:
        turns = request.messages
        partial = partial_reasoning = ""
        if request.continue_final and turns and turns[-1].role == "assistant":
            # Hash the conversation the partial answer was generated for, so the same
            # document is picked and the continuation picks up where the answer stopped.
            partial, partial_reasoning = turns[-1].content, turns[-1].reasoning
            turns = turns[:-1]
        seed = sim.get("seed", request.seed if request.seed is not None else 0)
        prompt = json.dumps([[t.role, t.content] for t in turns], ensure_ascii=False)
        digest = hashlib.sha256(f"{prompt}\x00{seed}".encode()).digest()
        key = int.from_bytes(digest[:8], "big")

        pieces: Iterable[str]
        if "tool_call" in sim and "text" not in sim:
            pieces = ()  # a model that calls a tool says nothing else
        elif "text" in sim:
            text = sim["text"]
            if partial and text.startswith(partial):
                text = text[len(partial) :]
            pieces = itertools.repeat(text) if "length" in sim and text else (text,)
        else:
            corpus = _corpus_from(key % len(CORPUS), len(partial))
            if "length" in sim:
                pieces = (piece for piece, _ in corpus)
            else:
                pieces = _through_first_document(corpus)
        tokens = _tokenize(pieces, random.Random(key))
        if "length" in sim:
            tokens = itertools.islice(tokens, sim["length"])
        thought = _reasoning(sim, partial, partial_reasoning)
        reasoning = list(_tokenize([thought], random.Random(key ^ 1))) if thought else []
        if "reasoning_length" in sim and not partial and not partial_reasoning:
            reasoning = reasoning[: sim["reasoning_length"]]

        timing = random.Random(key ^ 0x5DEECE66D)
        spread = self.jitter
        ttft_ms = sim.get("ttft_ms", self.ttft_ms) + sim.get("slow_start_ms", 0.0)
        return _Script(
            tokens=tokens,
            reasoning=reasoning,
            tool_call=_tool_call_pieces(sim.get("tool_call"), key),
            first_delay=ttft_ms / 1000,
            gap=1 / sim.get("tokens_per_second", self.tokens_per_second),
            jitter=((timing.random() - 0.5) * spread for _ in itertools.count()),
            max_tokens=request.max_tokens,
            prompt_tokens=prompt_token_count(turn.content for turn in request.messages),
            error_after=sim.get("error_after_tokens"),
            stall_after=sim.get("stall_after_tokens"),
        )

    async def _run(self, script: _Script) -> AsyncGenerator[EngineChunk, None]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        # Reasoning first, then the answer; the reasoning goes out as text (whole
        # characters), as an engine's reasoning parser hands it over.
        thinking = len(script.reasoning)
        tokens: Iterator[bytes | ToolCallDelta] = itertools.chain(
            script.reasoning, script.tokens, script.tool_call
        )
        thought = codecs.getincrementaldecoder("utf-8")("replace")
        held = 0  # reasoning tokens that ended inside a character, not yet sent
        upcoming = next(tokens, None)
        emitted = 0
        told = False  # the prompt's tokens, said on the first chunk
        while True:
            # None only when there is nothing to emit at all (empty text, zero budget): the
            # run then ends with one bookkeeping chunk at the time the first token was due.
            token = upcoming if emitted < script.max_tokens else None
            # Absolute schedule: lateness never accumulates, a slow consumer gets a burst.
            due = start + script.first_delay + script.gap * emitted
            if emitted:
                due += script.gap * next(script.jitter)
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if emitted == script.stall_after:
                await asyncio.Future()  # silent until the consumer gives up and cancels
            if emitted == script.error_after:
                raise EngineError("simulated engine failure", type="InternalServerError", code=500)
            reasoning = token is not None and emitted < thinking
            if token is not None:
                emitted += 1
                upcoming = next(tokens, None)
            if upcoming is None or emitted >= script.max_tokens:
                finish = "stop" if upcoming is None else "length"
                if finish == "stop" and script.tool_call:
                    finish = "tool_calls"
                piece = token if isinstance(token, ToolCallDelta) else None
                last = self._last_chunk(
                    None if isinstance(token, ToolCallDelta) else token,
                    finish,
                    script.prompt_tokens,
                    emitted,
                )
                assert last.usage is not None
                last.usage.reasoning_tokens = min(emitted, thinking) if thinking else None
                if piece is not None:
                    last.tool_calls, last.tokens = (piece,), 1
                elif reasoning and isinstance(token, bytes):
                    last.token_bytes = None
                    last.reasoning = thought.decode(token, final=True).replace("\ufffd", "")
                    last.tokens += held
                yield last
                return
            # The first output says what the prompt cost, as vLLM's usage stats do: an
            # answer that ends early (a stop sequence, a Stop) still records it.
            usage = None if told else Usage(prompt_tokens=script.prompt_tokens)
            if isinstance(token, ToolCallDelta):
                told = True
                yield EngineChunk(
                    tool_calls=(token,), tokens=1, usage=usage, emitted_at=time.time()
                )
                continue
            if reasoning and isinstance(token, bytes):
                text = thought.decode(token)
                if not text:
                    held += 1
                    continue
                told = True
                yield EngineChunk(
                    reasoning=text, tokens=1 + held, usage=usage, emitted_at=time.time()
                )
                held = 0
                continue
            told = True
            yield EngineChunk(token_bytes=token, tokens=1, usage=usage, emitted_at=time.time())

    @staticmethod
    def _last_chunk(token: bytes | None, finish: str, prompt: int, emitted: int) -> EngineChunk:
        return EngineChunk(
            token_bytes=token,
            tokens=0 if token is None else 1,
            finish_reason=finish,
            stop_reason=None,
            usage=Usage(prompt_tokens=prompt, completion_tokens=emitted),
            emitted_at=time.time(),
        )
