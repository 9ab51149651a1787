"""An emulator of vLLM's OpenAI-compatible server, faithful on the wire, scripted per request.

Why it exists: the fault tests need a server that behaves like vLLM byte for byte (see
``docs/vllm-wire.md``) and can be made to fail in ways a real one cannot be made to on
demand - a drop, a stall, an in-band error, an engine that dies. Everything else runs
against the real vLLM (``tests/vllm``), whose captures this emulator copies: vLLM 0.32
served without reasoning or tool-call parsers (role chunk at TTFT, empty-content chunks
for partial characters, ``token_ids``/``prompt_token_ids`` fields, ``stop_reason``, the
usage chunk only on ``include_usage``, context clamping, "Bad Request" validation errors,
aborting the request when the client closes the connection).

Each chat request is scripted by a directive in the *last user message*::

    [[emu {"text": "Hi!", "ttft_ms": 50, "tokens_per_second": 100, "drop_after_tokens": 3}]]

Keys (all optional; unknown keys are a 400 so typos do not pass silently):

``text``                exact output (tokenised like a byte-level BPE: 4-byte characters such
                        as emoji take two tokens, so they produce an empty-content chunk)
``tokens``              generate this many tokens of the default text instead
``ttft_ms``             delay before the first output (default 20)
``tokens_per_second``   decode speed (default 250; 0 = no delay)
``chunk_tokens``        tokens per chunk, cycled (default ``[1]``: several tokens in one chunk
                        are rare in vLLM, 1 in 300 at 32 concurrent streams)
``stop_token_id``       end with ``stop_reason`` = this int (as for ``stop_token_ids``)
``error_before``        HTTP status to answer instead of streaming
``error_body``          raw body for ``error_before`` (e.g. a proxy's HTML page)
``error_after_tokens``  after N tokens: ``data: {"error": {...}}`` then ``data: [DONE]``
``error_message`` / ``error_type`` / ``error_code``   the error object's fields
``drop_after_tokens``   after N tokens: close the connection, no ``[DONE]``
``stall_after_tokens``  after N tokens: send nothing more, keep the connection open
``abort_after_tokens``  after N tokens: finish with ``finish_reason: "abort"``
``repetition_after_tokens``  after N tokens: finish with ``finish_reason: "repetition"``
``die_after_tokens``    after N tokens: the engine core dies - an in-band
                        ``InternalServerError`` then ``[DONE]``; the next request gets a 500,
                        then the server exits

"After N tokens" faults fire right after the chunk that reaches N (N = 0: before the role
chunk); if the output ends sooner they do not fire.

With ``continue_final_message``, when the final (assistant) message is a prefix of the planned
output, only the rest is generated - so a Continue picks up mid-sentence as with a real model.

Every chat request is recorded (body, headers, client address - the same address on two
requests means a reused keep-alive connection -, times, tokens and text sent, finish reason,
how it ended) and the records are served at ``GET /_emulator/requests[/{request_id}]`` so
tests in another process can check that a cancel reached the engine. ``outcome`` is
``running`` until the request ends, then ``completed`` (response finished), ``aborted`` (the
client closed first), ``dropped`` (``drop_after_tokens``) or ``rejected`` (HTTP error before
the stream). ``POST /_emulator/reset`` forgets them; ``POST /_emulator/health``
``{"healthy": false}`` makes ``/health`` answer 503.

Run standalone: ``python -m tests.emulator.vllm_emulator --port 8001``.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import contextlib
import json
import logging
import re
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from streaming.engines.simulated import prompt_token_count, tokenize

DEFAULT_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
DEFAULT_MAX_MODEL_LEN = 4096
VLLM_VERSION = "0.32.0"
DEFAULT_TEXT = (
    "Hello! This is the vLLM emulator streaming a deterministic answer. "
    "こんにちは、世界。日本語も混ざります。 Emoji 🚀✨ and 👍🏽 are split across tokens.\n\n"
    "```python\nprint('streaming works')\n```\n"
)
DEFAULT_CHUNK_TOKENS = (1,)
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
MAX_RECORDS = 10_000

_DIRECTIVE = re.compile(r"\[\[emu\s+(\{.*?\})\]\]", re.DOTALL)
# Word pieces with their leading space (like GPT-style BPE), digits, whitespace runs,
# punctuation, then any other single character.
_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    422: "UnprocessableEntityError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}


class _Rejected(Exception):
    """An HTTP error answered before any streaming, in vLLM's error shape."""

    def __init__(
        self, status: int, message: str, type: str | None = None, param: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _ERROR_TYPES.get(status, "BadRequestError")
        self.param = param

    def response(self) -> JSONResponse:
        error = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.status,
        }
        return JSONResponse({"error": error}, status_code=self.status)


