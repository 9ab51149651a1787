"""Who is reading a message, counted across processes.

Abandonment needs "no reader anywhere": each process counts its own readers and, with
Redis, publishes its count in a per-message hash keyed by worker id. Counts of dead
workers are ignored (their heartbeat key is gone), so a crashed process never keeps a
generation alive. When a count changes the generating process is told, locally by a
call; a process that does not run the generation tells it over the control channel only
when its own count goes from or to zero (only then can the total do so). Readers of a
finished message are counted locally only (shutdown waits for them); nobody else asks.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from streaming.worker import worker_key

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from streaming.runtime import Runtime

READERS_PREFIX = "chat:readers:"
READERS_TTL = 24 * 3600


class Presence:
    def __init__(self, runtime: Runtime, redis: aioredis.Redis | None) -> None:
        self.runtime = runtime
        self.redis = redis
        self.local: dict[str, int] = {}
        # Set while no reader is attached in this process (shutdown waits for it).
        self.idle = asyncio.Event()
        self.idle.set()

    async def attach(self, message_id: str, *, live: bool = True) -> None:
        """``live``: the message may still be generating (else: count locally only)."""
        self.local[message_id] = self.local.get(message_id, 0) + 1
        self.idle.clear()
        if live:
            await self._publish(message_id, 1)

    async def detach(self, message_id: str, *, live: bool = True, ended: bool = False) -> None:
        """``ended``: the reader saw the answer's end, so no generation can want the news
        (the count is still published: a later Continue counts readers again)."""
        left = self.local.get(message_id, 0) - 1
        if left > 0:
            self.local[message_id] = left
        else:
            self.local.pop(message_id, None)
            if not self.local:
                self.idle.set()
        if live:
            await self._publish(message_id, -1, notify=not ended)

    async def _publish(self, message_id: str, change: int, *, notify: bool = True) -> None:
        """Publish this process's count and tell the generation, in one Redis round trip.

        When the generation runs here and this process has no reader of it left, the
        other processes' counts are read in the same pipeline as our own update, so a
        disconnect reaches the engine abort after one round trip instead of three.
        """
        generation = self.runtime.generations.get(message_id)
        if self.redis is None:
            if notify and generation is not None:
                generation.readers_changed(self.local.get(message_id, 0))
            return
        key = READERS_PREFIX + message_id
        pipe = self.redis.pipeline(transaction=False)
        pipe.hincrby(key, self.runtime.worker_id, change)
        pipe.expire(key, READERS_TTL)
        counted = notify and generation is not None and not self.local.get(message_id)
        if counted:
            pipe.hgetall(key)
        replies = await pipe.execute()
        if not notify:
            return
        local = self.local.get(message_id, 0)
        if generation is None:
            if local == (1 if change > 0 else 0):
                await self.runtime.control.send(message_id, {"type": "generation.readers"})
            return
        if local or not counted:
            generation.readers_changed(local or await self.count(message_id))
            return
        generation.readers_changed(await self._others(replies[2]))

    async def count(self, message_id: str) -> int:
        local = self.local.get(message_id, 0)
        if local or self.redis is None:
            return local
        return await self._others(await self.redis.hgetall(READERS_PREFIX + message_id))

    async def _others(self, counts: dict[bytes, bytes]) -> int:
        """Readers in other live processes, from the counts hash (dead workers ignored)."""
        assert self.redis is not None
        others = {
            worker.decode(): int(value)
            for worker, value in counts.items()
            if int(value) > 0 and worker.decode() != self.runtime.worker_id
        }
        if not others:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for worker in others:
            pipe.exists(worker_key(worker))
        alive = await pipe.execute()
        return sum(n for (_, n), up in zip(others.items(), alive, strict=True) if up)
