"""Consumer bases that handle their messages on the event loop alone.

Channels (>= 4.2) calls ``close_old_connections`` through ``sync_to_async`` around every
message a consumer handles (each WebSocket frame, the connect, the disconnect): outside a
request that is the process's one thread-sensitive thread, so the frames of every socket
of the process queue behind each other there, and each costs two thread handoffs. The
ORM is never used on that thread here: a consumer's database work goes through
``streaming.database.run``, whose threads look after their connections themselves. So
the streaming consumers dispatch without that call; what a handler does is unchanged.

Without a channel layer (none is configured) a consumer has one source of messages, its
connection, yet Channels' ``__call__`` still awaits each message in a task of its own
beside the consumer's (``await_many_dispatch``): a task, a coroutine and an
``asyncio.wait`` held for as long as the connection is open (about 4 KB a WebSocket),
and a task made per message received. ``_serve`` awaits and dispatches in the
consumer's own task, one message at a time as before; with a channel layer configured,
Channels' own ``__call__`` runs.
"""

from __future__ import annotations

from typing import Any

from channels.consumer import AsyncConsumer, get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer


async def _serve(consumer: AsyncConsumer, scope: Any, receive: Any, send: Any) -> None:
    if get_channel_layer(consumer.channel_layer_alias) is not None:
        await AsyncConsumer.__call__(consumer, scope, receive, send)
        return
    consumer.scope = scope
    consumer.channel_layer = None
    consumer.base_send = send
    try:
        while True:
            await consumer.dispatch(await receive())
    except StopConsumer:
        pass


async def _dispatch(consumer: Any, message: dict[str, Any]) -> None:
    handler = getattr(consumer, get_handler_name(message), None)
    if handler is None:
        raise ValueError(f"No handler for message type {message['type']}")
    await handler(message)


class LoopWebsocketConsumer(AsyncWebsocketConsumer):
    """No channel layer is configured, so a socket is in no group to leave."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await _serve(self, scope, receive, send)

    async def dispatch(self, message: dict[str, Any]) -> None:
        await _dispatch(self, message)

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        await self.disconnect(message["code"])
        raise StopConsumer()


class LoopHttpConsumer(AsyncHttpConsumer):
    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await _serve(self, scope, receive, send)

    async def dispatch(self, message: dict[str, Any]) -> None:
        await _dispatch(self, message)

    async def http_disconnect(self, message: dict[str, Any]) -> None:
        await self.disconnect()
        raise StopConsumer()
