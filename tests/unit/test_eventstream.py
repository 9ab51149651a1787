"""The text/event-stream framing shared by the SSE and OpenAI-compatible endpoints."""

from __future__ import annotations

import json

from streaming import events
from streaming.transports import eventstream


def test_sse_frame_is_one_event_with_id_type_and_single_line_json():
    frame = eventstream.frame(events.delta(9, "line1\nline2 👩‍👩‍👧 é"))
    text = frame.decode()
    assert text.endswith("\n\n")
    lines = text.rstrip("\n").split("\n")
    assert lines[0] == "id: 9"
    assert lines[1] == "event: delta"
    assert lines[2].startswith("data: ") and len(lines) == 3
    assert json.loads(lines[2][6:])["text"] == "line1\nline2 👩‍👩‍👧 é"


def test_data_frames_and_the_fixed_frames() -> None:
    assert eventstream.data({"a": "é"}) == 'data: {"a":"é"}\n\n'.encode()
    assert eventstream.DONE == b"data: [DONE]\n\n"
    assert eventstream.PING.startswith(b":")
    # A field for the head of an event's block, never a block of its own (some clients
    # hand a retry-only block over as an event with empty data).
    assert eventstream.retry(1500) == b"retry: 1500\n"
    assert eventstream.OPEN.startswith(b":") and eventstream.OPEN.endswith(b"\n\n")
    headers = dict(eventstream.HEADERS)
    assert headers[b"content-type"].startswith(b"text/event-stream")
    assert headers[b"x-accel-buffering"] == b"no"