def _validation(param: str | None, detail: str) -> _Rejected:
    """A request-validation error as vLLM 0.32 words it: type "Bad Request" (an HTTP
    reason phrase, not an exception name) and the field as ``body.<name>``."""
    return _Rejected(400, f"1 validation error:\n  {detail}", "Bad Request", param)


def _parameter(status: int, message: str, param: str, value: Any = None) -> _Rejected:
    """A parameter check vLLM words as "... (parameter=<name>, value=<value>)"."""
    suffix = f"(parameter={param})" if value is None else f"(parameter={param}, value={value})"
    return _Rejected(status, f"{message} {suffix}", param=param)


class _DropConnection(Exception):
    """Raised by a producer to make the server cut the TCP connection mid-response."""


@dataclass
class Directive:
    """The per-request script; see the module docstring for each key."""

    text: str | None = None
    tokens: int | None = None
    ttft_ms: float = 20.0
    tokens_per_second: float = 250.0
    chunk_tokens: list[int] = field(default_factory=lambda: list(DEFAULT_CHUNK_TOKENS))
    stop_token_id: int | None = None
    error_before: int | None = None
    error_body: str | None = None
    error_after_tokens: int | None = None
    error_message: str = "emulated engine error"
    error_type: str = "BadRequestError"
    error_code: int = 400
    drop_after_tokens: int | None = None
    stall_after_tokens: int | None = None
    abort_after_tokens: int | None = None
    repetition_after_tokens: int | None = None
    die_after_tokens: int | None = None

    @classmethod
    def from_messages(cls, messages: list[dict[str, Any]]) -> Directive:
        for message in reversed(messages):
            if message.get("role") == "user":
                match = _DIRECTIVE.search(_content_text(message.get("content")))
                if match is None:
                    return cls()
                try:
                    directive = cls(**json.loads(match.group(1)))
                except (ValueError, TypeError) as exc:
                    raise _Rejected(400, f"invalid emulator directive: {exc}") from exc
                if not directive.chunk_tokens or min(directive.chunk_tokens) < 1:
                    raise _Rejected(400, "invalid emulator directive: chunk_tokens")
                return directive
        return cls()

    @property
    def token_gap(self) -> float:
        return 1.0 / self.tokens_per_second if self.tokens_per_second > 0 else 0.0


@dataclass
class Step:
    """One engine output as vLLM streams it: a text delta covering ``tokens`` tokens."""

    text: str
    tokens: int
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclass
class RequestRecord:
    """What the emulator saw of one chat request and how it ended."""

    request_id: str
    completion_id: str
    body: Any
    headers: dict[str, str]
    client: str = ""
    stream: bool = False
    started_at: float = field(default_factory=time.time)
    first_chunk_at: float | None = None
    ended_at: float | None = None
    status_code: int = 200
    outcome: str = "running"
    stalled: bool = False
    tokens_sent: int = 0
    chunks_sent: int = 0
    text_sent: str = ""
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: dict[str, Any] | None = None
    final_sent: bool = False

    def end(self, outcome: str) -> None:
        if self.outcome == "running":
            self.outcome = outcome
            self.ended_at = time.time()


