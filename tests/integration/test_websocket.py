"""WebSocket transport over real sockets against real Daphne processes."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets

from tests.support.clients import (
    auth,
    create_conversation,
    post_message,
    read_sse,
    seqs,
    text_of,
    wait_for_status,
)
from tests.support.leaving import ended_status, held_owner, seen_gone
from tests.support.rawsocket import masked_text_frame, upgraded
from tests.support.wsclient import ChatSocket

pytestmark = pytest.mark.asyncio

MULTILINGUAL = "こんにちは、世界！ مرحبا 👩🏽‍💻 🇫🇷 café"


async def test_sse_and_ws_readers_get_identical_events(daphne, account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, "hi",
            simulation={"text": MULTILINGUAL, "tokens_per_second": 40},
        )  # fmt: skip
        ws = await ChatSocket.connect(server.ws_url, account.token)
        await ws.send({"type": "subscribe", "message_id": message["id"], "after": 0})
        sse_task = asyncio.create_task(read_sse(client, account.token, message["id"]))
        ws_events = await ws.events_until_done(message["id"])
        sse_events = [e.data for e in (await sse_task).events]
        await ws.close()
        # Merging may group deltas differently per reader; the sequence of text is identical.
        assert text_of(ws_events) == text_of(sse_events) == MULTILINGUAL
        assert ws_events[-1]["seq"] == sse_events[-1]["seq"]
        assert {k: v for k, v in ws_events[-1].items() if k != "message_id"} == sse_events[-1]
        persisted = (
            await client.get(f"/api/messages/{message['id']}/", headers=auth(account.token))
        ).json()
        assert persisted["content"] == MULTILINGUAL


async def test_create_over_ws_streams_incrementally(daphne, account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
    ws = await ChatSocket.connect(server.ws_url, account.token)
    created = await ws.create(
        conversation, "hello", {"simulation": {"length": 20, "tokens_per_second": 40}}, ref=7
    )
    message_id = created[-1]["message_id"]
    assert created[-1]["ref"] == 7
    events = await ws.events_until_done(message_id)
    await ws.close()
    assert events[0]["type"] == "start"
    assert sum(1 for e in events if e["type"] == "delta") >= 3
    assert events[-1]["status"] == "complete"
    assert seqs(events) == sorted(set(seqs(events)))


async def test_a_create_goes_after_the_answer_it_names(daphne, account):
    """``parent_id`` on ``message.create``: after that answer, as the REST post."""
    server = daphne()
    short = {"simulation": {"length": 3, "ttft_ms": 0}}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        ws = await ChatSocket.connect(server.ws_url, account.token)
        try:
            answers = []
            for text in ("one", "two"):
                answer = (await ws.create(conversation, text, short))[-1]["message_id"]
                await ws.events_until_done(answer)
                answers.append(answer)
            created = await ws.create(conversation, "instead", short, parent_id=answers[0])
            answer = created[-1]["message_id"]
            await ws.events_until_done(answer)
        finally:
            await ws.close()
        question = created[-1]["user_message_id"]
        stored = (
            await client.get(f"/api/messages/{question}/", headers=auth(account.token))
        ).json()
        assert stored["parent_id"] == answers[0]
        assert len(stored["siblings"]) == 2
        shown = await client.get(f"/api/conversations/{conversation}/", headers=auth(account.token))
        assert shown.json()["current_leaf"] == answer


async def test_bad_frames_get_error_frames_and_the_socket_keeps_working(
    daphne, account, other_account
):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, other_account.token)
        foreign = await post_message(
            client, other_account.token, conversation, "x", simulation={"length": 3}
        )
    ws = await ChatSocket.connect(server.ws_url, account.token)
    await ws.conn.send("{not json")
    assert (await ws.recv())["code"] == "invalid_json"
    await ws.conn.send(b"\x00\x01")
    assert (await ws.recv())["code"] == "binary_frame"
    await ws.send({"type": "teleport"})
    assert (await ws.recv())["code"] == "unknown_type"
    await ws.send({"type": "subscribe", "message_id": foreign["id"]})
    error = await ws.recv()
    assert error["type"] == "error" and error["code"] == "not_found"
    await ws.send({"type": "subscribe", "message_id": "not-a-uuid"})
    assert (await ws.recv())["code"] == "not_found"
    await ws.send({"type": "subscribe", "message_id": foreign["id"], "after": -1})
    assert (await ws.recv())["code"] == "invalid_cursor"
    await ws.send({"type": "ping", "ref": "p1"})
    assert await ws.recv() == {"type": "pong", "ref": "p1"}
    await ws.close()


async def test_handshake_rules(daphne, account):
    server = daphne()
    # A foreign Origin with no token is refused at the handshake (cross-site hijacking).
    with pytest.raises(websockets.exceptions.InvalidStatus):
        await ChatSocket.connect(server.ws_url, origin="https://evil.example")
    # No credentials: connected but anonymous until an auth frame.
    ws = await ChatSocket.connect(server.ws_url)
    await ws.send({"type": "subscribe", "message_id": "00000000-0000-0000-0000-000000000000"})
    assert (await ws.recv())["code"] == "not_authenticated"
    await ws.send({"type": "auth", "token": account.token})
    assert (await ws.recv())["type"] == "authenticated"
    await ws.send({"type": "ping"})
    assert (await ws.recv())["type"] == "pong"
    await ws.close()
    # A token at the handshake needs no Origin, even a foreign one.
    ws = await ChatSocket.connect(server.ws_url, account.token, origin="https://evil.example")
    await ws.send({"type": "ping"})
    assert (await ws.recv())["type"] == "pong"
    await ws.close()


async def test_heartbeats_and_pings_during_a_slow_first_token(daphne, account):
    server = daphne(STREAM_PING_INTERVAL="0.3")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, "hi",
            simulation={"ttft_ms": 1500, "length": 3, "tokens_per_second": 100},
        )  # fmt: skip
        ws = await ChatSocket.connect(server.ws_url, account.token)
        await ws.send({"type": "subscribe", "message_id": message["id"]})
        sse = await read_sse(client, account.token, message["id"])
        frames = await ws.recv_until("done", message["id"])
        await ws.close()
    assert ": ping" in sse.comments
    assert sse.events[-1].data["type"] == "done"
    # The first token waits five intervals: the heartbeat is sent again after the first.
    assert sum(f["type"] == "heartbeat" for f in frames) >= 2


async def test_a_client_closing_mid_stream_ends_its_socket_quietly(daphne, account):
    """A client's Close frame while an answer streams to it (and its feed is followed):
    the socket ends without an error on the server (frames written during the closing
    handshake are dropped: tests/unit/test_daphne.py), and every answer it left is
    abandoned as usual."""
    server = daphne(STREAM_ABANDON_GRACE="0")
    fast = {"simulation": {"length": 5000, "tokens_per_second": 1000, "ttft_ms": 0}}
    left = []
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        for _ in range(8):
            conversation = await create_conversation(client, account.token)
            ws = await ChatSocket.connect(server.ws_url, account.token)
            await ws.send({"type": "subscribe", "topic": "user"})
            left.append((await ws.create(conversation, "go", fast))[-1]["message_id"])
            await ws.recv_until("delta")
            await ws.conn.close()
        for message_id in left:
            ended = await wait_for_status(client, account.token, message_id)
            assert ended["status"] == "abandoned"
    log = server.log_text()
    for trouble in ("Traceback", "WebSocket stream failed", "never retrieved"):
        assert trouble not in log


async def test_subscribing_again_to_the_answer_followed_keeps_it_read(daphne, account):
    """A socket subscribes again, from 0, to the answer it follows: the answer keeps its
    reader across the switch. With no grace for a reader to come back, the count fell
    to none between the two subscriptions and the answer ended ``abandoned``."""
    server = daphne(STREAM_ABANDON_GRACE="0")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        ws = await ChatSocket.connect(server.ws_url, account.token)
        try:
            sim = {"simulation": {"length": 40, "tokens_per_second": 40, "ttft_ms": 0}}
            created = await ws.create(conversation, "hello", sim)
            message_id = created[-1]["message_id"]
            deltas = 0
            while deltas < 3:
                frame = await ws.recv()
                deltas += frame.get("type") == "delta"
            await ws.send({"type": "subscribe", "message_id": message_id, "after": 0})
            frames = await ws.recv_until("subscribed", message_id)
            again = await ws.events_until_done(message_id)
        finally:
            await ws.close()
        stored = await wait_for_status(client, account.token, message_id)
    assert stored["status"] == "complete", stored["termination"]
    assert frames[-1]["after"] == 0
    assert again[0]["type"] == "start" and again[-1]["status"] == "complete", again[-1]
    assert text_of(again) == stored["content"] and seqs(again) == sorted(set(seqs(again)))


async def test_a_socket_following_its_most_makes_no_answer_it_could_not_follow(daphne, account):
    """At ``STREAM_WS_MAX_SUBSCRIPTIONS``, a ``message.create`` that would follow its
    answer is refused before anything is made (the answer was made, then its
    subscription refused: it streamed to nobody); one that will not follow goes on."""
    server = daphne(STREAM_WS_MAX_SUBSCRIPTIONS="1")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        other = await create_conversation(client, account.token)
        ws = await ChatSocket.connect(server.ws_url, account.token)
        try:
            slow = {"simulation": {"length": 400, "tokens_per_second": 20, "ttft_ms": 0}}
            first = await ws.create(conversation, "one", slow)
            await ws.send({"type": "message.create", "conversation": other, "content": "two"})
            refused = (await ws.recv_until("error"))[-1]
            unfollowed = await ws.create(other, "three", {}, subscribe=False)
        finally:
            await ws.close()
        listed = await client.get(
            f"/api/conversations/{other}/messages/", headers=auth(account.token)
        )
    assert first[-1]["type"] == "message.created"
    assert refused["code"] == "too_many_subscriptions", refused
    assert unfollowed[-1]["type"] == "message.created"
    assert [m["content"] for m in listed.json()["results"] if m["role"] == "user"] == ["three"]


async def test_a_socket_following_its_most_continues_no_answer_it_could_not_follow(daphne, account):
    """At ``STREAM_WS_MAX_SUBSCRIPTIONS``, a ``continue`` (which follows the new segment)
    is refused before anything is made, as a ``message.create`` is: the segment was
    started, then its subscription refused, and it streamed to nobody while the client
    was told its frame had failed."""
    server = daphne(STREAM_WS_MAX_SUBSCRIPTIONS="1")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        other = await create_conversation(client, account.token)
        cut = await client.post(
            f"/api/conversations/{other}/messages/?wait=true",
            json={"content": "cut", "params": {"max_tokens": 2, "simulation": {"ttft_ms": 0}}},
            headers=auth(account.token),
        )
        assert cut.json()["message"]["status"] == "truncated", cut.text
        answer = cut.json()["message"]["id"]
        ws = await ChatSocket.connect(server.ws_url, account.token)
        try:
            slow = {"simulation": {"length": 400, "tokens_per_second": 20, "ttft_ms": 0}}
            await ws.create(conversation, "one", slow)
            await ws.send({"type": "continue", "message_id": answer, "ref": "c"})
            refused = (await ws.recv_until("error"))[-1]
        finally:
            await ws.close()
        stored = (await client.get(f"/api/messages/{answer}/", headers=auth(account.token))).json()
    assert refused["code"] == "too_many_subscriptions" and refused["ref"] == "c", refused
    assert stored["status"] == "truncated" and len(stored["segments"]) == 1, stored


async def test_an_unsubscribe_before_the_stream_ran_leaves_the_answer(daphne, account):
    """``subscribe`` and ``unsubscribe`` in one write: the second frame is handled before
    the stream the first started has run, so that stream never counted its reader. The
    answer, which no one else reads, is abandoned as when a reader comes and goes; it ran
    to its end for nobody, as an answer that never had a reader does."""
    server = daphne(STREAM_ABANDON_GRACE="0")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        conversation = await create_conversation(api, account.token)
        answer = await post_message(
            api, account.token, conversation, "never read",
            simulation={"length": 3000, "tokens_per_second": 30, "ttft_ms": 0},
        )  # fmt: skip
        sock = upgraded(server.port, account.token)
        try:
            frames = [
                {"type": "subscribe", "message_id": answer["id"], "after": 0},
                {"type": "unsubscribe", "message_id": answer["id"]},
            ]
            sock.sendall(b"".join(masked_text_frame(json.dumps(f).encode()) for f in frames))
            ended = await wait_for_status(api, account.token, answer["id"])
        finally:
            sock.close()
    assert ended["status"] == "abandoned", ended


async def test_a_socket_gone_before_its_answer_exists_leaves_it_unread(daphne, account):
    """A socket closed while its ``message.create`` is still being made (waiting on its
    owner's row, which the test holds): the answer it subscribed to is abandoned, as when
    a socket closes while it streams. Its stream was cancelled before it began, so no one
    told the answer its reader had gone, and it ran to its end for nobody."""
    server = daphne(STREAM_ABANDON_GRACE="0")
    endless = {"simulation": {"length": 200, "tokens_per_second": 50, "ttft_ms": 0}}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        conversation = await create_conversation(api, account.token)
        ws = await ChatSocket.connect(server.ws_url, account.token)
        async with held_owner(account.user.pk) as held:
            await ws.send(
                {
                    "type": "message.create",
                    "conversation": conversation,
                    "content": "never read",
                    "params": endless,
                }
            )
            await held.waited_on()
            await ws.close()
            await seen_gone(api)
        assert await ended_status(conversation) == "abandoned"
