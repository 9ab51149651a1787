"""SSE over real sockets against a real Daphne process."""

from __future__ import annotations

import os

import httpx
import pytest
import redis

from tests.support.clients import (
    SSEEvent,
    auth,
    create_conversation,
    iter_sse,
    post_message,
    read_sse,
    seqs,
    text_of,
)
from tests.support.wsclient import ChatSocket

pytestmark = pytest.mark.asyncio


async def test_stream_is_incremental_and_matches_persisted_content(daphne, account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, "Bonjour",
            simulation={"text": "日本語のテキスト 👨‍👩‍👧‍👦 and 🇯🇵 flags", "tokens_per_second": 50},
        )  # fmt: skip
        result = await read_sse(client, account.token, message["id"])
        assert result.status == 200
        assert result.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert result.headers["x-accel-buffering"] == "no"
        assert result.headers["cache-control"].startswith("no-cache")
        assert result.retry is not None
        # Every block is a comment or carries data: the retry hint rides on the first
        # event, so a client that reads each event's data as JSON never meets an empty one.
        replay = await client.get(
            f"/api/messages/{message['id']}/stream/", headers=auth(account.token)
        )
        blocks = [block.split("\n") for block in replay.text.split("\n\n") if block]
        assert blocks[0] == [": open"]
        assert blocks[1][0].startswith("retry: ")
        for lines in blocks:
            comment = all(line.startswith(":") for line in lines)
            assert comment or any(line.startswith("data: ") for line in lines), lines
        events = [e.data for e in result.events]
        assert events[0]["type"] == "start"
        assert events[-1]["type"] == "done"
        assert events[-1]["status"] == "complete"
        deltas = [e for e in events if e["type"] == "delta"]
        assert len(deltas) >= 3, "the answer must arrive in several frames"
        assert [e.id for e in result.events] == [str(s) for s in seqs(events)]
        assert seqs(events) == sorted(set(seqs(events)))
        text = text_of(events)
        assert text == "日本語のテキスト 👨‍👩‍👧‍👦 and 🇯🇵 flags"
        persisted = (
            await client.get(f"/api/messages/{message['id']}/", headers=auth(account.token))
        ).json()
        assert persisted["content"] == text
        assert persisted["status"] == "complete"
        assert persisted["last_seq"] == events[-1]["seq"]


async def test_resume_with_last_event_id_gets_exactly_the_remainder(daphne, account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client,
            account.token,
            conversation,
            "hi",
            simulation={"length": 60, "tokens_per_second": 100},
        )
        first = await read_sse(client, account.token, message["id"], stop_after=5)
        cursor = int(first.events[-1].id)
        rest = await read_sse(client, account.token, message["id"], last_event_id=cursor)
        combined = [e.data for e in first.events] + [e.data for e in rest.events]
        assert seqs(combined) == list(range(1, combined[-1]["seq"] + 1)) or seqs(
            combined
        ) == sorted(set(seqs(combined)))
        # Merge-on-read: a replayed run of deltas arrives as one frame with its last seq.
        assert rest.events[0].data["seq"] > cursor
        persisted = (
            await client.get(f"/api/messages/{message['id']}/", headers=auth(account.token))
        ).json()
        assert text_of(combined) == persisted["content"]
        again = await read_sse(client, account.token, message["id"], after=combined[-1]["seq"])
        assert again.status == 204


async def test_unauthenticated_and_foreign_and_bad_cursor(daphne, account, other_account):
    owner, other = account, other_account
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, owner.token)
        message = await post_message(
            client, owner.token, conversation, "hi", simulation={"length": 5}
        )
        url = f"/api/messages/{message['id']}/stream/"
        assert (await client.get(url)).status_code == 401
        foreign = await client.get(url, headers=auth(other.token))
        assert foreign.status_code == 404
        assert foreign.json()["error"]["code"] == "not_found"
        bad = await client.get(url, headers={**auth(owner.token), "Last-Event-ID": "abc"})
        assert bad.status_code == 400
        assert bad.json()["error"]["code"] == "invalid_cursor"


async def test_an_answer_streaming_here_is_its_owners_alone(daphne, account, other_account):
    """The owner's readers of an answer that streams in this process are served without a
    database lookup; another user asking for it (twice: their token then held too), over
    SSE and WebSocket, is told it does not exist, exactly as for any answer of someone
    else's."""
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, "hi",
            simulation={"length": 500, "tokens_per_second": 5, "ttft_ms": 0},
        )  # fmt: skip
        url = f"/api/messages/{message['id']}/stream/"
        async with client.stream("GET", url, headers=auth(account.token)) as owners:
            assert owners.status_code == 200
            for _ in range(2):
                foreign = await client.get(url, headers=auth(other_account.token))
                assert foreign.status_code == 404
                assert foreign.json()["error"]["code"] == "not_found"
            ws = await ChatSocket.connect(server.ws_url, other_account.token)
            for _ in range(2):
                await ws.send({"type": "subscribe", "message_id": message["id"]})
                error = await ws.recv()
                assert error["type"] == "error" and error["code"] == "not_found"
            await ws.close()
            # Its owner resumes it from a cursor, live: the next event is after it.
            resume = {**auth(account.token), "Last-Event-ID": "1"}
            async with client.stream("GET", url, headers=resume) as resumed:
                assert resumed.status_code == 200
                first = await anext(e async for e in iter_sse(resumed) if isinstance(e, SSEEvent))
                assert first.data["seq"] > 1 and first.data["type"] == "delta"


async def test_a_replay_from_the_record_holds_its_tool_calls_and_model(
    daphne, account, needs_redis
):
    """A finished answer whose log expired (dropped here, as its TTL would) is replayed
    from its record: its tool call and the model that wrote it come as they streamed.
    The call was left out (a `done` saying `tool_calls` after none) and the model blank."""
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        call = {"name": "get_weather", "arguments": '{"city":"Paris"}'}
        message = await post_message(
            client, account.token, conversation, "hi",
            simulation={"ttft_ms": 0, "reasoning": "I think", "tool_call": call},
        )  # fmt: skip
        live = [e.data for e in (await read_sse(client, account.token, message["id"])).events]
        from streaming.streamlog.redis import stream_key

        with redis.Redis.from_url(os.environ["REDIS_URL"]) as log:
            assert log.delete(stream_key(message["id"])) == 1
        replayed = [e.data for e in (await read_sse(client, account.token, message["id"])).events]
        ws = await ChatSocket.connect(server.ws_url, account.token)
        await ws.send({"type": "subscribe", "message_id": message["id"]})
        over_ws = await ws.recv_until("done", message["id"])
        await ws.close()
    calls = [e for e in replayed if e["type"] == "tool_call"]
    assert [(c["id"], c["name"], c["arguments"]) for c in calls] == [
        (next(e["id"] for e in live if e["type"] == "tool_call"), call["name"], call["arguments"])
    ]
    assert replayed[0]["model"] == live[0]["model"] == "simulated"
    assert [e["type"] for e in replayed] == ["start", "reasoning", "tool_call", "done"]
    assert replayed[-1]["finish_reason"] == "tool_calls"
    assert [f for f in over_ws if f.get("type") == "tool_call"] == [
        {**calls[0], "message_id": message["id"]}
    ]