def generate(
    tokens: list[bytes],
    *,
    max_tokens: int,
    stop: list[str],
    chunk_tokens: list[int],
    stop_token_id: int | None = None,
) -> Iterator[Step]:
    """The engine + vLLM's output processing, minus time: yields the streamed deltas.

    Mirrors vLLM: incremental detokenisation never emits a partial character; with ``stop``
    strings the last ``max(len) - 1`` characters are held back (empty-content chunks) and cut
    at a match (``stop_reason`` = the string); EOS is a token of its own and wins over the
    length cap; with ``length`` the last text arrives in the finishing chunk.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    stop = [s for s in stop if s]
    holdback = max((len(s) for s in stop), default=1) - 1
    text, sent, generated, position, step_index = "", 0, 0, 0, 0
    while True:
        want = chunk_tokens[step_index % len(chunk_tokens)]
        step_index += 1
        produced = 0
        finish: str | None = None
        stop_reason: str | int | None = None
        while produced < want and finish is None:
            produced += 1
            generated += 1
            if position >= len(tokens):
                finish, stop_reason = "stop", stop_token_id  # the EOS token
                break
            before = len(text)
            text += decoder.decode(tokens[position])
            position += 1
            for candidate in stop:
                index = text.find(candidate, max(0, before - len(candidate) + 1))
                if index >= 0:
                    text, finish, stop_reason = text[:index], "stop", candidate
                    break
            if finish is None and generated >= max_tokens:
                finish = "length"
        visible = text if finish else text[: max(sent, len(text) - holdback)]
        delta, sent = visible[sent:], len(visible)
        yield Step(delta, produced, finish, stop_reason)
        if finish:
            return


class Emulator:
    """The emulated server: configuration, request records and the ASGI app."""

    def __init__(
        self,
        *,
        model: str = DEFAULT_MODEL,
        api_key: str | None = None,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    ) -> None:
        self.model = model
        self.api_key = api_key
        self.max_model_len = max_model_len
        self.healthy = True
        self.dead = False  # the engine core died: the next request is a 500, then exit
        self.on_exit: Callable[[], None] | None = None  # set by the runner: stop serving
        self.fingerprint = f"vllm-{VLLM_VERSION}-{uuid.uuid4().hex[:8]}"
        self.created = int(time.time())
        self.records: deque[RequestRecord] = deque(maxlen=MAX_RECORDS)
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/models", self.list_models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/version", self.version, methods=["GET"]),
                Route("/_emulator/requests", self.list_records, methods=["GET"]),
                Route("/_emulator/requests/{request_id}", self.get_record, methods=["GET"]),
                Route("/_emulator/reset", self.reset, methods=["POST"]),
                Route("/_emulator/health", self.set_health, methods=["POST"]),
            ]
        )

    # --- vLLM endpoints -------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex[:16]
        record = RequestRecord(
            request_id=request_id,
            completion_id=f"chatcmpl-{request_id}",
            body=None,
            headers=dict(request.headers),
            client=f"{request.client.host}:{request.client.port}" if request.client else "",
        )
        self.records.append(record)
        if self.dead:
            if self.on_exit is not None:
                self.on_exit()
            return self._reject(record, _Rejected(500, ENGINE_DEAD).response())
        if not self._authorized(request):
            return self._reject(record, JSONResponse({"error": "Unauthorized"}, status_code=401))
        try:
            body, directive = await self._validate(request, record)
            plan = self._plan(body, directive)
        except _Rejected as rejection:
            return self._reject(record, rejection.response())
        if directive.error_before is not None:
            status = directive.error_before
            if directive.error_body is not None:
                response = Response(directive.error_body, status, media_type="text/html")
            else:
                response = _Rejected(status, directive.error_message).response()
            return self._reject(record, response)
        if body.get("stream"):
            record.stream = True
            return _WatchedResponse(self._stream(plan, record), record)
        return _WatchedResponse(self._complete(plan, record), record)

    async def list_models(self, request: Request) -> Response:
        if not self._authorized(request):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        card = {
            "id": self.model,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": self.model,
            "parent": None,
            "max_model_len": self.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{uuid.uuid4().hex}",
                    "object": "model_permission",
                    "created": self.created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, request: Request) -> Response:
        return Response(status_code=200 if self.healthy and not self.dead else 503)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": VLLM_VERSION})

    # --- emulator control -----------------------------------------------------------------

    async def list_records(self, request: Request) -> Response:
        return JSONResponse([_public(r) for r in self.records])

    async def get_record(self, request: Request) -> Response:
        record = self.find(request.path_params["request_id"])
        if record is None:
            return JSONResponse({"detail": "no such request"}, status_code=404)
        return JSONResponse(_public(record))

    async def reset(self, request: Request) -> Response:
        self.records.clear()
        self.healthy = True
        self.dead = False
        return JSONResponse({"ok": True})

    async def set_health(self, request: Request) -> Response:
        self.healthy = bool((await request.json()).get("healthy", True))
        return JSONResponse({"healthy": self.healthy})

    def find(self, request_id: str) -> RequestRecord | None:
        """The latest request with this id (ids may repeat; the newest is what tests want)."""
        for record in reversed(self.records):
            if record.request_id == request_id:
                return record
        return None

    # --- request handling -----------------------------------------------------------------

    def _authorized(self, request: Request) -> bool:
        # vLLM's --api-key middleware guards /v1/* and answers a bare {"error": "Unauthorized"}.
        if self.api_key is None:
            return True
        return request.headers.get("authorization") == f"Bearer {self.api_key}"

    def _reject(self, record: RequestRecord, response: Response) -> Response:
        record.status_code = response.status_code
        record.end("rejected")
        return response

    async def _validate(
        self, request: Request, record: RequestRecord
    ) -> tuple[dict[str, Any], Directive]:
        """vLLM's checks, in its order: media type, JSON, request model validators, model."""
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            raise _validation(None, "Unsupported Media Type: Only 'application/json' is allowed")
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            detail = (
                "{'type': 'json_invalid', 'loc': 'body.1', 'msg': 'JSON decode error', "
                f"'ctx': {{'error': {str(exc)!r}}}}}"
            )
            raise _validation("body.1", detail) from exc
        record.body = body
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            detail = "{'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required'}"
            raise _validation("body.messages", detail)
        if "x-request-id" not in request.headers and body.get("request_id"):
            record.request_id = str(body["request_id"])
            record.completion_id = f"chatcmpl-{record.request_id}"
        if body.get("stream_options") is not None and not body.get("stream"):
            raise _parameter(
                400, "Stream options can only be defined when `stream=True`.", "stream_options"
            )
        if body.get("continue_final_message") and body.get("add_generation_prompt", True):
            raise _Rejected(
                400,
                "continue_final_message and add_generation_prompt are not compatible. Use "
                "continue_final_message when you want the model to continue the final "
                "message, and add_generation_prompt when you want to add a header that will "
                "prompt it to start a new assistant message instead.",
            )
        directive = Directive.from_messages(body["messages"])
        if body.get("model") not in (None, self.model):
            raise _Rejected(
                404,
                f"The model `{body.get('model')}` does not exist. Valid aliases: {self.model}.",
                param="model",
            )
        return body, directive

    def _plan(self, body: dict[str, Any], directive: Directive) -> _Plan:
        messages = body["messages"]
        prompt_tokens = prompt_token_count(_content_text(m.get("content")) for m in messages)
        max_tokens = self._max_tokens(body, prompt_tokens)
        if directive.text is not None:
            tokens = tokenize(directive.text)
        elif directive.tokens is not None:
            base = tokenize(DEFAULT_TEXT)
            tokens = [base[i % len(base)] for i in range(directive.tokens)]
        else:
            tokens = tokenize(DEFAULT_TEXT)
        continue_final = bool(body.get("continue_final_message"))
        if continue_final and messages:
            tokens = _continue_after(tokens, _content_text(messages[-1].get("content")))
        add_generation_prompt = body.get("add_generation_prompt", True)
        role = "assistant" if add_generation_prompt else str(messages[-1].get("role", "user"))
        stop = body.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        return _Plan(body, directive, tokens, prompt_tokens, max_tokens, role, stop)

    def _max_tokens(self, body: dict[str, Any], prompt_tokens: int) -> int:
        """vLLM 0.32's context rules: a budget over the whole context is a 400; a prompt
        longer than the context is a 400; otherwise the budget is lowered to what the
        prompt leaves (the answer then ends ``length``), and none left at all is a 400."""
        limit = self.max_model_len
        name = "max_completion_tokens" if body.get("max_completion_tokens") else "max_tokens"
        asked = body.get(name)
        if asked is not None and asked > limit:
            raise _parameter(
                400,
                f"{name}={asked} cannot be greater than max_model_len={limit}. "
                "Please request fewer output tokens.",
                name,
                asked,
            )
        if prompt_tokens > limit:
            raise _parameter(
                400,
                f"This model's maximum context length is {limit} tokens. However, your "
                f"prompt contains at least {prompt_tokens} input tokens, which exceeds this "
                "limit even without any output tokens. Please reduce the length of the "
                "input prompt.",
                "input_tokens",
                prompt_tokens,
            )
        room = limit - prompt_tokens
        max_tokens = room if asked is None else min(asked, room)
        if max_tokens < 1:
            raise _parameter(
                400, f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", 0
            )
        return max_tokens

    def _stream(self, plan: _Plan, record: RequestRecord) -> Callable[[Send], Awaitable[None]]:
        async def produce(send: Send) -> None:
            directive = plan.directive
            chunks = _ChunkWriter(self.model, record, self.fingerprint)
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", SSE_CONTENT_TYPE.encode())],
                }
            )
            # include_usage defaults to false: stream_options {} gives no usage chunk.
            options = plan.body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            start = time.monotonic() + directive.ttft_ms / 1000
            await _sleep_until(start)
            if await self._fault(directive, record, chunks, send):
                return
            sent_role = False
            generated = 0
            for step in generate(
                plan.tokens,
                max_tokens=plan.max_tokens,
                stop=plan.stop,
                chunk_tokens=directive.chunk_tokens,
                stop_token_id=directive.stop_token_id,
            ):
                await _sleep_until(start + (generated + step.tokens - 1) * directive.token_gap)
                if not sent_role:
                    await chunks.send(send, {"role": plan.role, "content": ""}, tokens=0)
                    sent_role = True
                generated += step.tokens
                if step.finish_reason is None:
                    await chunks.send(send, {"content": step.text}, tokens=step.tokens)
                else:
                    await chunks.send(
                        send,
                        {"content": step.text},
                        tokens=step.tokens,
                        finish_reason=step.finish_reason,
                        stop_reason=step.stop_reason,
                    )
                    break
                if await self._fault(directive, record, chunks, send):
                    return
                ended = _ended_early(directive, record.tokens_sent)
                if ended is not None:
                    # A normal finish chunk (HTTP 200 all along), then usage and [DONE].
                    await chunks.send(
                        send, {"content": ""}, tokens=0, finish_reason=ended, stop_reason=None
                    )
                    break
            if include_usage:
                usage = {
                    "prompt_tokens": plan.prompt_tokens,
                    "total_tokens": plan.prompt_tokens + generated,
                    "completion_tokens": generated,
                }
                await chunks.send_usage(send, usage)
            await chunks.finish(send, b"data: [DONE]\n\n")
            record.end("completed")

        return produce

    async def _fault(
        self,
        directive: Directive,
        record: RequestRecord,
        chunks: _ChunkWriter,
        send: Send,
    ) -> bool:
        """Fire an "after N tokens" fault if N is reached; True when the stream is over.

        Checked at TTFT before the role chunk (for N = 0) and after every content chunk.
        """

        def reached(limit: int | None) -> bool:
            return limit is not None and record.tokens_sent >= limit

        dies = reached(directive.die_after_tokens)
        if dies or reached(directive.error_after_tokens):
            error = {
                "message": ENGINE_DEAD if dies else directive.error_message,
                "type": "InternalServerError" if dies else directive.error_type,
                "param": None,
                "code": 500 if dies else directive.error_code,
            }
            self.dead = self.dead or dies
            record.error = error
            # vLLM formats in-band errors with json.dumps defaults: spaces after , and :.
            await chunks.raw(send, f"data: {json.dumps({'error': error})}\n\n".encode())
            await chunks.finish(send, b"data: [DONE]\n\n")
            record.end("completed")
            return True
        if reached(directive.drop_after_tokens):
            raise _DropConnection
        if reached(directive.stall_after_tokens):
            record.stalled = True
            await asyncio.Event().wait()  # until the client leaves (or the server stops)
        return False

    def _complete(self, plan: _Plan, record: RequestRecord) -> Callable[[Send], Awaitable[None]]:
        """Non-streaming: the whole ``chat.completion`` object after the whole generation."""

        async def produce(send: Send) -> None:
            directive = plan.directive
            steps = list(
                generate(
                    plan.tokens,
                    max_tokens=plan.max_tokens,
                    stop=plan.stop,
                    chunk_tokens=[1],
                    stop_token_id=directive.stop_token_id,
                )
            )
            generated = len(steps)
            await asyncio.sleep(directive.ttft_ms / 1000 + (generated - 1) * directive.token_gap)

            def reached(limit: int | None) -> bool:
                return limit is not None and generated >= limit

            if reached(directive.error_after_tokens):
                # Without a stream, vLLM turns a generation failure into an HTTP error.
                error = _Rejected(directive.error_code, directive.error_message)
                error.type = directive.error_type
                record.error = {"message": error.message, "type": error.type}
                record.status_code = error.status
                record.final_sent = True
                await error.response()({"type": "http"}, _no_receive, send)
                record.end("completed")
                return
            if reached(directive.drop_after_tokens):
                raise _DropConnection
            if reached(directive.stall_after_tokens):
                record.stalled = True
                await asyncio.Event().wait()
            text = "".join(s.text for s in steps)
            last = steps[-1]
            record.tokens_sent, record.text_sent = generated, text
            record.finish_reason, record.stop_reason = last.finish_reason, last.stop_reason
            completion = {
                "id": record.completion_id,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": plan.role,
                            "content": text,
                            "refusal": None,
                            "annotations": None,
                            "audio": None,
                            "function_call": None,
                            "reasoning": None,
                        },
                        "logprobs": None,
                        "finish_reason": last.finish_reason,
                        "stop_reason": last.stop_reason,
                        "token_ids": None,
                        "routed_experts": None,
                    }
                ],
                "service_tier": None,
                "system_fingerprint": self.fingerprint,
                "usage": {
                    "prompt_tokens": plan.prompt_tokens,
                    "total_tokens": plan.prompt_tokens + generated,
                    "completion_tokens": generated,
                    "prompt_tokens_details": None,
                    "completion_tokens_details": None,
                },
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "prompt_text": None,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            }
            record.final_sent = True
            await JSONResponse(completion)({"type": "http"}, _no_receive, send)
            record.end("completed")

        return produce


