"""OpenAI's chat-completions wire format on top of our event schema.

``parse_request`` turns a ``POST /v1/chat/completions`` body into what
``services.post_message`` takes (earlier turns, the new user message, our generation
params), naming the offending field as the caller spelled it on any error, and refuses
every key it would not honour (``KNOWN``) rather than answer as if it were absent.
``ChunkStream`` renders a message's events as ``chat.completion.chunk`` frames: a role
chunk at ``start``, one content chunk per merged delta (a ``reasoning`` chunk per merged
reasoning event, as vLLM's reasoning parsers send them), the finish chunk (and the usage
chunk when asked) at ``done``, then ``data: [DONE]``; an engine error goes in-band as
``data: {"error": {...}}`` before ``[DONE]``, as vLLM and OpenAI do. ``completion``
builds the non-streaming answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from streaming import events
from streaming.engines.base import ChatTurn
from streaming.errors import InvalidParams, NotFound, ServiceError, error_document, too_long
from streaming.params import TOOL_NAME
from streaming.storable import UNSTORABLE, is_storable
from streaming.termination import Status
from streaming.transports import eventstream

# A history's tool calls: how many one assistant message may carry, and how long an id
# (a tool message's ``tool_call_id`` names one) may be.
MAX_TOOL_CALLS = 128
MAX_CALL_ID_CHARS = 200
ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
# What this server does with each top-level key of OpenAI's chat-completions request (the
# openai SDK's ``CompletionCreateParams``), and with ``simulation``, its own. A key named
# nowhere here is refused: a caller sending it means something by it, and an answer that
# silently ignored it would answer something else.
#
# Honoured: passed on as our generation params under these names (``max_completion_tokens``
# or ``max_tokens``, see ``_max_tokens``), or read here (``model``, ``messages``, ``n``,
# ``stream``, ``stream_options``).
PASSED_PARAMS = ("temperature", "top_p", "stop", "seed", "tools", "tool_choice", "simulation")
HONOURED = (
    "model",
    "messages",
    "max_completion_tokens",
    "max_tokens",
    "n",
    "stream",
    "stream_options",
    *PASSED_PARAMS,
)
# Ignored, because they cannot change the answer (bookkeeping, caching, billing, a latency
# hint) and SDKs and frameworks send them: accepted when of OpenAI's JSON type.
IGNORED: dict[str, tuple[type, str]] = {
    "user": (str, "must be a string"),
    "safety_identifier": (str, "must be a string"),
    "metadata": (dict, "must be an object"),
    "store": (bool, "must be a boolean"),
    "service_tier": (str, "must be a string"),
    "prompt_cache_key": (str, "must be a string"),
    "prompt_cache_retention": (str, "must be a string"),
    "prompt_cache_options": (dict, "must be an object"),
    "prediction": (dict, "must be an object"),
}
# Not honoured by any engine here, accepted only at the values that mean "as if absent"
# (what many clients send by default; none: refused whenever set); any other value is
# refused naming the key. A null always counts as absent.
DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "functions": ([],),
    "function_call": (),
    "logprobs": (False,),
    "top_logprobs": (),
    "logit_bias": ({},),
    "frequency_penalty": (0,),
    "presence_penalty": (0,),
    "response_format": ({"type": "text"},),
    "reasoning_effort": (),
    "verbosity": (),
    "modalities": (["text"],),
    "audio": (),
    "web_search_options": (),
    "moderation": (),
    "parallel_tool_calls": (True,),
}
KNOWN = frozenset((*HONOURED, *IGNORED, *DEFAULT_ONLY))
# ``stream_options``: ``include_usage`` is honoured; ``include_obfuscation`` (padding
# against a side channel OpenAI's network has) cannot change the answer.
STREAM_OPTIONS = frozenset(("include_usage", "include_obfuscation"))
# The integer fields honoured: a JSON ``true`` or ``1.0`` is not an integer, though Python
# compares them equal to one.
INTEGERS = ("max_completion_tokens", "max_tokens", "n", "seed")

FINISH_REASONS = {
    Status.COMPLETE.value: "stop",
    Status.STOPPED.value: "stop",
    Status.TRUNCATED.value: "length",
    Status.CANCELLED.value: "abort",
    Status.ABANDONED.value: "abort",
}
# Ends that are failures for a caller: in-band error when streaming, an error status when not.
FAILED = frozenset({Status.ERROR.value, Status.STALLED.value, Status.INTERRUPTED.value})


class ModelNotFound(NotFound):
    code = "model_not_found"


def service_error_document(exc: ServiceError, request: CompletionRequest | None) -> dict[str, Any]:
    return error_document(exc.status, exc.code, exc.message, openai_field(exc.field, request))


def openai_field(name: str | None, request: CompletionRequest | None) -> str | None:
    """Our field names as the caller spelled them: ``params.top_p`` -> ``top_p``,
    ``params.max_tokens`` -> ``max_completion_tokens`` when that is what was sent, the
    new message's ``content`` -> ``messages[<its index>].content``."""
    if name is None:
        return None
    if name.startswith("params."):
        name = name[len("params.") :]
        return request.spelled.get(name, name) if request is not None else name
    if name == "content" and request is not None:
        return f"messages[{request.last_index}].content"
    return name


