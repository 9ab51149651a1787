"""The engine's connection dropped mid-stream: an ``error`` event, then ``done`` with status
``error``; the text streamed before the drop is kept, in the stream and in the database."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.emulator.server import await_request_end
from tests.support.clients import auth, create_conversation, post_message, read_sse, text_of

pytestmark = pytest.mark.asyncio

TEXT = "The quick brown fox jumps over the lazy dog while the stream is cut halfway."


def directive(**keys: object) -> str:
    return f"[[emu {json.dumps(keys)}]]"


@pytest.mark.parametrize("transport", ["sse", "ws"])
async def test_engine_connection_dropped_mid_stream_keeps_the_partial_text(
    daphne, account, emulator, transport
):
    import websockets

    server = daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model")
    content = directive(text=TEXT, ttft_ms=0, tokens_per_second=200, drop_after_tokens=6)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        if transport == "sse":
            message = await post_message(client, account.token, conversation, content)
            message_id = message["id"]
            events = [e.data for e in (await read_sse(client, account.token, message_id)).events]
        else:
            async with websockets.connect(
                f"{server.ws_url}/ws/chat/", additional_headers=auth(account.token)
            ) as ws:
                await ws.send(
                    json.dumps(
                        {"type": "message.create", "conversation": conversation, "content": content}
                    )
                )
                events = []
                message_id = ""
                while not events or events[-1]["type"] != "done":
                    frame = json.loads(await ws.recv())
                    if frame["type"] == "message.created":
                        message_id = frame["message_id"]
                    elif frame["type"] in ("start", "delta", "error", "done"):
                        events.append(frame)
        record = await await_request_end(emulator, f"{message_id}.0")
        assert record["outcome"] == "dropped"
        kinds = [e["type"] for e in events]
        assert kinds[0] == "start"
        assert kinds[-2:] == ["error", "done"]
        assert events[-2]["error"]["type"] == "EngineDisconnected"
        assert events[-1]["status"] == "error"
        streamed = text_of(events)
        assert streamed, "tokens before the drop reach the reader"
        assert streamed == record["text_sent"]
        assert TEXT.startswith(streamed) and streamed != TEXT
        persisted = await client.get(f"/api/messages/{message_id}/", headers=auth(account.token))
        body = persisted.json()
        assert body["status"] == "error"
        assert body["content"] == streamed
        assert body["termination"]["error_type"] == "EngineDisconnected"
        assert (await client.get("/healthz")).status_code == 200
