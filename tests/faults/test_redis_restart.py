"""Redis killed and restarted (empty) in the middle of a stream.

The generating process keeps its tokens in order while the log is unreachable and appends
them once Redis is back; a reader in the same process and one in another process (which
follows the log through Redis) both get every token exactly once, and the stored message
matches.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.faults.readers import Reader, assert_exact
from tests.support.clients import auth, create_conversation, post_message

pytestmark = [pytest.mark.asyncio, pytest.mark.redis]

OUTAGE_SECONDS = 1.5  # how long Redis stays down: the fault itself, not a synchronisation


async def test_redis_restart_mid_stream_loses_nothing(daphne, account, private_redis):
    env = {"REDIS_URL": private_redis.url, "STREAM_HEARTBEAT_INTERVAL": "0.5"}
    generating = daphne("gen", **env)
    following = daphne("follow", **env)
    async with (
        httpx.AsyncClient(base_url=generating.url, timeout=30) as a,
        httpx.AsyncClient(base_url=following.url, timeout=30) as b,
    ):
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
        private_redis.kill()
        await asyncio.sleep(OUTAGE_SECONDS)
        private_redis.start()
        async with asyncio.timeout(60):
            await asyncio.gather(*tasks)
        stored = await a.get(f"/api/messages/{message['id']}/", headers=auth(account.token))
        persisted = stored.json()
        assert persisted["status"] == "complete", persisted["termination"]
        assert local.deltas > 10 and remote.deltas > 10
        assert_exact(local.events, persisted)
        assert_exact(remote.events, persisted)
        assert len(persisted["content"]) > 0
        # A reader arriving after the restart replays what the log still holds and ends.
        late = Reader(b, account.token, message["id"])
        async with asyncio.timeout(30):
            await late.run()
        assert late.events[-1]["type"] == "done"
