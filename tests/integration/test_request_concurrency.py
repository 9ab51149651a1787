"""Django requests are bounded per process (``REQUEST_CONCURRENCY``); streams are not.

With one slot, taken by a ``?wait=true`` POST that lasts until its answer ends, another
REST call waits for the slot, while the answer's own SSE stream and a WebSocket serve
as usual; ending the answer over the WebSocket frees the slot and the waiting call is
answered."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from asgiref.sync import sync_to_async

from streaming.models import Message
from streaming.termination import Status
from tests.support.clients import auth, create_conversation, iter_sse
from tests.support.wsclient import ChatSocket

pytestmark = pytest.mark.asyncio

LONG = {"simulation": {"length": 100000, "tokens_per_second": 20.0, "ttft_ms": 0.0}}


async def streaming_answer(conversation: str) -> str:
    """The id of the conversation's streaming answer, once its rows exist (written by the
    server process: there is no event to await from here, and the REST API is held)."""

    def find() -> str | None:
        found = Message.objects.filter(
            conversation_id=conversation, role="assistant", status=Status.STREAMING
        ).values_list("id", flat=True)
        return next((str(i) for i in found), None)

    async with asyncio.timeout(30):
        while True:
            if (message_id := await sync_to_async(find)()) is not None:
                return message_id
            await asyncio.sleep(0.05)


async def test_a_held_slot_queues_rest_calls_but_never_streams(daphne, account):
    server = daphne("bounded", REQUEST_CONCURRENCY="1")
    headers = auth(account.token)
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        conversation = await create_conversation(client, account.token)
        waiting = asyncio.create_task(
            client.post(
                f"/api/conversations/{conversation}/messages/?wait=true",
                json={"content": "a long answer", "params": LONG},
                headers=headers,
            )
        )
        message_id = await streaming_answer(conversation)
        queued = asyncio.create_task(client.get("/api/conversations/", headers=headers))

        # The stream of the answer that holds the slot flows.
        url = f"/api/messages/{message_id}/stream/"
        async with client.stream("GET", url, headers=headers) as response:
            assert response.status_code == 200
            async for item in iter_sse(response):
                if not isinstance(item, str) and item.data["type"] == "delta":
                    break
        # So does a WebSocket, which ends the answer; only that frees the slot.
        socket = await ChatSocket.connect(server.ws_url, account.token)
        try:
            await socket.send({"type": "ping"})
            assert (await socket.recv())["type"] == "pong"
            assert not queued.done(), "a REST call was served while the only slot was held"
            await socket.send({"type": "cancel", "message_id": message_id})
            reply = await socket.recv_until("cancelled")
            assert reply[-1]["status"] == Status.CANCELLED
        finally:
            await socket.close()

        answered = await waiting
        assert answered.status_code == 201, answered.text
        assert answered.json()["message"]["status"] == Status.CANCELLED
        listed = await queued
        assert listed.status_code == 200
        assert conversation in [c["id"] for c in listed.json()["results"]]
