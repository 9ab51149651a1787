"""WebSocket replies against a real Daphne process: every direct reply to a client frame
carries the frame's ``ref``, and a subscription the server ends without a ``done`` for
the client (it had read past the end) says so with ``unsubscribed`` (docs/protocol.md)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.support.clients import auth, create_conversation, post_message, wait_for_status
from tests.support.wsclient import ChatSocket

pytestmark = pytest.mark.asyncio

SLOW = {"simulation": {"length": 3000, "tokens_per_second": 30, "ttft_ms": 0}}
LONG_WAIT = 20


async def reply(ws: ChatSocket, kind: str, **match: Any) -> dict[str, Any]:
    """The first frame of ``kind`` whose fields include ``match`` (others are skipped:
    stream events, feed events and heartbeats interleave with replies)."""

    async def find() -> dict[str, Any]:
        while True:
            frame = await ws.recv()
            if frame.get("type") == kind and all(frame.get(k) == v for k, v in match.items()):
                return frame

    return await asyncio.wait_for(find(), LONG_WAIT)


async def test_every_reply_echoes_the_frames_ref(daphne, account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
    ws = await ChatSocket.connect(server.ws_url)
    try:
        await ws.send({"type": "auth", "token": account.token, "ref": "a1"})
        assert (await reply(ws, "authenticated"))["ref"] == "a1"

        await ws.send({"type": "subscribe", "topic": "user", "ref": "feed"})
        assert (await reply(ws, "subscribed", topic="user"))["ref"] == "feed"

        created = await ws.create(conversation, "hi", SLOW, ref=1)
        assert created[-1]["ref"] == 1
        answer = created[-1]["message_id"]
        assert (await reply(ws, "subscribed", message_id=answer))["ref"] == 1

        await ws.send({"type": "subscribe", "message_id": answer, "after": 0, "ref": 2.5})
        assert (await reply(ws, "subscribed", message_id=answer))["ref"] == 2.5

        await ws.send({"type": "cancel", "message_id": answer, "ref": "stop"})
        cancelled = await reply(ws, "cancelled", message_id=answer)
        assert cancelled["ref"] == "stop"
        assert cancelled["status"] == "cancelled"

        await ws.send({"type": "continue", "message_id": answer, "ref": "more"})
        assert (await reply(ws, "subscribed", message_id=answer))["ref"] == "more"

        await ws.send({"type": "unsubscribe", "message_id": answer, "ref": "bye"})
        unsubscribed = await reply(ws, "unsubscribed", message_id=answer)
        assert unsubscribed == {"type": "unsubscribed", "message_id": answer, "ref": "bye"}

        await ws.send({"type": "unsubscribe", "topic": "user", "ref": "quiet"})
        assert await reply(ws, "unsubscribed", topic="user") == {
            "type": "unsubscribed",
            "topic": "user",
            "ref": "quiet",
        }

        await ws.send({"type": "cancel", "message_id": answer})
        await reply(ws, "cancelled", message_id=answer)
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            await wait_for_status(client, account.token, answer)
        await ws.send(
            {"type": "message.regenerate", "message_id": answer, "params": SLOW, "ref": "again"}
        )
        regenerated = await reply(ws, "message.created")
        assert regenerated["ref"] == "again"
        again = regenerated["message_id"]
        assert (await reply(ws, "subscribed", message_id=again))["ref"] == "again"

        question = created[-1]["user_message_id"]
        await ws.send(
            {
                "type": "message.edit",
                "message_id": question,
                "content": "hello instead",
                "params": SLOW,
                "stop": True,
                "subscribe": False,
                "ref": "edit",
            }
        )
        edited = await reply(ws, "message.created")
        assert edited["ref"] == "edit"

        await ws.send({"type": "ping", "ref": "p"})
        assert await reply(ws, "pong") == {"type": "pong", "ref": "p"}
    finally:
        await ws.close()


async def test_a_subscription_past_the_end_of_a_live_answer_says_when_it_ended(daphne, account):
    """A reader whose ``after`` is beyond the end of an answer still streaming gets no
    event (it has seen them all); when the answer ends it gets ``unsubscribed`` with the
    answer's final status, and subscribing again answers at once with that status, as
    the SSE stream closes and its reconnect gets 204."""
    server = daphne()
    params = {"simulation": {"length": 40, "tokens_per_second": 20, "ttft_ms": 0}}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(client, account.token, conversation, "hi", **params)
        answer = message["id"]
        ws = await ChatSocket.connect(server.ws_url, account.token)
        try:
            await ws.send({"type": "subscribe", "message_id": answer, "after": 10000, "ref": 9})
            subscribed = await reply(ws, "subscribed", message_id=answer)
            assert subscribed["status"] == "streaming"
            assert subscribed["ref"] == 9
            frames = []
            async with asyncio.timeout(LONG_WAIT):  # heartbeats come meanwhile
                while not frames or frames[-1]["type"] != "unsubscribed":
                    frames.append(await ws.recv())
            assert [f["type"] for f in frames if f["type"] != "heartbeat"] == ["unsubscribed"]
            assert frames[-1] == {
                "type": "unsubscribed",
                "message_id": answer,
                "after": 10000,
                "status": "complete",
            }
            await ws.send({"type": "subscribe", "message_id": answer, "after": 10000})
            again = await reply(ws, "subscribed", message_id=answer)
            assert again["status"] == "complete"
            await ws.send({"type": "ping", "ref": "after"})
            assert (await reply(ws, "pong"))["ref"] == "after"
        finally:
            await ws.close()
        stored = (await client.get(f"/api/messages/{answer}/", headers=auth(account.token))).json()
        assert stored["status"] == "complete"
