"""The event schema shared by every transport, and its WebSocket framing (the SSE framing
is ``streaming.transports.eventstream``).

An event is a plain dict ``{"seq": N, "type": ..., ...}``; ``seq`` increases per message
across all of its segments, so a reader's cursor is one integer on every transport.
``delta`` carries answer text, ``reasoning`` the model's reasoning (shown apart, never
part of the answer). Readers merge consecutive events of one text type before writing
(``merge``): a slow or busy reader sends fewer, larger frames and never falls behind the
log by more than one write.
"""

from __future__ import annotations

import json
from typing import Any

Event = dict[str, Any]

START = "start"
DELTA = "delta"
REASONING = "reasoning"
ERROR = "error"
# The event types that carry text, merged run by run.
TEXT_TYPES = frozenset({DELTA, REASONING})
DONE = "done"


def start(seq: int, *, message_id: str, segment: int, model: str) -> Event:
    return {"seq": seq, "type": START, "message_id": message_id, "segment": segment, "model": model}


def delta(seq: int, text: str, emitted_at: float | None = None) -> Event:
    event: Event = {"seq": seq, "type": DELTA, "text": text}
    if emitted_at is not None:
        event["t"] = emitted_at
    return event


def reasoning(seq: int, text: str) -> Event:
    return {"seq": seq, "type": REASONING, "text": text}


def error(seq: int, *, message: str, type: str, code: Any = None) -> Event:
    return {"seq": seq, "type": ERROR, "error": {"message": message, "type": type, "code": code}}


def done(seq: int, *, segment: int, termination: dict[str, Any]) -> Event:
    return {"seq": seq, "type": DONE, "segment": segment, **termination}


def merge(events: list[Event]) -> list[Event]:
    """Collapse runs of consecutive deltas (or reasoning events) into one event of that
    type carrying the run's last seq; a delta and a reasoning event never merge.

    The merged delta keeps the *earliest* emit stamp so latency measurements stay honest.
    Linear in the text: a run's texts are joined once (a replayed page is hundreds).
    """
    merged: list[Event] = []
    run: list[Event] = []

    def close_run() -> None:
        if len(run) == 1:
            merged.append(run[0])
        elif run:
            combined: Event = {
                "seq": run[-1]["seq"],
                "type": run[0]["type"],
                "text": "".join(e["text"] for e in run),
            }
            if "t" in run[0]:
                combined["t"] = run[0]["t"]
            merged.append(combined)
        run.clear()

    for event in events:
        kind = event["type"]
        if kind in TEXT_TYPES and (not run or run[0]["type"] == kind):
            run.append(event)
        elif kind in TEXT_TYPES:
            close_run()
            run.append(event)
        else:
            close_run()
            merged.append(event)
    close_run()
    return merged


# One encoder for the process: ``json.dumps`` with options builds a new encoder per call,
# and every event is encoded at least twice (the log entry, the frame).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def dumps(event: Event) -> str:
    return _ENCODER.encode(event)


def ws_frame(event: Event, message_id: str) -> str:
    return dumps({**event, "message_id": message_id})
