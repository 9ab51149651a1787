"""Several Daphne processes sharing PostgreSQL and Redis: resume elsewhere, Stop from
elsewhere, a generating process killed mid-stream."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support.clients import (
    auth,
    create_conversation,
    iter_sse,
    post_message,
    read_sse,
    text_of,
    wait_for_status,
)
from tests.support.wsclient import ChatSocket

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("needs_redis")]


async def long_answer(client: Any, token: str, question: str) -> dict[str, Any]:
    """A new conversation's answer that streams for over a minute (40 tokens a second):
    still streaming whatever the test does to a process meanwhile."""
    conversation = await create_conversation(client, token)
    return await post_message(
        client, token, conversation, question,
        simulation={"length": 3000, "tokens_per_second": 40},
    )  # fmt: skip


def assert_exact_sequence(events: list[dict]) -> None:
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs)), seqs


async def test_resume_on_another_process_gets_exactly_the_remainder(two_processes, account):
    async with two_processes() as (_, b, ca, cb):
        conversation = await create_conversation(ca, account.token)
        message = await post_message(
            ca, account.token, conversation, "long please",
            simulation={"length": 80, "tokens_per_second": 60},
        )  # fmt: skip
        first = await read_sse(ca, account.token, message["id"], stop_after=6)
        cursor = int(first.events[-1].id)
        # SSE resume at B with Last-Event-ID.
        rest = await read_sse(cb, account.token, message["id"], last_event_id=cursor)
        # Merge-on-read: a replayed run of deltas arrives as one frame with its last seq.
        assert rest.events[0].data["seq"] > cursor
        sse_all = [e.data for e in first.events + rest.events]
        assert_exact_sequence(sse_all)
        assert sse_all[-1]["type"] == "done" and sse_all[-1]["status"] == "complete"
        # WS resume at B with `after`, from the same cursor.
        ws = await ChatSocket.connect(b.ws_url, account.token)
        await ws.send({"type": "subscribe", "message_id": message["id"], "after": cursor})
        ws_rest = await ws.events_until_done(message["id"])
        await ws.close()
        assert ws_rest[0]["seq"] > cursor
        assert text_of(ws_rest) == text_of([e.data for e in rest.events])
        persisted = (
            await cb.get(f"/api/messages/{message['id']}/", headers=auth(account.token))
        ).json()
        assert text_of(sse_all) == persisted["content"]


async def test_live_follow_from_another_process(two_processes, account):
    async with two_processes() as (_, _, ca, cb):
        conversation = await create_conversation(ca, account.token)
        message = await post_message(
            ca, account.token, conversation, "hi",
            simulation={"length": 40, "tokens_per_second": 40},
        )  # fmt: skip
        remote, local = await asyncio.gather(
            read_sse(cb, account.token, message["id"]),
            read_sse(ca, account.token, message["id"]),
        )
        remote_events = [e.data for e in remote.events]
        assert_exact_sequence(remote_events)
        assert sum(1 for e in remote_events if e["type"] == "delta") >= 3
        assert text_of(remote_events) == text_of([e.data for e in local.events])


async def test_a_reader_ahead_of_the_answer_on_another_process_ends_with_it(two_processes, account):
    """A cursor past the end of an answer streaming elsewhere (a made-up id, one from
    another message) gets no events, and its stream ends when the answer does: the SSE
    response closes (its reconnect gets 204) and the WS subscription is unsubscribed with
    the final status."""
    async with two_processes() as (_, b, ca, cb):
        conversation = await create_conversation(ca, account.token)
        message = await post_message(
            ca, account.token, conversation, "hi",
            simulation={"length": 30, "tokens_per_second": 30},
        )  # fmt: skip
        ws = await ChatSocket.connect(b.ws_url, account.token)
        await ws.send({"type": "subscribe", "message_id": message["id"], "after": 500})
        subscribed = await ws.recv()
        assert (subscribed["type"], subscribed["status"]) == ("subscribed", "streaming")
        sse = await read_sse(cb, account.token, message["id"], last_event_id=500)
        assert (sse.status, sse.events) == (200, [])
        ended = await asyncio.wait_for(ws.recv(), 30)
        await ws.close()
        assert ended == {
            "type": "unsubscribed",
            "message_id": message["id"],
            "after": 500,
            "status": "complete",
        }
        again = await read_sse(cb, account.token, message["id"], last_event_id=500)
        assert again.status == 204


async def test_stop_from_another_process_cancels_the_generation(two_processes, account, emulator):
    env = {"ENGINE_URL": emulator, "ENGINE_MODEL": "test-model"}
    async with two_processes(**env) as (_, _, ca, cb):
        conversation = await create_conversation(ca, account.token)
        message = await post_message(
            ca, account.token, conversation, '[[emu {"tokens": 2000, "tokens_per_second": 50}]]'
        )
        url = f"/api/messages/{message['id']}/stream/"
        async with ca.stream("GET", url, headers=auth(account.token)) as response:
            seen = []
            async for item in iter_sse(response):
                if isinstance(item, str):
                    continue
                seen.append(item.data)
                if len(seen) == 4:
                    stopped = await cb.post(
                        f"/api/messages/{message['id']}/cancel/", headers=auth(account.token)
                    )
                    assert stopped.status_code == 200
                    assert stopped.json()["status"] == "cancelled"
                if item.data["type"] == "done":
                    break
        assert seen[-1]["type"] == "done" and seen[-1]["status"] == "cancelled"
        from tests.emulator.server import wait_for_request_end

        record = await asyncio.to_thread(wait_for_request_end, emulator, f"{message['id']}.0", 10)
        assert record["outcome"] == "aborted"
        persisted = (
            await ca.get(f"/api/messages/{message['id']}/", headers=auth(account.token))
        ).json()
        assert persisted["status"] == "cancelled"
        assert persisted["content"] == text_of(seen)
        assert persisted["content"], "the partial answer is kept"


async def test_killed_process_is_reaped_and_nothing_is_lost(two_processes, account):
    fast_reaper = {"STREAM_HEARTBEAT_INTERVAL": "0.3", "STREAM_HEARTBEAT_TIMEOUT": "1.5"}
    async with two_processes(**fast_reaper) as (a, _, ca, cb):
        assert (await cb.get("/healthz")).status_code == 200  # B is up and beating
        message = await long_answer(ca, account.token, "tell me a long story")
        url = f"/api/messages/{message['id']}/stream/"
        seen: list[dict] = []
        async with cb.stream("GET", url, headers=auth(account.token)) as response:
            async for item in iter_sse(response):
                if isinstance(item, str):
                    continue
                seen.append(item.data)
                if len(seen) == 10:
                    a.kill()  # SIGKILL mid-stream: no chance to clean up
                if item.data["type"] == "done":
                    break
        done = seen[-1]
        assert done["type"] == "done" and done["status"] == "interrupted"
        assert_exact_sequence(seen)
        persisted = await wait_for_status(cb, account.token, message["id"])
        assert persisted["status"] == "interrupted"
        assert persisted["content"] == text_of(seen)
        assert len(persisted["content"]) > 0
        assert persisted["segments"][0]["status"] == "interrupted"
        assert persisted["last_seq"] == done["seq"]


async def test_deleting_a_conversation_ends_readers_of_a_dead_process_answer(
    two_processes, account
):
    """The generating process died and no reaper has acted yet (a long heartbeat timeout):
    deleting the conversation must still end the reader following the answer elsewhere."""
    slow_reaper = {"STREAM_HEARTBEAT_TIMEOUT": "600"}
    async with two_processes(**slow_reaper) as (a, _, ca, cb):
        message = await long_answer(ca, account.token, "long")
        url = f"/api/messages/{message['id']}/stream/"
        seen: list[dict] = []
        async with asyncio.timeout(60), cb.stream("GET", url, headers=auth(account.token)) as r:
            async for item in iter_sse(r):
                if isinstance(item, str):
                    continue
                seen.append(item.data)
                if len(seen) == 5:
                    a.kill()
                    deleted = await cb.delete(
                        f"/api/conversations/{message['conversation']}/",
                        headers=auth(account.token),
                    )
                    assert deleted.status_code == 204
                if item.data["type"] == "done":
                    break
        done = seen[-1]
        assert (done["type"], done["status"], done["error_type"]) == (
            "done",
            "cancelled",
            "Deleted",
        )
        gone = await cb.get(f"/api/messages/{message['id']}/", headers=auth(account.token))
        assert gone.status_code == 404


async def test_a_stop_no_process_confirms_is_said_not_answered_as_done(two_processes, account):
    """The generating process died and no reaper has acted yet: a Stop sent from another
    process reaches nobody. It is a 503 saying so (with when the answer will be ended),
    not a 200 with the answer still streaming; a regenerate that says "stop" likewise."""
    slow_reaper = {"STREAM_HEARTBEAT_TIMEOUT": "600", "STREAM_STOP_WAIT": "1"}
    async with two_processes(**slow_reaper) as (a, _, ca, cb):
        message = await long_answer(ca, account.token, "long")
        a.kill()
        stopped = await cb.post(
            f"/api/messages/{message['id']}/cancel/", headers=auth(account.token)
        )
        assert stopped.status_code == 503, stopped.text
        assert stopped.json()["error"]["code"] == "stop_unconfirmed"
        assert int(stopped.headers["retry-after"]) > 0
        again = await cb.post(
            f"/api/messages/{message['id']}/regenerate/",
            json={"stop": True},
            headers=auth(account.token),
        )
        assert again.status_code == 503, again.text
        assert again.json()["error"]["code"] == "stop_unconfirmed"
        # Each waited ``STREAM_STOP_WAIT`` for the Stop's confirmation, and says so.
        for refused in (stopped, again):
            assert "within 1 s" in refused.json()["error"]["message"], refused.text


async def test_an_answer_read_only_by_a_process_that_died_is_abandoned(two_processes, account):
    """Its only reader was in a process that was killed, which never says the reader left:
    the generating process counts again without it and abandons the answer after the
    grace, as when a reader leaves, instead of generating on for nobody."""
    env = {
        "STREAM_HEARTBEAT_INTERVAL": "0.3",
        "STREAM_HEARTBEAT_TIMEOUT": "1.5",
        "STREAM_ABANDON_GRACE": "0.5",
    }
    async with two_processes(**env) as (_, b, ca, cb):
        message = await long_answer(ca, account.token, "long")
        url = f"/api/messages/{message['id']}/stream/"
        seen = 0
        async with asyncio.timeout(30), cb.stream("GET", url, headers=auth(account.token)) as r:
            async for item in iter_sse(r):
                if not isinstance(item, str) and item.data["type"] == "delta":
                    seen += 1
                if seen == 5:
                    b.kill()
                    break
        ended = await wait_for_status(ca, account.token, message["id"], limit=60)
        assert ended["status"] == "abandoned", ended["termination"]
