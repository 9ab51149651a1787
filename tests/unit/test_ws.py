"""The WebSocket consumer's frame rules that need no socket: which fields each frame
type takes (the socket tests in ``tests/badinput`` send them for real)."""

from __future__ import annotations

import pytest

from streaming.transports import ws


def test_every_frame_type_says_which_fields_it_takes() -> None:
    assert set(ws.FIELDS) == set(ws.ChatConsumer.HANDLERS)


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        ({"type": "message.create", "content": "hi", "max_tokens": 2}, "max_tokens"),
        ({"type": "subscribe", "message_id": "m", "zzz": 1, "aaa": 1}, "aaa"),  # the first
        ({"type": "ping", "token": "t"}, "token"),
    ],
)
def test_a_field_the_type_does_not_take_is_refused_by_name(frame: dict, field: str) -> None:
    with pytest.raises(ws.FrameError) as refused:
        ws._refuse_unknown_fields(frame["type"], frame)
    assert (refused.value.code, refused.value.field) == ("invalid_frame", field)
    assert refused.value.message.startswith(f"{field} ")


def test_the_documented_fields_and_ref_pass() -> None:
    create = {"type": "message.create", "ref": 1, "conversation": None, "content": "hi"}
    extra = {"params": {}, "model": "", "subscribe": True, "idempotency_key": "k"}
    ws._refuse_unknown_fields("message.create", {**create, **extra})
    ws._refuse_unknown_fields("subscribe", {"type": "subscribe", "topic": "user"})
