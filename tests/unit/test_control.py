"""Control over Redis pub/sub: messages given while a PUBLISH is in flight leave in the
next one, in the order given, and every listener hands each to its handler in that
order; a send is done once Redis has the message; a payload that is not control's is
logged and skipped. Against the Redis at ``REDIS_URL``, on a channel of the test's own."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from streaming.control.memory import MemoryControl
from streaming.control.redis import RedisControl

REDIS_URL = os.environ.get("REDIS_URL", "")
HANG = 10.0

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.skipif(not REDIS_URL, reason="needs REDIS_URL"),
]


class Kept:
    """A handler keeping what it gets; ``wait_for(n)`` returns once it has ``n``."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._changed = asyncio.Event()

    async def __call__(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        self._changed.set()

    async def wait_for(self, count: int) -> list[dict[str, Any]]:
        async with asyncio.timeout(HANG):
            while len(self.messages) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.messages


@pytest.fixture
async def channel() -> AsyncIterator[str]:
    yield f"tests:control:{uuid.uuid4().hex}"


async def listening(channel: str, handler: Kept) -> RedisControl:
    control = RedisControl(location=REDIS_URL, channel=channel)
    await control.start(handler)
    await asyncio.wait_for(control.subscribed.wait(), HANG)
    return control


async def test_messages_given_together_leave_in_one_publish_in_order(channel: str) -> None:
    here, there = Kept(), Kept()
    sender = await listening(channel, here)
    receiver = await listening(channel, there)
    raw = aioredis.Redis.from_url(REDIS_URL)
    watcher = raw.pubsub(ignore_subscribe_messages=True)
    await watcher.subscribe(channel)
    try:
        # The first is sent alone (nothing is in flight when its PUBLISH starts); the
        # others are given while it is in flight, and go together after it.
        sender.post("m1", {"type": "a", "n": 1})
        waited = asyncio.ensure_future(sender.send("m2", {"type": "b", "n": 2}))
        await asyncio.sleep(0)  # the PUBLISH of m1 starts, then m2 is given
        sender.post("m3", {"type": "c", "n": 3})
        await asyncio.wait_for(waited, HANG)
        expected = [
            {"type": "a", "n": 1, "mid": "m1"},
            {"type": "b", "n": 2, "mid": "m2"},
            {"type": "c", "n": 3, "mid": "m3"},
        ]
        assert await here.wait_for(3) == expected
        assert await there.wait_for(3) == expected
        payloads: list[bytes] = []
        async with asyncio.timeout(HANG):
            while len(payloads) < 2:
                got = await watcher.get_message(timeout=HANG)
                if got is not None:
                    payloads.append(got["data"])
        assert payloads[0].startswith(b"{")
        assert payloads[1].startswith(b"[")
    finally:
        await watcher.aclose()
        await raw.aclose()
        await sender.stop()
        await receiver.stop()


async def test_a_payload_that_is_not_controls_is_skipped(
    channel: str, caplog: pytest.LogCaptureFixture
) -> None:
    kept = Kept()
    control = await listening(channel, kept)
    raw = aioredis.Redis.from_url(REDIS_URL)
    try:
        await raw.publish(channel, b"not json")
        await control.send("m1", {"type": "after"})
        assert await kept.wait_for(1) == [{"type": "after", "mid": "m1"}]
        assert "control message failed" in caplog.text
    finally:
        await raw.aclose()
        await control.stop()


async def test_a_send_to_an_unreachable_redis_fails_and_posts_are_logged_once_a_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A port nothing listens on (the listener is never started: only sends are tried).
    control = RedisControl(location="redis://127.0.0.1:1/0")
    try:
        for i in range(3):
            control.post(f"p{i}", {"type": "posted"})
        with pytest.raises(RedisConnectionError):
            await asyncio.wait_for(control.send("m2", {"type": "sent"}), HANG)
        lost = [r.getMessage() for r in caplog.records if "not sent" in r.getMessage()]
        assert len(lost) == 1 and lost[0].startswith("3 control message(s) not sent"), lost
    finally:
        await control.stop()


async def test_stopping_cancels_what_waits_to_be_sent(channel: str) -> None:
    control = RedisControl(location=REDIS_URL, channel=channel)
    waiting = asyncio.ensure_future(control.send("m1", {"type": "x"}))
    await asyncio.sleep(0)  # queued; its PUBLISH has not been answered yet
    await control.stop()
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_the_in_memory_control_posts_in_order() -> None:
    kept = Kept()
    control = MemoryControl()
    await control.start(kept)
    for n in range(3):
        control.post(f"m{n}", {"n": n})
    assert await kept.wait_for(3) == [{"n": n, "mid": f"m{n}"} for n in range(3)]


def _on_database(url: str, database: int) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{database}"


async def test_deployments_on_other_databases_of_one_server_do_not_hear_each_other() -> None:
    """Pub/sub channels are the server's, not a database's: each database's deployment
    has a channel of its own (``chat:control`` on database 0, where it always was)."""
    heard = {database: Kept() for database in (0, 5, 6)}
    controls = [RedisControl(location=_on_database(REDIS_URL, database)) for database in heard]
    assert [c.channel for c in controls] == ["chat:control", "chat:control:5", "chat:control:6"]
    try:
        for control, kept in zip(controls, heard.values(), strict=True):
            await control.start(kept)
            await asyncio.wait_for(control.subscribed.wait(), HANG)
        mid = uuid.uuid4().hex
        await controls[1].send(mid, {"type": "cancel"})
        await controls[1].send(mid, {"type": "cancel", "last": True})
        assert [m["mid"] for m in await heard[5].wait_for(2)] == [mid, mid]
        # The others' listeners had every chance to hear it: they got nothing of it.
        await controls[0].send(mid, {"type": "marker"})
        await heard[0].wait_for(1)
        assert [m.get("type") for m in heard[0].messages if m["mid"] == mid] == ["marker"]
        assert not [m for m in heard[6].messages if m["mid"] == mid]
    finally:
        for control in controls:
            await control.stop()