@dataclass
class _Plan:
    body: dict[str, Any]
    directive: Directive
    tokens: list[bytes]
    prompt_tokens: int
    max_tokens: int
    role: str
    stop: list[str]


class _ChunkWriter:
    """Writes ``chat.completion.chunk`` events exactly as vLLM serialises them."""

    def __init__(self, model: str, record: RequestRecord, fingerprint: str) -> None:
        self.model = model
        self.record = record
        self.fingerprint = fingerprint
        self.created = int(time.time())

    def _envelope(self) -> dict[str, Any]:
        return {
            "id": self.record.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
        }

    async def send(
        self,
        send: Send,
        delta: dict[str, Any],
        *,
        tokens: int,
        finish_reason: str | None = None,
        stop_reason: str | int | None = None,
    ) -> None:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        role = "role" in delta
        if finish_reason is not None:
            # vLLM serialises with exclude_unset: stop_reason appears on the finish chunk only.
            choice["stop_reason"] = stop_reason
            self.record.finish_reason = finish_reason
            self.record.stop_reason = stop_reason
        if not role:
            choice["token_ids"] = None  # every choice after the role chunk's
        chunk = {**self._envelope(), "choices": [choice]}
        if role:
            chunk.update(prompt_token_ids=None, prompt_text=None)
        await self.raw(send, _event(chunk))
        self.record.tokens_sent += tokens
        self.record.text_sent += delta.get("content", "")

    async def send_usage(self, send: Send, usage: dict[str, int]) -> None:
        chunk = {**self._envelope(), "choices": [], "usage": usage}
        chunk["system_fingerprint"] = self.fingerprint
        await self.raw(send, _event(chunk))

    async def raw(self, send: Send, data: bytes) -> None:
        if self.record.first_chunk_at is None:
            self.record.first_chunk_at = time.time()
        self.record.chunks_sent += 1
        await send({"type": "http.response.body", "body": data, "more_body": True})

    async def finish(self, send: Send, data: bytes) -> None:
        self.record.final_sent = True
        await send({"type": "http.response.body", "body": data, "more_body": False})


