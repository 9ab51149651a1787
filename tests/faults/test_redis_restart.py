"""Redis killed and restarted (empty) in the middle of a stream.

The generating process keeps its tokens in order while the log is unreachable and appends
them once Redis is back; a reader in the same process and one in another process (which
follows the log through Redis) both get every token exactly once, and the stored message
matches.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.faults.readers import Reader, answer_being_read, assert_exact
from tests.support.clients import (
    auth,
    create_conversation,
    post_message,
    read_sse,
    text_of,
    wait_for_message,
    wait_for_status,
)
from tests.support.redis import PrivateRedis
from tests.support.wsclient import ChatSocket

pytestmark = [pytest.mark.asyncio, pytest.mark.redis]

OUTAGE_SECONDS = 1.5  # how long Redis stays down: the fault itself, not a synchronisation


async def restart(redis: PrivateRedis) -> None:
    """Redis killed, down for ``OUTAGE_SECONDS``, and started again empty."""
    redis.kill()
    await asyncio.sleep(OUTAGE_SECONDS)
    redis.start()


async def test_redis_restart_mid_stream_loses_nothing(private_redis, two_processes, account):
    env = {"REDIS_URL": private_redis.url, "STREAM_HEARTBEAT_INTERVAL": "0.5"}
    async with two_processes("gen", "follow", **env) as (_, _, a, b):
        conversation = await create_conversation(a, account.token)
        message = await post_message(
            a, account.token, conversation, "hi",
            simulation={"length": 150, "tokens_per_second": 50, "ttft_ms": 0},
        )  # fmt: skip
        local = Reader(a, account.token, message["id"])
        remote = Reader(b, account.token, message["id"])
        tasks = [asyncio.create_task(r.run()) for r in (local, remote)]
        async with asyncio.timeout(30):
            await local.seen(10).wait()
            await remote.seen(10).wait()
        await restart(private_redis)
        async with asyncio.timeout(60):
            await asyncio.gather(*tasks)
        stored = await a.get(f"/api/messages/{message['id']}/", headers=auth(account.token))
        persisted = stored.json()
        assert persisted["status"] == "complete", persisted["termination"]
        assert local.deltas > 10 and remote.deltas > 10
        assert_exact(local.events, persisted)
        assert_exact(remote.events, persisted)
        assert len(persisted["content"]) > 0
        # A reader arriving after the restart, from the beginning: the log holds only what
        # came after the restart, the database the rest; the reader gets all of it.
        late = Reader(b, account.token, message["id"])
        async with asyncio.timeout(30):
            await late.run()
        assert late.events[-1]["type"] == "done"
        assert text_of(late.events) == persisted["content"]


async def test_an_answer_read_only_in_another_process_outlives_a_redis_restart(
    private_redis, two_processes, account
):
    """The only reader is in a process that does not generate: the generating process
    knows of it from its count in Redis, which the restart lost. The reader's process
    writes its counts again (its heartbeat was gone), so the answer is not abandoned
    under a reader that is still there, and ends complete."""
    env = {
        "REDIS_URL": private_redis.url,
        "STREAM_HEARTBEAT_INTERVAL": "0.3",
        "STREAM_HEARTBEAT_TIMEOUT": "2",  # a recount of the readers every second
        "STREAM_ABANDON_GRACE": "1",
    }
    async with two_processes("gen", "follow", **env) as (_, _, a, b):
        slow = {"length": 160, "tokens_per_second": 20, "ttft_ms": 0}
        message, remote, task = await answer_being_read(a, b, account.token, slow, seen=10)
        await restart(private_redis)
        async with asyncio.timeout(60):
            await task
        persisted = await wait_for_status(b, account.token, message["id"])
        assert persisted["status"] == "complete", persisted["termination"]
        assert_exact(remote.events, persisted)


async def test_redis_restart_then_a_crash_keeps_the_text_from_its_first_character(
    private_redis, two_processes, account
):
    """After a restart the log holds only what came since; the generating process then
    dies. The reaper splices the database's text (which records the seq it reaches) with
    the log's tail: nothing from before the restart is lost."""
    env = {
        "REDIS_URL": private_redis.url,
        "STREAM_HEARTBEAT_INTERVAL": "0.3",
        "STREAM_HEARTBEAT_TIMEOUT": "1.5",
        "STREAM_FLUSH_INTERVAL": "0.1",
    }
    async with two_processes("gen", "reap", **env) as (generating, _, a, b):
        long = {"length": 2000, "tokens_per_second": 40, "ttft_ms": 0}
        message, remote, task = await answer_being_read(a, b, account.token, long, seen=20)
        await restart(private_redis)
        async with asyncio.timeout(30):
            await remote.seen(remote.deltas + 20).wait()  # streaming again, on the new log
        generating.kill()
        async with asyncio.timeout(60):
            await task
        persisted = await wait_for_status(b, account.token, message["id"])
        assert persisted["status"] == "interrupted", persisted["termination"]
        assert_exact(remote.events, persisted)
        first = next(e["text"] for e in remote.events if e["type"] == "delta")
        assert persisted["content"].startswith(first)


