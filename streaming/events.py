"""The event schema shared by every transport, and its WebSocket framing (the SSE framing
is ``streaming.transports.eventstream``).

An event is a plain dict ``{"seq": N, "type": ..., ...}``; ``seq`` increases per message
across all of its segments, so a reader's cursor is one integer on every transport.
``delta`` carries answer text, ``reasoning`` the model's reasoning (shown apart, never
part of the answer), ``tool_call`` a piece of a tool call the model makes (its ``index``;
the first piece its ``id`` and ``name``, every piece a fragment of its JSON
``arguments``). Readers merge consecutive events of one kind before writing (``merge``):
a slow or busy reader sends fewer, larger frames and never falls behind the log by more
than one write.

An event the log holds never changes again (``Logged``), so its JSON is encoded once and
shared: by the log entry and by the frame of every reader it reaches, in this process and,
decoded from the log's own bytes, in every other.
"""

from __future__ import annotations

from typing import Any

import orjson

Event = dict[str, Any]


class Logged(dict[str, Any]):
    """An event as the log holds it, with its compact JSON (``encoded``). Not to be
    changed: the encoding is what readers are sent.

    The encoding is kept as long as the event (a topic's tail, the in-memory log), so it
    is a right-sized copy: orjson's own result keeps the whole buffer it wrote into
    (4 KiB for a 70-byte event) however short the JSON is."""

    __slots__ = ("encoded",)

    def __init__(self, event: Event, encoded: bytes | None = None) -> None:
        super().__init__(event)
        self.encoded = bytes(memoryview(orjson.dumps(event))) if encoded is None else encoded


START = "start"
DELTA = "delta"
REASONING = "reasoning"
TOOL_CALL = "tool_call"
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


def tool_call(seq: int, *, index: int, id: str = "", name: str = "", arguments: str = "") -> Event:
    return {
        "seq": seq,
        "type": TOOL_CALL,
        "index": index,
        "id": id,
        "name": name,
        "arguments": arguments,
    }


class ToolCalls:
    """Whole tool calls from their pieces (``tool_call`` events), in OpenAI's shape:
    ``[{"id", "type": "function", "function": {"name", "arguments"}}]`` by index."""

    def __init__(self) -> None:
        self.calls: dict[int, dict[str, Any]] = {}

    def add(self, event: Event) -> None:
        call = self.calls.setdefault(
            event["index"],
            {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
        )
        call["id"] = call["id"] or event["id"]
        call["function"]["name"] = call["function"]["name"] or event["name"]
        call["function"]["arguments"] += event["arguments"]

    def as_list(self) -> list[dict[str, Any]]:
        return [self.calls[index] for index in sorted(self.calls)]


def error(seq: int, *, message: str, type: str, code: Any = None) -> Event:
    return {"seq": seq, "type": ERROR, "error": {"message": message, "type": type, "code": code}}


def done(seq: int, *, segment: int, termination: dict[str, Any]) -> Event:
    return {"seq": seq, "type": DONE, "segment": segment, **termination}


def up_to_done(events: list[Event], after: int) -> tuple[list[Event], bool]:
    """``events`` up to the first ``done`` with a seq above ``after``, and whether there
    was one. A segment's ``done`` and the next segment's first events (a Continue started
    at once, perhaps in another process) can come in one batch: a stream that ends with
    that ``done`` must not run on into the next segment."""
    for index, event in enumerate(events):
        if event["type"] == DONE and event["seq"] > after:
            return events[: index + 1], True
    return events, False


def merge(events: list[Event]) -> list[Event]:
    """Collapse runs of consecutive deltas (or reasoning events) into one event of that
    type carrying the run's last seq; a delta and a reasoning event never merge. A run of
    pieces of one tool call becomes one piece with all their arguments.

    The merged delta keeps the *earliest* emit stamp so latency measurements stay honest.
    Linear in the text: a run's texts are joined once (a replayed page is hundreds).
    """
    merged: list[Event] = []
    run: list[Event] = []

    def close_run() -> None:
        if len(run) == 1:
            merged.append(run[0])
        elif run and run[0]["type"] == TOOL_CALL:
            first = run[0]
            merged.append(
                {
                    **first,
                    "seq": run[-1]["seq"],
                    "id": next((e["id"] for e in run if e["id"]), ""),
                    "name": next((e["name"] for e in run if e["name"]), ""),
                    "arguments": "".join(e["arguments"] for e in run),
                }
            )
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
        if run and not _same_run(run[0], event):
            close_run()
        if event["type"] in TEXT_TYPES or event["type"] == TOOL_CALL:
            run.append(event)
        else:
            merged.append(event)
    close_run()
    return merged


def _same_run(first: Event, event: Event) -> bool:
    """Whether ``event`` merges into the run that ``first`` began."""
    if first["type"] != event["type"]:
        return False
    return bool(first["type"] != TOOL_CALL or first["index"] == event["index"])


def encode(event: Event) -> bytes:
    """Compact UTF-8 JSON (nothing escaped to ASCII); a ``Logged`` event's is reused."""
    if type(event) is Logged:
        return event.encoded
    return orjson.dumps(event)


def decode(raw: bytes | str) -> Any:
    return orjson.loads(raw)


def ws_frame(event: Event, message_id: str) -> str:
    """The event with the id of its message (a socket may follow several)."""
    encoded = encode(event)
    if "message_id" not in event:
        # The event's own JSON with one more member: an object, never empty (it has a seq).
        encoded = b'%s,"message_id":%s}' % (encoded[:-1], orjson.dumps(message_id))
    return encoded.decode()
