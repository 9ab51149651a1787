"""A Daphne process that drains after SIGTERM closes every open WebSocket with 1001
(going away), an idle one and one whose answer was interrupted alike, and only then
stops (docs/protocol.md)."""

from __future__ import annotations

import asyncio
import signal

import httpx
import pytest
import websockets

from tests.support.clients import create_conversation
from tests.support.wsclient import ChatSocket

pytestmark = pytest.mark.asyncio

GOING_AWAY = 1001


async def close_code(ws: ChatSocket) -> int | None:
    """Read until the socket closes; the code of the server's close frame (None when the
    connection ended without one: websockets reports 1006)."""
    with pytest.raises(websockets.ConnectionClosed) as closed:
        while True:
            await asyncio.wait_for(ws.conn.recv(), 30)
    received = closed.value.rcvd
    return None if received is None else received.code


async def test_sigterm_closes_every_socket_with_1001(daphne, account):
    server = daphne(STREAM_SHUTDOWN_DEADLINE="0.5")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
    idle = await ChatSocket.connect(server.ws_url, account.token)
    streaming = await ChatSocket.connect(server.ws_url, account.token)
    following = await ChatSocket.connect(server.ws_url, account.token)
    try:
        await idle.send({"type": "ping"})
        assert (await idle.recv())["type"] == "pong"
        await following.send({"type": "subscribe", "topic": "user"})
        await following.recv_until("subscribed")
        slow = {"simulation": {"length": 3000, "tokens_per_second": 30, "ttft_ms": 0}}
        answer = (await streaming.create(conversation, "hi", slow))[-1]["message_id"]
        await streaming.recv_until("delta", answer)

        server.signal(signal.SIGTERM)
        frames = await asyncio.wait_for(streaming.recv_until("done", answer), 30)
        assert frames[-1]["status"] == "interrupted"
        codes = await asyncio.gather(close_code(idle), close_code(streaming), close_code(following))
        assert codes == [GOING_AWAY] * 3
        assert server.proc.wait(timeout=15) == 0
    finally:
        for ws in (idle, streaming, following):
            await ws.conn.close()