async def streaming_answer(client: httpx.AsyncClient, token: str) -> dict[str, Any]:
    """An answer that streams for about 5 s, long enough to outlive the outage's start."""
    conversation = await create_conversation(client, token)
    return await post_message(
        client, token, conversation, "hi",
        simulation={"length": 200, "tokens_per_second": 40, "ttft_ms": 0},
    )  # fmt: skip


async def test_a_websocket_subscription_while_redis_is_down_is_told_and_resumes(
    private_redis, two_processes, account
):
    """A reader in another process than the generation's cannot attach (its count must
    reach that process through Redis): it gets an error naming its cursor, not heartbeats
    only; subscribing again once Redis is back streams the answer to its end."""
    env = {"REDIS_URL": private_redis.url, "STREAM_HEARTBEAT_INTERVAL": "0.5"}
    async with two_processes("gen", "ws", **env) as (_, following, client, _):
        message = await streaming_answer(client, account.token)
        ws = await ChatSocket.connect(following.ws_url, account.token)
        try:
            private_redis.kill()
            await ws.send({"type": "subscribe", "message_id": message["id"]})
            async with asyncio.timeout(30):
                frames = await ws.recv_until("error", message["id"])
            failed = frames[-1]
            assert (failed["code"], failed["after"]) == ("stream_failed", 0)
            private_redis.start()
            await ws.send({"type": "subscribe", "message_id": message["id"]})
            async with asyncio.timeout(60):
                events = await ws.events_until_done(message["id"])
        finally:
            await ws.close()
        stored = await wait_for_status(client, account.token, message["id"])
    assert events[-1]["type"] == "done"
    assert text_of(events) == stored["content"]


async def test_a_subscription_while_redis_is_down_follows_its_own_process_answer(
    private_redis, daphne, account
):
    """A reader in the generating process is counted there, without Redis: it waits with
    the generation while the log holds its appends, and gets every token once Redis is
    back, as a reader that attached before the outage does."""
    server = daphne("ws", REDIS_URL=private_redis.url, STREAM_HEARTBEAT_INTERVAL="0.5")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        message = await streaming_answer(client, account.token)
        ws = await ChatSocket.connect(server.ws_url, account.token)
        try:
            private_redis.kill()
            await ws.send({"type": "subscribe", "message_id": message["id"]})
            async with asyncio.timeout(30):
                subscribed = await ws.recv_until("subscribed", message["id"])
            assert subscribed[-1]["status"] == "streaming"
            await asyncio.sleep(OUTAGE_SECONDS)
            private_redis.start()
            async with asyncio.timeout(60):
                frames = await ws.recv_until("done", message["id"])
        finally:
            await ws.close()
        stored = await wait_for_status(client, account.token, message["id"])
    assert [f for f in frames if f["type"] == "error"] == []
    assert stored["status"] == "complete", stored["termination"]
    assert_exact([f for f in frames if "seq" in f and f["message_id"] == message["id"]], stored)


