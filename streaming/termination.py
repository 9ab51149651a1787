"""Why a segment ended: the termination record.

One record shape is persisted on every Segment, copied onto its Message and sent in the
`done` event, so a client, the admin and the metrics all tell the same story. User Stop
(`cancelled`) and "every reader left" (`abandoned`) are different statuses on purpose.

Which process generated a segment is not part of the record: it is an operator's fact
(host and pid), kept on the `Segment` row for the reaper, the admin and the logs, and never
sent to the user who asked.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from django.db import models

from streaming.shape import has_unclosed_code_block, json_validity


class Status(models.TextChoices):
    STREAMING = "streaming", "Streaming"
    COMPLETE = "complete", "Complete"
    TRUNCATED = "truncated", "Truncated (max tokens)"
    STOPPED = "stopped", "Stopped (stop sequence)"
    CANCELLED = "cancelled", "Cancelled by the user"
    ABANDONED = "abandoned", "Abandoned (no reader left)"
    ERROR = "error", "Engine or server error"
    STALLED = "stalled", "Stalled (no tokens)"
    INTERRUPTED = "interrupted", "Interrupted (process died)"


FINAL_STATUSES = frozenset(s.value for s in Status if s != Status.STREAMING)
# A message ending in one of these is finished as the model meant it; Continue refuses them.
NATURAL_ENDS = frozenset({Status.COMPLETE.value, Status.STOPPED.value})


@dataclass(slots=True)
class Termination:
    status: str
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Of the completion tokens, the reasoning's (None: the engine does not say).
    reasoning_tokens: int | None = None
    # Generation start -> the first answer token, and -> the first reasoning token.
    ttft_ms: float | None = None
    reasoning_ttft_ms: float | None = None
    duration_ms: float | None = None
    has_unclosed_code_block: bool = False
    is_valid_json: bool | None = None
    error_type: str | None = None
    error_message: str | None = None
    error_code: str | None = None
    # The prompt and the answer fill the model's context: no Continue can add anything.
    context_full: bool = False
    # The segment ended while the model was still reasoning: no answer text came after it.
    ended_in_reasoning: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The record's fields by name. Every value is a str, number, bool or None, so
        a shallow copy is the whole copy (``dataclasses.asdict`` walks each value for
        containers to copy, several times the cost, once per answer end)."""
        return {name: getattr(self, name) for name in _FIELDS}

    def inspect_text(self, text: str) -> None:
        """Record the shape of the whole answer: what a cut-off did to code and JSON."""
        self.has_unclosed_code_block = has_unclosed_code_block(text)
        self.is_valid_json = json_validity(text)


_FIELDS = tuple(f.name for f in fields(Termination))
