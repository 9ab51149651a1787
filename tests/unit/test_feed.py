"""The feed hands each user's events to that user's listeners only, in the order they
were published, however many travel in one control message."""

from __future__ import annotations

from typing import Any

import pytest

from streaming.control.memory import MemoryControl
from streaming.feed import FEED_QUEUE, Feed

pytestmark = pytest.mark.asyncio


class Recorded(MemoryControl):
    """The in-memory control, keeping what went over it."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[dict[str, Any]] = []

    async def send(self, message_id: str, message: dict[str, Any]) -> None:
        self.sent.append(message)
        await super().send(message_id, message)


async def started() -> tuple[Feed, Recorded]:
    control = Recorded()
    feed = Feed(control)

    async def handler(message: dict[str, Any]) -> None:
        assert feed.handles(message)

    await control.start(handler)
    return feed, control


def drained(listener: Any) -> list[dict[str, Any]]:
    events = []
    while not listener.queue.empty():
        events.append(listener.queue.get_nowait())
    return events


async def test_a_batch_reaches_the_users_listeners_in_order_in_one_message() -> None:
    feed, control = await started()
    tabs = [feed.listen(7), feed.listen(7)]
    stranger = feed.listen(8)
    batch = [
        {"event": "conversation.created", "conversation": "c", "title": ""},
        {"event": "conversation.updated", "conversation": "c", "title": "hi"},
        {"event": "message.created", "conversation": "c", "message_id": "m"},
    ]
    await feed.publish(7, batch)
    assert len(control.sent) == 1
    for tab in tabs:
        assert drained(tab) == batch
    assert drained(stranger) == []


@pytest.mark.parametrize(
    "message",
    [
        {"type": "user_events", "user": 7, "events": "not a list"},
        {"type": "user_events", "events": [{"event": "x"}]},
        {"type": "user_events", "user": "7", "events": [{"event": "x"}]},
    ],
)
async def test_a_malformed_message_is_taken_and_delivers_nothing(message: dict[str, Any]) -> None:
    feed, _ = await started()
    tab = feed.listen(7)
    assert feed.handles(message)
    assert drained(tab) == []


async def test_other_control_messages_are_not_the_feeds() -> None:
    feed, _ = await started()
    assert not feed.handles({"type": "cancel", "message_id": "m"})


async def test_a_listener_that_does_not_read_is_marked_lagging_and_bounded() -> None:
    feed, _ = await started()
    tab = feed.listen(7)
    await feed.publish(7, [{"event": "e", "n": n} for n in range(FEED_QUEUE + 5)])
    assert tab.lagging and tab.queue.qsize() == FEED_QUEUE
    assert drained(tab)[-1] == {"event": "e", "n": FEED_QUEUE - 1}
