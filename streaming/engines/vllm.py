"""vLLM engine: a client for vLLM's OpenAI-compatible ``/v1/chat/completions`` stream.

Works with any OpenAI-compatible server, but the wire details it relies on are vLLM's
(see ``docs`` and the emulator in ``tests/emulator``):

- bare ``data:`` SSE events of JSON chunks, ended by ``data: [DONE]``;
- a role chunk first, and empty-``content`` chunks that are normal (an incomplete
  multi-byte character, or text held back while a stop string might still match);
- ``finish_reason`` with vLLM's ``stop_reason`` (matched stop string or token id) on the
  last choice chunk, then a usage chunk with ``choices: []``;
- errors after the 200 arrive in-band as ``data: {"error": {...}}`` followed by ``[DONE]``;
- closing the HTTP response aborts the request inside vLLM, so cancelling our iterator is
  the abort - there is no separate abort call;
- ``max_tokens`` above the model's context is a 400 (the client clamps it to the context
  it reads from ``/v1/models``), while a prompt that leaves too little room is served to
  the context's end (``length``); a prompt that leaves none is a 400 with ``param`` set
  (``EngineContextFull``);
- error ``type``s are OpenAI's exception names, except validation errors ("Bad Request",
  an HTTP reason phrase): every type is read as the OpenAI name.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import httpx
from httpx_sse import EventSource, SSEError

from streaming import events

from .base import (
    ChatTurn,
    EngineChunk,
    EngineContextFull,
    EngineError,
    EngineRequest,
    EngineTimeout,
    EngineUnavailable,
    ModelInfo,
    ToolCallDelta,
    Usage,
)

log = logging.getLogger(__name__)

# OpenAI SDK exception names, which vLLM's error ``type`` strings imitate. Used when a body
# carries no type of its own (bare 401, proxy pages, non-JSON bodies).
_TYPE_BY_STATUS = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    409: "ConflictError",
    415: "UnsupportedMediaTypeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
}
# vLLM's validation errors carry an HTTP reason phrase as their type ("Bad Request").
_TYPE_BY_REASON = {
    **{
        name.removesuffix("Error").lower(): name
        for name in (*_TYPE_BY_STATUS.values(), "InternalServerError", "NotImplementedError")
    },
    "unauthorized": "AuthenticationError",
    "forbidden": "PermissionDeniedError",
    "toomanyrequests": "RateLimitError",
}
# The request parameters vLLM names when the prompt leaves no room for a single token:
# the prompt itself, or the max_tokens it lowered to what fits (0; we never send 0).
_CONTEXT_PARAMS = frozenset({"input_tokens", "max_tokens", "max_completion_tokens"})
_NO_ROOM = re.compile(r"\b(got 0|value=0)\b|maximum context length")
# A gateway in front of vLLM answering for it means vLLM itself cannot serve right now.
_UNAVAILABLE_STATUSES = frozenset({502, 503, 504})
# Error bodies are small; never buffer an arbitrarily large one (a misrouted proxy page).
_MAX_ERROR_BODY = 64 * 1024
# uvicorn (vLLM's server) drops idle keep-alive connections after 5 s. Expire ours first so we
# never reuse a socket the server is closing ("Server disconnected without sending a response").
_KEEPALIVE_EXPIRY = 4.0
_HEALTH_TIMEOUT = 2.0


class VLLMEngine:
    """Streams chat completions from a vLLM server over one shared keep-alive pool.

    ``read_timeout`` is the stall timeout: the longest silence tolerated between two bytes of
    a stream (and before the response headers). ``base_url`` may be given with or without a
    trailing ``/v1`` - OpenAI SDK users habitually include it, but ``/health`` lives at root.
    """

    name = "vllm"
    accepts_simulation = False

    def __init__(
        self,
        location: str,
        model: str = "",
        *,
        api_key: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        max_connections: int = 1000,
    ) -> None:
        """``location``: the server's base URL; ``read_timeout``: the longest silence
        before the stream counts as stalled (settings pass the stall timeout)."""
        root = location.rstrip("/")
        if root.endswith("/v1"):
            root = root[: -len("/v1")]
        self.base_url = root
        self.model = model
        self.read_timeout = read_timeout
        # Each model's context length once /v1/models told it (None: it does not say).
        self._contexts: dict[str, int | None] = {}
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # One client per engine: connection reuse is what keeps TTFT low under load, and
        # the pool bound keeps a burst of users from opening unbounded sockets to vLLM.
        self._client = httpx.AsyncClient(
            base_url=root,
            headers=headers,
            timeout=httpx.Timeout(
                connect=connect_timeout,
                read=read_timeout,
                write=read_timeout,
                pool=connect_timeout,
            ),
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=max_connections,
                keepalive_expiry=_KEEPALIVE_EXPIRY,
            ),
        )

    async def stream(self, request: EngineRequest) -> AsyncGenerator[EngineChunk, None]:
        """Yield the generation as chunks; close this iterator to abort it in vLLM.

        Text chunks carry ``tokens`` = 1 per content chunk plus any empty-content chunks
        folded into them (those are tokens too: a partial character or held-back text), so
        no empty chunk is ever yielded. The last chunk carries ``finish_reason``,
        ``stop_reason`` and, when the server sent it, ``usage``; its ``tokens`` is adjusted
        so that the sum over all chunks equals ``usage.completion_tokens`` (one chunk may
        carry several tokens, which only usage reveals).

        Raises ``EngineUnavailable`` (cannot connect), ``EngineTimeout`` (silence longer
        than the read timeout), ``EngineError`` (HTTP error, in-band error, or the stream
        ending without a finish - type ``EngineDisconnected``).
        """
        context = await self.context_length(request.model or self.model)
        body = self._request_body(request, context)
        parser = _ChunkParser(context)
        try:
            async with self._client.stream(
                "POST",
                "/v1/chat/completions",
                json=body,
                headers={"X-Request-Id": request.request_id},
            ) as response:
                if response.status_code >= 400:
                    raise await _http_error(response)
                # Leaving this block early (exception, aclose() of this generator, task
                # cancellation) closes the response mid-body: that is what aborts in vLLM.
                done = False
                async with aclosing(EventSource(response).aiter_sse()) as events:
                    async for event in events:
                        # After [DONE] only the body's end follows; reading it (instead of
                        # breaking) lets the connection go back to the keep-alive pool.
                        if done:
                            continue
                        if event.data == "[DONE]":
                            done = True
                            continue
                        for chunk in parser.feed(event.data):
                            yield chunk
        except httpx.TransportError as exc:
            # Once vLLM has sent the finish chunk the generation is over; losing only the
            # usage chunk or [DONE] to a broken connection must not turn it into an error.
            if parser.final is None:
                raise self._transport_error(exc) from exc
        except SSEError as exc:
            raise EngineError(str(exc), type="EngineProtocolError", code="bad_stream") from exc
        yield parser.finish()

    async def context_length(self, model: str) -> int | None:
        """The model's context length (``max_model_len`` in ``/v1/models``), asked once.

        ``None`` when the server does not say or cannot be asked now (asked again next
        time): the request then goes out unclamped, and vLLM's answer says what is wrong.
        """
        if model in self._contexts:
            return self._contexts[model]
        try:
            cards = await self.models()
        except EngineError:
            return None
        for card in cards:
            self._contexts[card.id] = card.max_model_len
        return self._contexts.setdefault(model, None)

    def _request_body(self, request: EngineRequest, context: int | None) -> dict[str, Any]:
        # A max_tokens over the whole context is a 400 in vLLM; up to it, vLLM lowers it
        # to what the prompt leaves. So the budget asked for is what the context allows.
        max_tokens = request.max_tokens if context is None else min(request.max_tokens, context)
        body: dict[str, Any] = {
            "model": request.model or self.model,
            "messages": [_message(turn) for turn in request.messages],
            "stream": True,
            # include_usage defaults to false: without it there is no usage chunk. With
            # continuous_usage_stats every chunk says the tokens so far, and the prompt's:
            # an answer stopped before the last chunk still knows what its prompt cost.
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            # max_completion_tokens is OpenAI's current name; older vLLM releases and some
            # other OpenAI-compatible servers only know max_tokens. vLLM uses
            # max_completion_tokens when both are set.
            "max_completion_tokens": max_tokens,
            "max_tokens": max_tokens,
        }
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.top_p is not None:
            body["top_p"] = request.top_p
        if request.seed is not None:
            body["seed"] = request.seed
        if request.tools:
            body["tools"] = request.tools
        if request.tool_choice is not None:
            body["tool_choice"] = request.tool_choice
        # No ``stop``: the generation matches stop strings itself, on the answer only.
        # vLLM matches them on the raw output, reasoning included, so a stop string the
        # reasoning holds ("\n\n", say) ended the answer before it began.
        if request.continue_final:
            # Both flags: vLLM rejects continue_final_message with add_generation_prompt
            # (which defaults to true) with a 400.
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
            last = request.messages[-1] if request.messages else None
            if last is not None and (last.content or last.reasoning):
                # The template renders the partial answer's reasoning closed (Qwen3's
                # does), so what follows is answer: say so, or vLLM's qwen3 reasoning
                # parser takes everything before a </think> for reasoning. Templates
                # without the flag ignore it.
                body["chat_template_kwargs"] = {"enable_thinking": False}
        return body

    async def models(self) -> list[ModelInfo]:
        """The models the server serves, with their context length when vLLM reports it."""
        try:
            response = await self._client.get("/v1/models")
        except httpx.TransportError as exc:
            raise self._transport_error(exc) from exc
        if response.status_code >= 400:
            raise await _http_error(response)
        try:
            cards = response.json()["data"]
            models = [
                ModelInfo(
                    id=card["id"],
                    owned_by=card.get("owned_by", ""),
                    max_model_len=card.get("max_model_len"),
                )
                for card in cards
            ]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise EngineError(
                f"unexpected /v1/models answer: {response.text[:200]!r}",
                type="EngineProtocolError",
                code="bad_response",
            ) from exc
        for model in models:
            self._contexts[model.id] = model.max_model_len
        return models

    async def health(self) -> bool:
        """True when ``/health`` answers 200 quickly; never raises.

        vLLM closes its port while the model loads and answers 503 once the engine died, so
        both map to False.
        """
        try:
            response = await self._client.get("/health", timeout=_HEALTH_TIMEOUT)
        except Exception:
            return False
        return response.status_code == 200

    def _transport_error(self, exc: httpx.TransportError) -> EngineError:
        """Map a socket-level failure to the engine error the service acts on."""
        # The address and the socket error are for operators (the log), not for the
        # people whose answer failed (the message, the record, the stream's error event).
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
            log.warning("cannot connect to the engine at %s: %r", self.base_url, exc)
            return EngineUnavailable("the model engine could not be reached")
        if isinstance(exc, httpx.TimeoutException):
            return EngineTimeout(f"the model engine sent nothing for {self.read_timeout:g} s")
        log.warning("connection to the engine at %s lost: %r", self.base_url, exc)
        return EngineError(
            "the connection to the model engine was lost",
            type="EngineDisconnected",
            code="disconnected",
        )

    async def aclose(self) -> None:
        """Close the connection pool; in-flight streams are cut (and so aborted in vLLM)."""
        await self._client.aclose()


def _message(turn: ChatTurn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": turn.role, "content": turn.content}
    if turn.reasoning:
        # vLLM hands it to the chat template as `reasoning` and `reasoning_content`.
        message["reasoning"] = turn.reasoning
    if turn.tool_calls:
        message["tool_calls"] = list(turn.tool_calls)
        message["content"] = turn.content or None
    if turn.tool_call_id:
        message["tool_call_id"] = turn.tool_call_id
    return message


def _tool_calls(raw: Any) -> tuple[ToolCallDelta, ...]:
    """``delta.tool_calls`` as pieces; anything not shaped like one is left out."""
    if not isinstance(raw, list):
        return ()
    pieces = []
    for call in raw:
        if not isinstance(call, dict) or not isinstance(call.get("index"), int):
            continue
        raw_function = call.get("function")
        function: dict[str, Any] = raw_function if isinstance(raw_function, dict) else {}
        pieces.append(
            ToolCallDelta(
                index=call["index"],
                id=_text(call.get("id")),
                name=_text(function.get("name")),
                arguments=_text(function.get("arguments")),
            )
        )
    return tuple(pieces)


class _ChunkParser:
    """Turns vLLM's chunk objects into ``EngineChunk``s, holding back the finish chunk.

    The finish chunk is held until the stream ends so that usage (sent after it) can ride on
    it, and so that ``finish_reason`` is on the very last chunk the service sees.
    """

    def __init__(self, context: int | None = None) -> None:
        self.context = context  # the model's context length, when known
        self.tokens_yielded = 0
        self.pending_tokens = 0  # empty-content chunks not yet attributed to a text chunk
        self.last_usage_tokens: int | None = None  # continuous_usage_stats, when present
        # The prompt's tokens as a chunk's usage said them, until told on a chunk yielded.
        self.prompt_tokens: int | None = None
        self.prompt_told = False
        self.final: EngineChunk | None = None
        self.usage: Usage | None = None

    def feed(self, data: str) -> list[EngineChunk]:
        try:
            obj = events.decode(data)
        except ValueError as exc:
            raise EngineError(
                f"vLLM sent a non-JSON event: {data[:200]!r}",
                type="EngineProtocolError",
                code="bad_stream",
            ) from exc
        if not isinstance(obj, dict):
            raise EngineError(
                f"vLLM sent an unexpected event: {data[:200]!r}",
                type="EngineProtocolError",
                code="bad_stream",
            )
        if "error" in obj:
            raise _error_from_body(obj, status=None, text=data)
        usage = obj.get("usage")
        choices = obj.get("choices") or []
        if not choices:
            if usage:
                details = usage.get("completion_tokens_details")
                reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
                self.usage = Usage(
                    prompt_tokens=usage.get("prompt_tokens") or 0,
                    completion_tokens=usage.get("completion_tokens") or 0,
                    reasoning_tokens=reasoning if isinstance(reasoning, int) else None,
                )
            return []
        choice = choices[0]
        delta = choice.get("delta") or {}
        text = _text(delta.get("content"))
        # vLLM 0.32 says `reasoning`; earlier releases (and other servers) `reasoning_content`.
        reasoning = _text(delta.get("reasoning")) or _text(delta.get("reasoning_content"))
        calls = _tool_calls(delta.get("tool_calls"))
        finish_reason = choice.get("finish_reason")
        tokens = self._tokens_in(delta, bool(text or reasoning or calls), usage)
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            self.prompt_tokens = usage["prompt_tokens"]
        if finish_reason is not None:
            self.final = EngineChunk(
                text=text,
                reasoning=reasoning,
                tool_calls=calls,
                tokens=tokens + self.pending_tokens,
                finish_reason=finish_reason,
                stop_reason=choice.get("stop_reason"),
            )
            self.pending_tokens = 0
            return []
        if not text and not reasoning and not calls:
            self.pending_tokens += tokens
            return []
        chunk = EngineChunk(
            text=text, reasoning=reasoning, tool_calls=calls, tokens=tokens + self.pending_tokens
        )
        if self.prompt_tokens is not None and not self.prompt_told:
            # Told once, on the first output: the record has it if the answer ends early.
            self.prompt_told = True
            chunk.usage = Usage(
                prompt_tokens=self.prompt_tokens, completion_tokens=self.last_usage_tokens or 0
            )
        self.pending_tokens = 0
        self.tokens_yielded += chunk.tokens
        return [chunk]

    def _tokens_in(self, delta: dict[str, Any], output: bool, usage: Any) -> int:
        """Tokens this chunk carries: exact with continuous usage stats, else an estimate."""
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            previous = self.last_usage_tokens or 0
            self.last_usage_tokens = usage["completion_tokens"]
            return max(0, usage["completion_tokens"] - previous)
        if "role" in delta and not output:
            return 0  # the role chunk precedes the first token's own chunk
        return 1

    def finish(self) -> EngineChunk:
        """The last chunk, after the stream ended; raises if vLLM never said it finished."""
        if self.final is None:
            raise EngineError(
                "vLLM stream ended without a finish_reason",
                type="EngineDisconnected",
                code="disconnected",
            )
        final = self.final
        final.usage = self.usage
        if self.usage is not None:
            final.tokens = max(0, self.usage.completion_tokens - self.tokens_yielded)
            used = self.usage.prompt_tokens + self.usage.completion_tokens
            filled = self.context is not None and used >= self.context
            final.context_full = final.finish_reason == "length" and filled
        return final


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


async def _http_error(response: httpx.Response) -> EngineError:
    """Build the error for a non-2xx answer, whatever shape its body has."""
    raw = b""
    async for part in response.aiter_bytes():
        raw += part
        if len(raw) >= _MAX_ERROR_BODY:
            break
    text = raw[:_MAX_ERROR_BODY].decode("utf-8", errors="replace")
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    error = _error_from_body(body, status=response.status_code, text=text)
    if response.status_code in _UNAVAILABLE_STATUSES:
        return EngineUnavailable(f"vLLM unavailable (HTTP {response.status_code}): {error.message}")
    if response.status_code == 400 and _no_room(body):
        return EngineContextFull(
            "the conversation fills the model's context: it cannot answer any further "
            f"(the engine said: {error.message})"
        )
    return error


def _no_room(body: Any) -> bool:
    """Whether a 400 says the prompt leaves no room for a single token of answer."""
    inner = body.get("error") if isinstance(body, dict) else None
    if not isinstance(inner, dict):
        return False
    param = inner.get("param")
    return (
        isinstance(param, str)
        and param in _CONTEXT_PARAMS
        and bool(_NO_ROOM.search(str(inner.get("message", ""))))
    )


def canonical_type(raw: str, status: int | None) -> str:
    """OpenAI's exception name for an error type vLLM may spell as a reason phrase."""
    if raw in _TYPE_BY_STATUS.values():
        return raw
    known = _TYPE_BY_REASON.get(raw.replace(" ", "").removesuffix("Error").lower())
    return known or raw


