"""The consumers' bases dispatch without Channels' database hop, and every consumer here
is built on them."""

from __future__ import annotations

from typing import Any

import pytest
from channels import consumer
from channels.generic import http, websocket
from channels.testing import HttpCommunicator, WebsocketCommunicator

from streaming.api.openai import ChatCompletionsConsumer, ModelsConsumer
from streaming.transports.consumers import HttpConsumer, WebsocketConsumer
from streaming.transports.sse import MessageStreamConsumer
from streaming.transports.ws import ChatConsumer


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every call of Channels' hop, wherever Channels calls it from."""
    made: list[str] = []

    async def hop() -> None:
        made.append("close_old_connections")

    for module in (consumer, http, websocket):
        monkeypatch.setattr(module, "aclose_old_connections", hop)
    return made


class Hello(HttpConsumer):
    async def handle(self, body: bytes) -> None:
        await self.send_response(200, b"hello " + body)


class Echo(WebsocketConsumer):
    async def receive(self, text_data: str | None = None, bytes_data: Any = None) -> None:
        await self.send(text_data=text_data)


async def test_an_http_exchange_makes_no_database_hop(hops: list[str]) -> None:
    answer = await HttpCommunicator(Hello.as_asgi(), "POST", "/", body=b"you").get_response()
    assert (answer["status"], answer["body"]) == (200, b"hello you")
    assert hops == []


async def test_websocket_frames_and_the_close_make_no_database_hop(hops: list[str]) -> None:
    socket = WebsocketCommunicator(Echo.as_asgi(), "/")
    connected, _ = await socket.connect()
    assert connected
    for text in ("one", "two"):
        await socket.send_to(text_data=text)
        assert await socket.receive_from() == text
    await socket.disconnect()
    assert hops == []


def test_every_consumer_is_built_on_these_bases() -> None:
    assert issubclass(ChatConsumer, WebsocketConsumer)
    for kind in (MessageStreamConsumer, ChatCompletionsConsumer, ModelsConsumer):
        assert issubclass(kind, HttpConsumer)
