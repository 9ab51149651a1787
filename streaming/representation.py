"""How the API describes a message and its segments: the JSON of every message answer.

One description for every entry point that answers with messages: the REST serializers
(``streaming.api.serializers``, whose declared fields are the schema of this JSON; a test
checks that DRF's generic representation of them gives the same) and the lean one-step
``POST`` (``streaming.transports.leanpost``), whose ``created`` event must be the REST
201's body exactly.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from django.utils import timezone

from streaming.branches import sibling_ids
from streaming.models import Message, Segment

SEGMENT_FIELDS = (
    "index", "start_offset", "end_offset", "reasoning_start_offset", "reasoning_end_offset",
    "first_seq", "status", "finish_reason", "stop_reason", "prompt_tokens",
    "completion_tokens", "reasoning_tokens", "ttft_ms", "reasoning_ttft_ms", "duration_ms",
    "has_unclosed_code_block", "is_valid_json", "error_type", "error_message", "error_code",
    "context_full", "ended_in_reasoning", "tool_calls", "started_at", "ended_at",
)  # fmt: skip
MESSAGE_FIELDS = (
    "id", "conversation", "parent_id", "siblings", "role", "content", "reasoning",
    "tool_calls", "tool_call_id", "status", "termination", "params", "model", "last_seq",
    "created_at", "updated_at", "segments", "stream",
)  # fmt: skip

# A path on this server -> the URL a client reaches it at (``build_absolute_uri``).
Absolute = Callable[[str], str]


def plain(value: Any) -> Any:
    """A model attribute as DRF's field for it represents it (UTC datetimes end in Z)."""
    if isinstance(value, datetime):
        text = value.astimezone(timezone.get_current_timezone()).isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def segment_data(segment: Segment) -> dict[str, Any]:
    return {name: plain(getattr(segment, name)) for name in SEGMENT_FIELDS}


def stream_urls(message: Message, absolute: Absolute | None) -> dict[str, str]:
    """Where an answer streams: absolute URLs when the request they answer is known."""
    sse = f"/api/messages/{message.id}/stream/"
    ws = "/ws/chat/"
    if absolute is not None:
        sse = absolute(sse)
        ws = absolute(ws).replace("http", "ws", 1)
    return {"sse": sse, "ws": ws, "message_id": str(message.id)}


def message_data(
    message: Message,
    siblings: Sequence[str] | None = None,
    absolute: Absolute | None = None,
) -> dict[str, Any]:
    """``siblings``: the ids sharing the message's parent when the caller knows them
    (otherwise they cost one query); the segments are read through
    ``message.segments.all()``, so a caller that prefetched them pays no query."""
    data: dict[str, Any] = {}
    for name in MESSAGE_FIELDS:
        if name == "conversation":
            data[name] = str(message.conversation_id)
        elif name == "segments":
            data[name] = [segment_data(s) for s in message.segments.all()]
        elif name == "stream":
            is_answer = message.role == Message.Role.ASSISTANT
            data[name] = stream_urls(message, absolute) if is_answer else None
        elif name == "siblings":
            data[name] = (
                list(siblings)
                if siblings is not None
                else sibling_ids(message.conversation_id, message.parent_id)
            )
        else:
            data[name] = plain(getattr(message, name))
    return data