def _error_from_body(body: Any, status: int | None, text: str = "") -> EngineError:
    """Read vLLM's error object in any of the shapes it has used.

    ``{"error": {"message", "type", "param", "code"}}`` (current), the flat
    ``{"object": "error", "message", ...}`` of vLLM < 0.10, the bare
    ``{"error": "Unauthorized"}`` of its API-key middleware, FastAPI's ``{"detail": ...}``
    and non-JSON bodies (proxies, crashed servers).
    """
    fallback_type = _TYPE_BY_STATUS.get(
        status or 0, "InternalServerError" if status is None or status >= 500 else "APIError"
    )
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and "message" in inner:
            return EngineError(
                str(inner["message"]),
                type=canonical_type(str(inner.get("type") or fallback_type), status),
                code=inner.get("code", status),
            )
        if isinstance(inner, str):
            return EngineError(inner, type=fallback_type, code=status)
        if "detail" in body:
            return EngineError(str(body["detail"]), type=fallback_type, code=status)
    # A body that is no error object is a proxy's or a crashed server's page, which may
    # name hosts, addresses and versions: the operators' log has it, the record does not.
    snippet = " ".join(text.split())[:200] or "empty body"
    log.warning("the engine answered HTTP %s with no error object: %s", status, snippet)
    said = "an empty body" if not text.strip() else "a body that is no error object"
    prefix = f"HTTP {status}: " if status is not None else ""
    return EngineError(f"{prefix}{said}", type=fallback_type, code=status)
