"""The streaming consumers handle their messages without a trip to a thread: Channels'
own bases close database connections through the thread-sensitive thread around every
message (the control cases below show that the record sees those calls)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from asgiref.sync import SyncToAsync
from channels.generic.http import AsyncHttpConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import channel_layers
from channels.testing import HttpCommunicator, WebsocketCommunicator

from streaming.api.openai import OpenAIConsumer
from streaming.transports.dispatch import LoopHttpConsumer, LoopWebsocketConsumer
from streaming.transports.sse import MessageStreamConsumer
from streaming.transports.ws import ChatConsumer


@pytest.fixture
def thread_calls(monkeypatch: pytest.MonkeyPatch) -> list[threading.Thread]:
    """The threads thread-sensitive ``sync_to_async`` calls ran in. Each call runs a
    stand-in there (these tests have no database; Channels' communicators also swap
    ``close_old_connections`` for a no-op, but only while they send or receive)."""
    calls: list[threading.Thread] = []
    into = SyncToAsync.__call__

    async def recorded(self: SyncToAsync, *args: Any, **kwargs: Any) -> Any:
        if self._thread_sensitive:
            self.func = lambda *a, **k: calls.append(threading.current_thread())
        return await into(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", recorded)
    return calls


class Echo(LoopWebsocketConsumer):
    ended: list[int]

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self.send(text_data=text_data)

    async def disconnect(self, code: int) -> None:
        Echo.ended.append(code)


class StockEcho(AsyncWebsocketConsumer):
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self.send(text_data=text_data)


class Hello(LoopHttpConsumer):
    async def handle(self, body: bytes) -> None:
        await self.send_response(200, b"hello " + body)


class StockHello(AsyncHttpConsumer):
    async def handle(self, body: bytes) -> None:
        await self.send_response(200, b"hello " + body)


async def _echo(app: Any) -> str:
    socket = WebsocketCommunicator(app, "/ws/")
    connected, _ = await socket.connect()
    assert connected
    await socket.send_to(text_data="ping")
    answer = await socket.receive_from()
    await socket.disconnect(code=4000)
    return str(answer)


async def test_a_socket_connects_exchanges_frames_and_closes_without_a_thread(
    thread_calls: list[threading.Thread],
) -> None:
    Echo.ended = []
    assert await _echo(Echo.as_asgi()) == "ping"
    assert Echo.ended == [4000]  # the consumer's own disconnect still runs
    assert thread_calls == []


async def test_channels_own_websocket_base_goes_to_the_thread_per_message(
    thread_calls: list[threading.Thread],
) -> None:
    assert await _echo(StockEcho.as_asgi()) == "ping"
    assert len(thread_calls) == 4  # the connect, the frame, the disconnect (twice)
    assert threading.current_thread() not in thread_calls


@pytest.mark.parametrize(("consumer", "to_the_thread"), [(Hello, False), (StockHello, True)])
async def test_an_http_request_is_answered_without_a_thread(
    thread_calls: list[threading.Thread], consumer: Any, to_the_thread: bool
) -> None:
    response = await HttpCommunicator(consumer.as_asgi(), "POST", "/", body=b"you").get_response()
    assert response["status"] == 200
    assert response["body"] == b"hello you"
    assert bool(thread_calls) is to_the_thread


def test_the_streaming_consumers_are_built_on_these_bases() -> None:
    assert issubclass(ChatConsumer, LoopWebsocketConsumer)
    assert issubclass(MessageStreamConsumer, LoopHttpConsumer)
    assert issubclass(OpenAIConsumer, LoopHttpConsumer)


def receiving_in(app: Any) -> tuple[Any, list[bool]]:
    """``app`` with a ``receive`` that records, per call, whether it was awaited in the
    application's own task."""
    calls: list[bool] = []

    async def recorded(scope: Any, receive: Any, send: Any) -> None:
        application_task = asyncio.current_task()

        async def receive_recorded() -> Any:
            calls.append(asyncio.current_task() is application_task)
            return await receive()

        await app(scope, receive_recorded, send)

    return recorded, calls


async def test_messages_are_awaited_in_the_consumers_own_task_in_order() -> None:
    Echo.ended = []
    app, calls = receiving_in(Echo.as_asgi())
    socket = WebsocketCommunicator(app, "/ws/")
    connected, _ = await socket.connect()
    assert connected
    for frame in ("0", "1", "2"):
        await socket.send_to(text_data=frame)
        assert await socket.receive_from() == frame
    await socket.disconnect(code=4000)
    assert Echo.ended == [4000]
    assert calls and all(calls), "no task per message beside the consumer's"


async def test_with_a_channel_layer_channels_own_dispatch_runs(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()
    try:
        app, calls = receiving_in(Echo.as_asgi())
        assert await _echo(app) == "ping"
        assert calls and not any(calls), "each message awaited in a task of its own"
    finally:
        settings.CHANNEL_LAYERS = {}
        channel_layers.backends.clear()
