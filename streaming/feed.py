"""The per-user event feed: what the other open tabs of one user need to stay in step.

The services publish an event (a conversation created, renamed, titled or deleted, a
message created, a branch switched) once their transaction has committed; it travels over
control to every serving process, and each hands it to that user's listeners there (their
WebSocket sockets that subscribed). Delivery is at most once, as for control: a tab that
was away (a reconnect) refetches what it shows. Events are rare next to tokens (a few per
answer), so they share control's path, never the streams'.

A listener holds a bounded queue; one that falls ``FEED_QUEUE`` events behind is marked
``lagging`` and gets no more until it is read, so a socket that does not read costs at
most that many events.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import Any

from streaming import metrics
from streaming.control import Control

log = logging.getLogger(__name__)

# A control message of feed events: {"type", "user", "events": [...]}.
USER_EVENTS = "user_events"
FEED_QUEUE = 256


class Listener:
    """One socket's view of its user's feed: ``get`` the next event."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(FEED_QUEUE)
        self.lagging = False

    def put(self, event: dict[str, Any]) -> None:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.lagging = True

    async def get(self) -> dict[str, Any]:
        return await self.queue.get()


class Feed:
    def __init__(self, control: Control) -> None:
        self.control = control
        self.listeners: defaultdict[int, set[Listener]] = defaultdict(set)

    def listen(self, user_id: int) -> Listener:
        listener = Listener()
        self.listeners[user_id].add(listener)
        metrics.FEED_LISTENERS.inc()
        return listener

    def forget(self, user_id: int, listener: Listener) -> None:
        mine = self.listeners.get(user_id)
        if mine is None or listener not in mine:
            return
        mine.discard(listener)
        metrics.FEED_LISTENERS.dec()
        if not mine:
            del self.listeners[user_id]

    async def publish(self, user_id: int, events: list[dict[str, Any]]) -> None:
        """To every process's listeners of ``user_id`` (this one's included), in order,
        in one control message. An event: ``{"event": <kind>, ...}`` with JSON-able
        fields."""
        await self.control.send(f"user:{user_id}", self.message(user_id, events))

    @staticmethod
    def message(user_id: int, events: list[dict[str, Any]]) -> dict[str, Any]:
        """The control message that carries ``events`` to ``user_id``'s listeners."""
        return {"type": USER_EVENTS, "user": user_id, "events": events}

    def handles(self, message: dict[str, Any]) -> bool:
        """Deliver ``message`` if it is feed events (control's handler asks first)."""
        if message.get("type") != USER_EVENTS:
            return False
        listeners = self.listeners.get(message.get("user"))  # type: ignore[arg-type]
        events = message.get("events")
        if listeners and isinstance(events, list):
            for event in events:
                for listener in listeners:
                    listener.put(event)
        return True
