"""The bases of every consumer here: Channels' HTTP and WebSocket consumers without its
database hop per message.

Channels runs ``close_old_connections`` in a thread before every handler it dispatches
and after a disconnect: a thread hop for each WebSocket frame received and each HTTP
event, all of a process's consumers queued through one thread-sensitive thread. It
does so for consumers that use the ORM in that thread. These never do: their database
work goes through ``streaming.database``, whose threads give their connection back
after every call, so the hop only costs (docs/performance.md). Group membership is not
supported (no consumer here joins a channel-layer group).
"""

from __future__ import annotations

from typing import Any

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer
from channels.generic.websocket import AsyncWebsocketConsumer


async def _dispatch(consumer: Any, message: dict[str, Any]) -> None:
    handler = getattr(consumer, get_handler_name(message), None)
    if handler is None:
        raise ValueError(f"No handler for message type {message['type']}")
    await handler(message)


class HttpConsumer(AsyncHttpConsumer):
    async def dispatch(self, message: dict[str, Any]) -> None:
        await _dispatch(self, message)

    async def http_disconnect(self, message: dict[str, Any]) -> None:
        await self.disconnect()
        raise StopConsumer()


class WebsocketConsumer(AsyncWebsocketConsumer):
    groups: list[str] = []

    async def dispatch(self, message: dict[str, Any]) -> None:
        await _dispatch(self, message)

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        await self.disconnect(message["code"])
        raise StopConsumer()
