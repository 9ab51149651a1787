"""The engine protocol: what the generation service needs from a model server.

An engine turns one request into an async iterator of `EngineChunk`s. Cancellation is
the iterator being closed (``aclose()``) or its task cancelled: every engine must abort the
work upstream when that happens (for vLLM that means closing the HTTP stream).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class ChatTurn:
    """One turn of the conversation. ``reasoning`` is an assistant turn's own reasoning,
    sent back only where the model must see it: the partial answer a Continue extends.
    ``tool_calls`` are an assistant turn's calls in OpenAI's shape (``{"id", "type":
    "function", "function": {"name", "arguments"}}``); ``tool_call_id`` is the call a
    ``tool`` turn answers."""

    role: str
    content: str
    reasoning: str = ""
    tool_calls: tuple[dict[str, Any], ...] = ()
    tool_call_id: str = ""


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a tool call as it streams: the first piece of call ``index`` carries its
    ``id`` and ``name``, later ones fragments of its JSON ``arguments``."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(slots=True)
class EngineRequest:
    """One generation run.

    ``continue_final`` means the last turn is a partial assistant answer the model must
    extend mid-sentence (vLLM: ``continue_final_message``/``add_generation_prompt: false``).
    """

    messages: list[ChatTurn]
    request_id: str
    model: str = ""
    max_tokens: int = 512
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    continue_final: bool = False
    simulation: dict[str, Any] = field(default_factory=dict)
    # OpenAI's ``tools`` and ``tool_choice``, passed on as they are (None: not sent).
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Of the completion tokens, how many were reasoning (None: the engine does not say).
    reasoning_tokens: int | None = None


@dataclass(slots=True)
class EngineChunk:
    """A piece of output. Engines that speak text set ``text``; engines that produce raw
    token bytes (byte-level BPE) set ``token_bytes`` and leave decoding to the service.
    ``reasoning`` is text of the model's reasoning (its thinking before the answer, split
    off by the engine's reasoning parser): whole characters, shown apart from the answer.
    ``tool_calls`` are pieces of the tool calls the model makes (the engine's tool-call
    parser found them); a model that calls tools finishes with ``tool_calls``.

    ``tokens`` is how many model tokens this chunk carries (0 for bookkeeping chunks).
    ``usage``, when set, is the engine's count so far, which may have been taken before
    this chunk's own tokens (the prompt's cost told with the first output): the
    generation counts ``tokens`` and takes ``usage.completion_tokens`` as a floor.
    ``finish_reason`` is set on the last chunk only; ``context_full`` on it says that the
    prompt and the answer fill the model's whole context (nothing more can follow).
    ``emitted_at`` is the engine's wall-clock stamp for the chunk (simulator in bench
    mode), used to measure added latency.
    """

    text: str = ""
    token_bytes: bytes | None = None
    reasoning: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    tokens: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    usage: Usage | None = None
    emitted_at: float | None = None
    context_full: bool = False


class EngineError(Exception):
    """The engine failed: before the stream (HTTP status) or inside it (in-band error).

    ``type`` and ``code`` follow OpenAI's error object so they can be passed on unchanged.
    """

    def __init__(self, message: str, type: str = "EngineError", code: int | str | None = None):
        super().__init__(message)
        self.message = message
        self.type = type
        self.code = code

    def as_dict(self) -> dict[str, Any]:
        return {"message": self.message, "type": self.type, "code": self.code}


class EngineUnavailable(EngineError):
    """The engine could not be reached at all (connection refused, DNS, connect timeout)."""

    def __init__(self, message: str):
        super().__init__(message, type="EngineUnavailable", code="engine_unavailable")


class EngineContextFull(EngineError):
    """The conversation is as long as the model's context, or longer: the engine cannot
    generate a single token for it. Distinct because it will fail the same way every
    time, so nobody should be offered a retry or a Continue."""

    def __init__(self, message: str):
        super().__init__(message, type="ContextFull", code="context_full")


class EngineTimeout(EngineError):
    """The engine went silent: no byte within the read (stall) timeout.

    Distinct from other errors because the service records it as ``stalled``, not ``error``.
    """

    def __init__(self, message: str):
        super().__init__(message, type="EngineTimeout", code="engine_timeout")


@dataclass(frozen=True, slots=True)
class ModelInfo:
    id: str
    owned_by: str
    max_model_len: int | None = None


class Engine(Protocol):
    name: str
    model: str
    accepts_simulation: bool

    def stream(self, request: EngineRequest) -> AsyncGenerator[EngineChunk, None]: ...

    async def models(self) -> list[ModelInfo]: ...

    async def health(self) -> bool: ...
