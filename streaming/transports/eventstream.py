"""The ``text/event-stream`` framing, for both SSE endpoints (ours and OpenAI's).

One place for the response headers (no caching, no proxy buffering, no compression), the
frames of our event schema (``id``/``event``/``data``), ``data:``-only frames (OpenAI's
chunks), the ``: ping`` keep-alive, the ``retry:`` hint and OpenAI's ``[DONE]``.
"""

from __future__ import annotations

from typing import Any

from streaming.events import Event, encode

HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache, no-store, no-transform"),
    (b"x-accel-buffering", b"no"),
    (b"content-encoding", b"identity"),
]
PING = b": ping\n\n"
# A stream's first bytes when no event is ready yet: a comment, which every client skips
# (its head reaches the client at once, before the first token).
OPEN = b": open\n\n"
DONE = b"data: [DONE]\n\n"


def frame(event: Event) -> bytes:
    """``id`` / ``event`` / ``data`` lines; the payload is one line of compact JSON."""
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (
        event["seq"],
        event["type"].encode(),
        encode(event),
    )


def frames(events: list[Event]) -> bytes:
    return b"".join(frame(e) for e in events)


def data(obj: dict[str, Any]) -> bytes:
    """A ``data:``-only frame (OpenAI's stream format)."""
    return b"data: %s\n\n" % encode(obj)


def named(name: str, obj: dict[str, Any]) -> bytes:
    """An ``event`` / ``data`` frame without an ``id`` (not part of the resumable stream)."""
    return b"event: %s\ndata: %s\n\n" % (name.encode(), encode(obj))


def retry(ms: int) -> bytes:
    """The ``retry:`` field, to go at the head of an event's block: a block of it alone is
    valid SSE, but some client libraries (httpx-sse) hand it over as an event with empty
    data, which code that reads every event as JSON fails on."""
    return f"retry: {ms}\n".encode()
