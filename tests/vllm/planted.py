"""What the tiny test model says: its trigger words and the exact texts planted in it.

Shared by the model builder (``tests.vllm.tinymodel``, run by the vLLM venv's Python) and
the tests (run by the project's), so it imports nothing. A prompt selects an answer by the
trigger word it contains; a prompt with none gets ``NORMAL``. A ``<tool_response>`` (a tool
result in the conversation) outranks every trigger word, so a tool loop's second turn
answers from the tool's result.
"""

from __future__ import annotations

BOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # the end of every turn, and the model's end of sequence
THINK_START, THINK_END = "<think>", "</think>"
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_START, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
SPECIAL_TOKENS = (BOS, IM_START, IM_END)
MARKER_TOKENS = (
    THINK_START,
    THINK_END,
    TOOL_CALL_START,
    TOOL_CALL_END,
    TOOL_RESPONSE_START,
    TOOL_RESPONSE_END,
)

# Trigger words (tokens of their own) and the answers they select.
FOREVER = "forever"
PONDER = "ponder"
WEATHER = "weather"
TRIGGERS = (FOREVER, PONDER, WEATHER)

# Multi-byte characters split across tokens: 日 into 3, 🚀 into 4.
NORMAL = (
    "Hello! This answer is planted in a tiny model: 日本語 and 世界 arrive whole, "
    "and so does 🚀 at the end."
)
# Repeats " and on" until max_tokens, a stop or a cancel ends it.
ENDLESS_HEAD = "This answer never ends: it goes on"
ENDLESS_CYCLE = " and on"
REASONING = "Two and two make four, so the sum is four."
REASONED_ANSWER = "The answer is 4."
TOOL_NAME = "get_weather"
TOOL_ARGUMENTS = '{"city":"Paris"}'
TOOL_CALL = f'{TOOL_CALL_START}{{"name":"{TOOL_NAME}","arguments":{TOOL_ARGUMENTS}}}{TOOL_CALL_END}'
AFTER_TOOL = "It is sunny in Paris today."

# mode -> (the token that selects it, None for the default; its priority; the reasoning;
# the text after it). Like a Qwen3 model, every answer opens with its reasoning between
# <think> and </think>, empty unless the model ponders: the qwen3 reasoning parser takes
# everything before </think> for reasoning.
MODES: dict[str, tuple[str | None, int, str, str]] = {
    "normal": (None, 0, "", NORMAL),
    "endless": (FOREVER, 1, "", ENDLESS_HEAD),
    "thinking": (PONDER, 1, REASONING, REASONED_ANSWER),
    "tool": (WEATHER, 1, "", TOOL_CALL),
    "after_tool": (TOOL_RESPONSE_START, 2, "", AFTER_TOOL),
}


def raw(mode: str) -> str:
    """What the model generates for ``mode``, before any parser splits it."""
    _, _, reasoning, text = MODES[mode]
    return f"{THINK_START}{reasoning}{THINK_END}{text}"


def endless(characters: int) -> str:
    """The first ``characters`` characters of the endless answer."""
    text = ENDLESS_HEAD
    while len(text) < characters:
        text += ENDLESS_CYCLE
    return text[:characters]


# The tool the tool-call answer calls, in OpenAI's shape.
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
