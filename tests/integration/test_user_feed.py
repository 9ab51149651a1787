"""Every tab of a user in step: the per-user feed over WebSocket, across processes, and
the regenerate / edit frames. Real Daphne processes sharing PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.support.clients import auth, create_conversation, text_of
from tests.support.wsclient import ChatSocket

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("needs_redis")]

QUICK = {"simulation": {"length": 12, "tokens_per_second": 200, "ttft_ms": 0}}
HANG = 30.0


async def following(url: str, token: str) -> ChatSocket:
    socket = await ChatSocket.connect(url, token)
    await socket.send({"type": "subscribe", "topic": "user"})
    assert (await socket.recv_until("subscribed"))[-1] == {"type": "subscribed", "topic": "user"}
    return socket


async def next_feed(socket: ChatSocket, event: str) -> dict[str, Any]:
    async with asyncio.timeout(HANG):
        while True:
            frame = await socket.recv()
            if frame.get("type") == "feed" and frame.get("event") == event:
                return frame


async def test_another_tab_sees_the_message_and_follows_its_stream(
    daphne, account, other_account
) -> None:
    a, b = daphne("a"), daphne("b")
    watcher = await following(a.ws_url, account.token)
    stranger = await following(a.ws_url, other_account.token)
    sender = await ChatSocket.connect(b.ws_url, account.token)
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as api:
        conversation = await create_conversation(api, account.token)
        created = await next_feed(watcher, "conversation.created")
        assert created["conversation"] == conversation

        long = {"simulation": {"length": 60, "tokens_per_second": 30, "ttft_ms": 0}}
        reply = (await sender.create(conversation, "from the other tab", long))[-1]
        # The first question titles the conversation: both events, in the order made.
        titled = await next_feed(watcher, "conversation.updated")
        assert titled["title"] == "from the other tab"
        async with asyncio.timeout(HANG):
            seen = await watcher.recv()
        assert (seen["type"], seen["event"]) == ("feed", "message.created")
        assert seen["message_id"] == reply["message_id"]
        assert seen["user_message_id"] == reply["user_message_id"]
        assert seen["conversation"] == conversation
        # The watching tab attaches to the answer while it streams and gets all of it.
        await watcher.send({"type": "subscribe", "message_id": seen["message_id"], "after": 0})
        watched = await watcher.events_until_done(seen["message_id"])
        sent = await sender.events_until_done(reply["message_id"])
        assert text_of(watched) == text_of(sent) and watched[-1]["status"] == "complete"

        # Rename, branch switch and delete reach it too.
        await api.patch(
            f"/api/conversations/{conversation}/", json={"title": "renamed"},
            headers=auth(account.token),
        )  # fmt: skip
        assert (await next_feed(watcher, "conversation.updated"))["title"] == "renamed"
        await api.patch(
            f"/api/conversations/{conversation}/",
            json={"current_leaf": reply["user_message_id"]},
            headers=auth(account.token),
        )
        switched = await next_feed(watcher, "branch.switched")
        assert switched["current_leaf"] == reply["message_id"]
        await api.delete(f"/api/conversations/{conversation}/", headers=auth(account.token))
        assert (await next_feed(watcher, "conversation.deleted"))["conversation"] == conversation

    # Nothing of it reached another user's feed: their next frame answers their ping.
    # Same process, same delivery: anything of it would be queued before this pong.
    await stranger.send({"type": "ping", "ref": 1})
    before_pong = await stranger.recv_until("pong")
    assert [f for f in before_pong if f["type"] == "feed"] == []
    for socket in (watcher, stranger, sender):
        await socket.close()


async def test_the_reply_to_a_frame_places_its_answer_as_the_feed_does(daphne, account) -> None:
    """The reply to the frame that made an exchange and the feed's ``message.created``
    name the same place for it: ``parent_id`` is where its first new message went (the
    question's parent; the answer's, for a regenerated one). The reply named the
    answer's parent instead, the question it had just made."""
    server = daphne()
    watcher = await following(server.ws_url, account.token)
    socket = await ChatSocket.connect(server.ws_url, account.token)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        conversation = await create_conversation(api, account.token)
        first = (await socket.create(conversation, "one", QUICK))[-1]
        await socket.events_until_done(first["message_id"])
        second = (await socket.create(conversation, "two", QUICK))[-1]
        await socket.events_until_done(second["message_id"])
        await socket.send(
            {"type": "message.edit", "message_id": second["user_message_id"], "content": "2"}
        )
        edited = (await socket.recv_until("message.created"))[-1]
        await socket.events_until_done(edited["message_id"])
        await socket.send({"type": "message.regenerate", "message_id": edited["message_id"]})
        regenerated = (await socket.recv_until("message.created"))[-1]
    seen = [await next_feed(watcher, "message.created") for _ in range(4)]
    replies = [first, second, edited, regenerated]
    assert [r["parent_id"] for r in replies] == [
        None,
        first["message_id"],
        first["message_id"],
        edited["user_message_id"],
    ]
    fields = ("conversation", "user_message_id", "message_id", "parent_id")
    for reply, event in zip(replies, seen, strict=True):
        assert {k: reply[k] for k in fields} == {k: event[k] for k in fields}
    for each in (watcher, socket):
        await each.close()


async def test_regenerate_and_edit_frames_start_answers_beside_the_old(daphne, account) -> None:
    server = daphne()
    socket = await ChatSocket.connect(server.ws_url, account.token)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        conversation = await create_conversation(api, account.token)
        first = (await socket.create(conversation, "hello", QUICK))[-1]
        await socket.events_until_done(first["message_id"])

        await socket.send(
            {
                "type": "message.regenerate",
                "message_id": first["message_id"],
                "ref": "r",
                "params": QUICK,
            }
        )
        again = (await socket.recv_until("message.created"))[-1]
        assert again["ref"] == "r" and again["user_message_id"] is None
        assert again["parent_id"] == first["user_message_id"]
        assert again["siblings"] == [first["message_id"], again["message_id"]]
        assert (await socket.events_until_done(again["message_id"]))[-1]["status"] == "complete"

        await socket.send(
            {
                "type": "message.edit",
                "message_id": first["user_message_id"],
                "content": "hello again",
                "params": QUICK,
            }
        )
        edited = (await socket.recv_until("message.created"))[-1]
        assert edited["user_message_id"] != first["user_message_id"]
        assert edited["parent_id"] is None  # the first question's place: the root
        assert (await socket.events_until_done(edited["message_id"]))[-1]["status"] == "complete"

        await socket.send({"type": "message.regenerate", "message_id": first["user_message_id"]})
        error = (await socket.recv_until("error"))[-1]
        assert (error["code"], error["status"]) == ("wrong_role", 400)
        await socket.send({"type": "message.edit", "message_id": first["message_id"], "stop": 1})
        assert (await socket.recv_until("error"))[-1]["code"] == "invalid_frame"

        listed = (
            await api.get(
                f"/api/conversations/{conversation}/messages/", headers=auth(account.token)
            )
        ).json()["results"]
        assert [m["id"] for m in listed] == [edited["user_message_id"], edited["message_id"]]
    await socket.close()