class _WatchedResponse(Response):
    """Runs a producer while listening for ``http.disconnect``.

    Starlette's StreamingResponse no longer listens for disconnects (ASGI spec 2.4), and
    uvicorn silently drops writes to a closed connection, so without this a stalled or
    streaming request would never notice the client leaving - vLLM does, within
    milliseconds, and aborts the request; tests rely on us recording that moment.
    """

    def __init__(self, produce: Callable[[Send], Awaitable[None]], record: RequestRecord):
        self.produce = produce
        self.record = record
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        producer = asyncio.create_task(self.produce(send))
        watcher = asyncio.create_task(_wait_for_disconnect(receive))
        try:
            await asyncio.wait({producer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not producer.done() and not watcher.done():  # we are being cancelled
                producer.cancel()
                watcher.cancel()
        if producer.done() or self.record.final_sent:
            watcher.cancel()
            try:
                await producer
            except _DropConnection:
                # Returning without finishing the body makes uvicorn close the socket.
                self.record.end("dropped")
            return
        self.record.end("aborted")
        producer.cancel()
        with contextlib.suppress(asyncio.CancelledError, _DropConnection):
            await producer


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


def _event(obj: dict[str, Any]) -> bytes:
    # pydantic's model_dump_json: compact separators, non-ASCII left as UTF-8.
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n".encode()


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def _continue_after(tokens: list[bytes], partial: str) -> list[bytes]:
    """Drop what the partial answer already says, so a continuation picks up mid-sentence."""
    done = partial.encode()
    planned = b"".join(tokens)
    if not done or not planned.startswith(done):
        return tokens
    rest: list[bytes] = []
    offset = 0
    for token in tokens:
        end = offset + len(token)
        if end > len(done):
            rest.append(token[max(0, len(done) - offset) :])
        offset = end
    return rest


def _ended_early(directive: Directive, tokens_sent: int) -> str | None:
    """The finish reason of an engine-side end after N tokens (abort, repetition)."""
    for reason, limit in (
        ("abort", directive.abort_after_tokens),
        ("repetition", directive.repetition_after_tokens),
    ):
        if limit is not None and tokens_sent >= limit:
            return reason
    return None


def _public(record: RequestRecord) -> dict[str, Any]:
    data = asdict(record)
    del data["final_sent"]
    return data


class _IntentionalDropFilter(logging.Filter):
    """Hide uvicorn's complaint about the responses we cut on purpose (drop_after_tokens)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "returned without completing response" not in record.getMessage()


def quiet_intentional_drops() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _IntentionalDropFilter) for f in logger.filters):
        logger.addFilter(_IntentionalDropFilter())


def create_app(
    *,
    model: str = DEFAULT_MODEL,
    api_key: str | None = None,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
) -> Starlette:
    """A fresh emulator app; its ``Emulator`` is at ``app.state.emulator``."""
    emulator = Emulator(model=model, api_key=api_key, max_model_len=max_model_len)
    emulator.app.state.emulator = emulator
    return emulator.app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="vLLM OpenAI-server emulator")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN)
    args = parser.parse_args(argv)
    quiet_intentional_drops()
    app = create_app(model=args.model, api_key=args.api_key, max_model_len=args.max_model_len)
    # vLLM runs uvicorn with a 5 s keep-alive; match it so client pools see the same thing.
    uvicorn.run(app, host=args.host, port=args.port, timeout_keep_alive=5, log_level="warning")


if __name__ == "__main__":
    main()
