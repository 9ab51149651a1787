"""The event schema's framings and merge-on-read."""

from __future__ import annotations

import json
import tracemalloc

from streaming import events


def test_merge_collapses_runs_of_deltas_keeping_the_last_seq_and_first_stamp():
    batch = [
        events.start(1, message_id="m", segment=0, model="x"),
        events.delta(2, "a", emitted_at=10.0),
        events.delta(3, "b", emitted_at=11.0),
        events.delta(4, "c"),
        events.error(5, message="boom", type="E", code=1),
        events.delta(6, "d"),
        events.done(7, segment=0, termination={"status": "error"}),
    ]
    merged = events.merge(batch)
    assert [e["type"] for e in merged] == ["start", "delta", "error", "delta", "done"]
    assert merged[1] == {"seq": 4, "type": "delta", "text": "abc", "t": 10.0}
    assert merged[3]["seq"] == 6
    assert "".join(e["text"] for e in merged if e["type"] == "delta") == "abcd"


def test_ws_frame_adds_the_message_id():
    payload = json.loads(events.ws_frame(events.delta(3, "x"), "mid"))
    assert payload == {"seq": 3, "type": "delta", "text": "x", "message_id": "mid"}


def test_ws_frame_of_an_event_naming_its_message_names_it_once():
    frame = events.ws_frame(events.start(1, message_id="mid", segment=0, model="m"), "mid")
    assert frame.count('"message_id"') == 1
    assert json.loads(frame)["message_id"] == "mid"


def test_a_logged_event_is_encoded_once_and_shared():
    """The log entry's bytes are what every reader's frame carries: no second encoding."""
    logged = events.Logged(events.delta(7, '日本語 "quoted" 🚀'))
    assert events.encode(logged) is logged.encoded
    # Compact, and UTF-8 as is: never \\u escapes.
    assert logged.encoded == '{"seq":7,"type":"delta","text":"日本語 \\"quoted\\" 🚀"}'.encode()
    decoded = events.Logged(events.decode(logged.encoded), logged.encoded)
    assert decoded == logged and events.encode(decoded) is logged.encoded
    ws = json.loads(events.ws_frame(logged, "mid"))
    assert ws == {**logged, "message_id": "mid"}


def test_merge_keeps_reasoning_and_answer_apart():
    batch = [
        events.reasoning(2, "Let me "),
        events.reasoning(3, "think."),
        events.delta(4, "Four"),
        events.delta(5, "."),
        events.reasoning(6, "Hm."),
    ]
    assert events.merge(batch) == [
        {"seq": 3, "type": "reasoning", "text": "Let me think."},
        {"seq": 5, "type": "delta", "text": "Four."},
        {"seq": 6, "type": "reasoning", "text": "Hm."},
    ]


def test_merge_joins_the_pieces_of_one_tool_call():
    batch = [
        events.tool_call(2, index=0, id="call_1", name="get_weather", arguments=""),
        events.tool_call(3, index=0, arguments='{"city":'),
        events.tool_call(4, index=0, arguments='"Paris"}'),
        events.tool_call(5, index=1, id="call_2", name="get_time", arguments="{}"),
    ]
    merged = events.merge(batch)
    assert merged == [
        events.tool_call(4, index=0, id="call_1", name="get_weather", arguments='{"city":"Paris"}'),
        events.tool_call(5, index=1, id="call_2", name="get_time", arguments="{}"),
    ]
    calls = events.ToolCalls()
    for event in batch:
        calls.add(event)
    assert calls.as_list() == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
        },
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ]


def test_a_logged_events_encoding_takes_the_memory_of_its_length():
    """A topic's tail and the in-memory log keep encodings for as long as the events:
    each must cost its length, not the encoder's working buffer."""
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        kept = [events.Logged(events.delta(i, "lorem ")) for i in range(1000)]
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    one = len(kept[0].encoded)
    # The event's dict and its bytes, with room for the allocator: far from 4 KiB each.
    assert grown / len(kept) < 1024, f"{grown / len(kept):.0f} bytes per event of {one}"