async def test_a_late_reader_while_redis_is_down_starts_from_the_database(
    private_redis, daphne, account
):
    """A reader from the start that arrives during the outage, once the generating
    process's topic has let go of what the database stores, cannot read the log: it gets
    the stored text from the database and what the topic holds at once, then the rest
    once Redis is back - exactly once each, never ``stream_failed``."""
    server = daphne("ws", REDIS_URL=private_redis.url, STREAM_HEARTBEAT_INTERVAL="0.5")
    subscribe = {"type": "subscribe", "message_id": "", "after": 0}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        message = await streaming_answer(client, account.token)
        subscribe["message_id"] = message["id"]
        # A reader that sees the answer well under way, then leaves: nothing pins the
        # topic's early events any more, and the write-behind stores them.
        early = await ChatSocket.connect(server.ws_url, account.token)
        await early.send(subscribe)
        deltas = 0
        async with asyncio.timeout(30):
            while deltas < 40:
                deltas += (await early.recv()).get("type") == "delta"
        await early.close()
        await wait_for_message(client, account.token, message["id"], lambda m: m["content"])
        late = await ChatSocket.connect(server.ws_url, account.token)
        try:
            private_redis.kill()
            await late.send(subscribe)
            async with asyncio.timeout(30):
                frames = await late.recv_until("delta", message["id"])
            assert [f for f in frames if f["type"] == "error"] == []
            private_redis.start()
            async with asyncio.timeout(60):
                frames += await late.recv_until("done", message["id"])
        finally:
            await late.close()
        stored = await wait_for_status(client, account.token, message["id"])
    assert [f for f in frames if f["type"] == "error"] == []
    assert stored["status"] == "complete", stored["termination"]
    assert_exact([f for f in frames if "seq" in f and f["message_id"] == message["id"]], stored)


async def test_connections_held_across_a_restart_serve_the_first_requests_after_it(
    private_redis, two_processes, account
):
    """Each process's pools hold connections that the restart ended; the first requests
    after it (a reader in another process replaying the log, a Stop sent from there, the
    readiness check) are served, not failed on a dead connection."""
    env = {"REDIS_URL": private_redis.url}
    slow = {"length": 400, "tokens_per_second": 20, "ttft_ms": 0}
    async with two_processes("gen", "other", **env) as (_, _, a, b):

        async def answer_read_elsewhere(simulation: dict[str, Any]) -> tuple[str, Any]:
            conversation = await create_conversation(a, account.token)
            message = await post_message(a, account.token, conversation, "hi", **simulation)
            return message["id"], asyncio.create_task(read_sse(b, account.token, message["id"]))

        # Connections in every pool: answers read in the other process, a Stop sent there.
        warm = [await answer_read_elsewhere({"simulation": slow}) for _ in range(3)]
        for message_id, reading in warm:
            stopped = await b.post(
                f"/api/messages/{message_id}/cancel/", headers=auth(account.token)
            )
            assert stopped.status_code == 200, stopped.text
            assert (await reading).events[-1].data["type"] == "done"

        private_redis.kill()
        private_redis.start()

        started = [await answer_read_elsewhere({"simulation": slow}) for _ in range(3)]
        for side in (a, b):
            ready = await side.get("/readyz")
            assert ready.status_code == 200, ready.text
        for message_id, reading in started:
            stopped = await b.post(
                f"/api/messages/{message_id}/cancel/", headers=auth(account.token)
            )
            assert stopped.status_code == 200, stopped.text
            assert stopped.json()["status"] == "cancelled"
            events = [item.data for item in (await reading).events]
            assert events and events[-1]["type"] == "done", events[-3:]
            stored = await wait_for_status(a, account.token, message_id)
            assert text_of(events) == stored["content"]