@dataclass(slots=True)
class CompletionRequest:
    """``content`` is the last message's: the user's, or a tool's result for the call
    ``tool_call_id`` names (a tool loop's next turn)."""

    model: str
    prior: list[ChatTurn]
    content: str
    params: dict[str, Any]
    stream: bool = False
    include_usage: bool = False
    last_index: int = 0
    tool_call_id: str = ""
    # Our param name -> the caller's, where they differ (``max_tokens`` sent as
    # ``max_completion_tokens``), so an error names what the caller sent.
    spelled: dict[str, str] = field(default_factory=dict)


def _text(content: Any, where: str) -> str:
    """Every message's text is held to what a posted message is (``MAX_MESSAGE_CHARS``,
    storable): each is stored as a message of the conversation and sent in every later
    prompt of it, whichever turn it is."""
    text = _joined(content, where)
    if len(text) > settings.MAX_MESSAGE_CHARS:
        raise InvalidParams(too_long(settings.MAX_MESSAGE_CHARS, text), field=where)
    if not is_storable(text):
        raise InvalidParams(UNSTORABLE, field=where)
    return text


def _joined(content: Any, where: str) -> str:
    """A message's text: its string, or its text parts one to a line, as vLLM joins them
    for a chat template that takes a message's content as a string (a text model's): a
    caller's parts ("Translate to French:", "Good morning") are not run together into
    one line the model would read otherwise."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise InvalidParams("only text content parts are supported", field=f"{where}[{i}]")
            if not isinstance(part.get("text"), str):
                raise InvalidParams("must be a string", field=f"{where}[{i}].text")
            parts.append(part["text"])
        return "\n".join(parts)
    raise InvalidParams("must be a string or a list of text parts", field=where)


def _flag(body: dict[str, Any], name: str, where: str | None = None) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidParams("must be a boolean", field=where or name)
    return value


def _same(value: Any, default: Any) -> bool:
    """``value`` is ``default`` as JSON means it: ``0`` and ``0.0`` are, ``false`` and
    ``0`` are not."""
    return (type(value) is bool) == (type(default) is bool) and value == default


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _unrecognized(names: list[str], where: str = "") -> InvalidParams:
    """OpenAI's wording, so a caller's error handling (and searching) finds it."""
    spelled = [f"{where}{name}" for name in names]
    plural = "s" if len(spelled) > 1 else ""
    message = f"Unrecognized request argument{plural} supplied: {', '.join(spelled)}"
    return InvalidParams(message, field=spelled[0])


def _check_keys(body: dict[str, Any]) -> None:
    """Refuse what would make the answer other than what was asked for (see ``KNOWN``)."""
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        raise _unrecognized(unknown)
    for name, defaults in DEFAULT_ONLY.items():
        if body.get(name) is not None and not any(_same(body[name], d) for d in defaults):
            accepted = f" (only {_json(defaults[0])} is accepted)" if defaults else ""
            raise InvalidParams(f"is not supported by this server{accepted}", field=name)
    for name, (kind, wanted) in IGNORED.items():
        if body.get(name) is not None and not isinstance(body[name], kind):
            raise InvalidParams(wanted, field=name)
    for name in INTEGERS:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidParams("must be an integer", field=name)
    if body.get("n") not in (None, 1):
        raise InvalidParams("only n=1 is supported", field="n")


def _max_tokens(body: dict[str, Any]) -> tuple[Any, str]:
    """The answer's token budget and the name it was sent under: ``max_completion_tokens``
    (OpenAI's current name) wins over ``max_tokens`` (its deprecated one); a null is absent,
    as a client that sets every field it knows sends the one it does not use as null."""
    for name in ("max_completion_tokens", "max_tokens"):
        if body.get(name) is not None:
            return body[name], name
    return None, ""


def _stream_options(body: dict[str, Any], stream: bool) -> bool:
    """Whether the stream ends with a usage chunk."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise InvalidParams("is only allowed with stream=true", field="stream_options")
    if not isinstance(options, dict):
        raise InvalidParams("must be an object", field="stream_options")
    unknown = sorted(set(options) - STREAM_OPTIONS)
    if unknown:
        raise _unrecognized(unknown, "stream_options.")
    _flag(options, "include_obfuscation", "stream_options.include_obfuscation")
    return _flag(options, "include_usage", "stream_options.include_usage")


def parse_request(body: Any, served: set[str]) -> CompletionRequest:
    """Validate a chat-completions body; raises ``ServiceError``s naming the field as the
    caller spelled it. Whether each ``tool`` message answers a call made before it is
    the service's to check (a continued conversation's stored calls count)."""
    if not isinstance(body, dict):
        raise InvalidParams("must be a JSON object", field="body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidParams("must be a non-empty string", field="model")
    if not is_storable(model):
        raise InvalidParams(UNSTORABLE, field="model")
    if model not in served:
        raise ModelNotFound(f"the model `{model}` does not exist", field="model")
    _check_keys(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidParams("must be a non-empty list of messages", field="messages")
    turns: list[ChatTurn] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidParams("must be an object", field=f"messages[{i}]")
        raw_role = message.get("role")
        role = ROLES.get(raw_role) if isinstance(raw_role, str) else None
        if role is None:
            raise InvalidParams(
                f"must be one of {', '.join(sorted(ROLES))}", field=f"messages[{i}].role"
            )
        turns.append(_turn(message, role, f"messages[{i}]"))
    last = len(turns) - 1
    if turns[last].role not in ("user", "tool"):
        raise InvalidParams(
            "the last message must be the user's or a tool's result",
            field=f"messages[{last}].role",
        )
    stream = _flag(body, "stream")
    include_usage = _stream_options(body, stream)
    params: dict[str, Any] = {k: body[k] for k in PASSED_PARAMS if body.get(k) is not None}
    spelled: dict[str, str] = {}
    max_tokens, name = _max_tokens(body)
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
        spelled["max_tokens"] = name
    return CompletionRequest(
        model=model,
        prior=turns[:last],
        content=turns[last].content,
        params=params,
        stream=stream,
        include_usage=include_usage,
        last_index=last,
        tool_call_id=turns[last].tool_call_id,
        spelled=spelled,
    )


def _turn(message: dict[str, Any], role: str, where: str) -> ChatTurn:
    """One message: an assistant's may carry ``tool_calls`` (its content then may be
    null), a tool's must name the call it answers (``tool_call_id``)."""
    content = _text(message.get("content"), f"{where}.content")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id or len(call_id) > MAX_CALL_ID_CHARS:
            raise InvalidParams(
                "must be the id of the call answered", field=f"{where}.tool_call_id"
            )
        if not is_storable(call_id):
            raise InvalidParams(UNSTORABLE, field=f"{where}.tool_call_id")
        return ChatTurn(role, content, tool_call_id=call_id)
    raw_calls = message.get("tool_calls")
    if role != "assistant" or raw_calls is None:
        return ChatTurn(role, content)
    if not isinstance(raw_calls, list) or len(raw_calls) > MAX_TOOL_CALLS:
        raise InvalidParams(
            f"must be a list of at most {MAX_TOOL_CALLS} tool calls", field=f"{where}.tool_calls"
        )
    calls = []
    for j, call in enumerate(raw_calls):
        # Held to what the calls it stands for are: an id a tool message can answer, a
        # function name a tool can have, arguments no longer than a message (each is
        # stored and goes into every later prompt).
        at = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(call, dict) or not isinstance(call.get("id"), str) or not call["id"]:
            raise InvalidParams("must have an id", field=f"{at}.id")
        if len(call["id"]) > MAX_CALL_ID_CHARS:
            raise InvalidParams(too_long(MAX_CALL_ID_CHARS, call["id"]), field=f"{at}.id")
        if call.get("type", "function") != "function":
            raise InvalidParams('must be "function"', field=f"{at}.type")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidParams("must name the function", field=f"{at}.function.name")
        if not TOOL_NAME.fullmatch(function["name"]):
            raise InvalidParams("must be 1-64 of A-Z a-z 0-9 _ . -", field=f"{at}.function.name")
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            raise InvalidParams("must be a JSON string", field=f"{at}.function.arguments")
        if len(arguments) > settings.MAX_MESSAGE_CHARS:
            raise InvalidParams(
                too_long(settings.MAX_MESSAGE_CHARS, arguments),
                field=f"{at}.function.arguments",
            )
        fields = (call["id"], function["name"], arguments)
        if not all(is_storable(value) for value in fields):
            raise InvalidParams(UNSTORABLE, field=at)
        calls.append(
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    return ChatTurn(role, content, tool_calls=tuple(calls))


def usage_of(termination: dict[str, Any]) -> dict[str, Any]:
    prompt = int(termination.get("prompt_tokens") or 0)
    completion_tokens = int(termination.get("completion_tokens") or 0)
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }
    if termination.get("reasoning_tokens") is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": termination["reasoning_tokens"]}
    return usage


# Refusals that a new request would get again; a timeout or a rate limit may pass.
_TRANSIENT_REFUSALS = frozenset({408, 409, 429})


def would_repeat(error: dict[str, Any]) -> bool:
    """Whether the same request would fail the same way: the engine refused it (a 4xx of
    its own but a timeout or a rate limit) or the conversation fills the model's context.
    A client is told not to retry such a failure (``x-should-retry: false``, which the
    OpenAI SDKs obey): each retry would store one more failed answer."""
    code = error.get("code")
    if code == "context_full":
        return True
    if not isinstance(code, int | str):
        return False
    try:
        status = int(code)  # vLLM says its HTTP status, as an int or a string
    except ValueError:
        return False
    return 400 <= status < 500 and status not in _TRANSIENT_REFUSALS


def termination_error(termination: dict[str, Any]) -> dict[str, Any]:
    """The in-band error object for an answer that failed without an ``error`` event."""
    status = termination.get("status")
    return {
        "message": termination.get("error_message") or f"the answer ended {status}",
        "type": termination.get("error_type") or "EngineError",
        "code": termination.get("error_code") or status,
    }


class ChunkStream:
    """Renders one message's events as OpenAI stream frames (bytes)."""

    def __init__(self, completion_id: str, model: str, created: int, include_usage: bool) -> None:
        self.completion_id = completion_id
        self.model = model
        self.created = created
        self.include_usage = include_usage
        self.role_sent = False
        self.error_sent = False
        self.finished = False

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def _role(self) -> bytes:
        if self.role_sent:
            return b""
        self.role_sent = True
        return eventstream.data(self._chunk({"role": "assistant", "content": ""}))

    def frames(self, batch: list[events.Event]) -> bytes:
        out = bytearray()
        for event in batch:
            kind = event["type"]
            if kind == events.START:
                out += self._role()
            elif kind == events.DELTA and event["text"]:
                out += self._role()
                out += eventstream.data(self._chunk({"content": event["text"]}))
            elif kind == events.REASONING and event["text"]:
                out += self._role()
                out += eventstream.data(self._chunk({"reasoning": event["text"]}))
            elif kind == events.TOOL_CALL:
                out += self._role()
                out += eventstream.data(self._chunk({"tool_calls": [_tool_call_delta(event)]}))
            elif kind == events.ERROR:
                out += self.error(event["error"])
            elif kind == events.DONE:
                out += self._done(event)
        return bytes(out)

    def error(self, error: dict[str, Any]) -> bytes:
        if self.error_sent:
            return b""
        self.error_sent = True
        return eventstream.data({"error": error})

    def _done(self, done: events.Event) -> bytes:
        out = bytearray(self._role())
        status = done.get("status")
        if status in FAILED:
            out += self.error(termination_error(done))
        elif not self.error_sent:
            out += eventstream.data(self._chunk({}, finish_reason_of(done)))
            if self.include_usage:
                usage = self._chunk({})
                usage["choices"] = []
                usage["usage"] = usage_of(done)
                out += eventstream.data(usage)
        out += eventstream.DONE
        self.finished = True
        return bytes(out)


def finish_reason_of(termination: dict[str, Any]) -> str:
    """OpenAI's finish reason for a termination record."""
    if termination.get("finish_reason") == "tool_calls":
        return "tool_calls"
    return FINISH_REASONS.get(str(termination.get("status", "")), "stop")


def _tool_call_delta(event: events.Event) -> dict[str, Any]:
    """A ``tool_call`` event as OpenAI streams it: the first piece of a call with its id,
    type and name, every piece with its fragment of the arguments."""
    piece: dict[str, Any] = {"index": event["index"]}
    if event["id"]:
        piece["id"] = event["id"]
        piece["type"] = "function"
    function: dict[str, Any] = {"arguments": event["arguments"]}
    if event["name"]:
        function = {"name": event["name"], **function}
    piece["function"] = function
    return piece


def completion(
    completion_id: str,
    model: str,
    created: int,
    text: str,
    termination: dict[str, Any],
    reasoning: str = "",
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` object; ``message.reasoning`` (vLLM's name)
    holds the reasoning when there was any, ``message.tool_calls`` the calls."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        message["reasoning"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
        message["content"] = text or None
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason_of(termination),
            }
        ],
        "usage": usage_of(termination),
    }
