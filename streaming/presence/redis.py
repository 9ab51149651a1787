"""Presence shared through Redis, for several serving processes.

Reader counts: one hash per message, ``chat:readers:<message id>``, field = worker id,
value = that process's count. Heartbeats: ``chat:worker:<worker id>`` with a TTL of
``HEARTBEAT_TIMEOUT``, renewed every ``HEARTBEAT_INTERVAL``. Every call touches keys of
one message or one worker, so the backend works on Redis Cluster as well.

A Redis that restarted empty (or was flushed) has lost every count. A beat that finds its
own heartbeat gone writes this process's counts again, whole (``_restore``): counts are
shared as changes, so nothing else would put back the readers that were there before,
and a generation elsewhere would see none and abandon an answer that is still read.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis

from streaming.conf import streaming_settings
from streaming.presence.base import Presence, ReadersListener
from streaming.redisclient import reconnecting

READERS_PREFIX = "chat:readers:"
WORKER_PREFIX = "chat:worker:"


def worker_key(worker_id: str) -> str:
    return f"{WORKER_PREFIX}{worker_id}"


class RedisPresence(Presence):
    def __init__(
        self,
        *,
        location: str,
        worker_id: str,
        listener: ReadersListener,
        readers_ttl: int = 24 * 3600,
        max_connections: int = 256,
    ) -> None:
        super().__init__(worker_id=worker_id, listener=listener)
        self.readers_ttl = readers_ttl
        # A blocking pool: past ``max_connections`` a call waits for a connection to come
        # back (up to the socket timeout) instead of failing, so a burst of readers
        # attaching at once queues rather than ending their streams with an error.
        pool = aioredis.BlockingConnectionPool.from_url(
            location,
            max_connections=max_connections,
            timeout=10,
            **reconnecting(),
            health_check_interval=30,
            socket_keepalive=True,
            socket_timeout=10,
            socket_connect_timeout=5,
        )
        self.redis: aioredis.Redis = aioredis.Redis.from_pool(pool)
        # Restoring the counts (``_restore``) waits for the changes being sent and holds
        # new ones back (``_open``), so each change lands either in the whole counts it
        # writes or after them, once: changes can land out of order, a whole count can't.
        self._sending = 0
        self._sent = asyncio.Event()
        self._sent.set()
        self._open = asyncio.Event()
        self._open.set()
        self._restores = 0  # how many restores took their counts
        self._restore_due = False  # the heartbeat was found gone, the counts not yet written

    async def publish(self, message_id: str, change: int, *, notify: bool, crossed: bool) -> None:
        """Publish this process's count and tell the generation, in one Redis round trip.

        When the generation runs here and this process has no reader of it left, the
        other processes' counts are read in the same pipeline as our own update, so a
        disconnect reaches the engine abort after one round trip instead of three.
        """
        listener = self.listener
        generating = listener.generating(message_id)
        key = READERS_PREFIX + message_id
        restores = self._restores
        if not self._open.is_set():
            await self._open.wait()
        pipe = self.redis.pipeline(transaction=False)
        if restores == self._restores:  # else the restore's counts hold this change
            pipe.hincrby(key, self.worker_id, change)
            pipe.expire(key, self.readers_ttl)
        counted = notify and generating and not self.local.get(message_id)
        if counted:
            pipe.hgetall(key)
        self._sending += 1
        self._sent.clear()
        try:
            replies = await pipe.execute() if len(pipe) else []
        finally:
            self._sending -= 1
            if not self._sending:
                self._sent.set()
        if not notify:
            return
        if not generating:
            # The generation's process hears of this one's count crossing zero only.
            if crossed:
                await listener.notify_remote(message_id)
            return
        local = self.local.get(message_id, 0)
        if local or not counted:
            listener.readers_changed(message_id, local or await self.count(message_id))
            return
        listener.readers_changed(message_id, await self._others(replies[-1]))

    async def count(self, message_id: str) -> int:
        local = self.local.get(message_id, 0)
        if local:
            return local
        return await self._others(await self.redis.hgetall(READERS_PREFIX + message_id))

    async def _others(self, counts: dict[Any, Any]) -> int:
        """Readers in other live processes, from the counts hash (dead workers ignored)."""
        others = {
            worker.decode(): int(value)
            for worker, value in counts.items()
            if int(value) > 0 and worker.decode() != self.worker_id
        }
        if not others:
            return 0
        alive = await self._alive(list(others))
        return sum(n for (_, n), up in zip(others.items(), alive, strict=True) if up)

    async def _alive(self, workers: list[str]) -> list[bool]:
        pipe = self.redis.pipeline(transaction=False)
        for worker in workers:
            pipe.exists(worker_key(worker))
        return [bool(up) for up in await pipe.execute()]

    async def beat(self) -> None:
        """Renew the heartbeat; one that was gone (Redis lost its keys, or this process
        was stopped for longer than ``HEARTBEAT_TIMEOUT``) restores the counts too."""
        ttl_ms = int(streaming_settings.HEARTBEAT_TIMEOUT * 1000)
        if await self.redis.set(worker_key(self.worker_id), "1", px=ttl_ms, get=True) is None:
            self._restore_due = True
        if self._restore_due:  # until a restore succeeds
            await self._restore()
            self._restore_due = False

    async def _restore(self) -> None:
        """Write this process's shared counts whole, over what Redis holds of them."""
        self._open.clear()
        try:
            await self._sent.wait()
            self._restores += 1
            counts = {mid: n for mid, n in self.shared.items() if n > 0}
            if not counts:
                return
            pipe = self.redis.pipeline(transaction=False)
            for message_id, count in counts.items():
                key = READERS_PREFIX + message_id
                pipe.hset(key, self.worker_id, count)
                pipe.expire(key, self.readers_ttl)
            await pipe.execute()
        finally:
            self._open.set()

    async def leave(self) -> None:
        await self.redis.delete(worker_key(self.worker_id))

    async def dead(self, workers: list[str]) -> list[str]:
        others = [w for w in workers if w != self.worker_id]
        if not others:
            return []
        alive = await self._alive(others)
        return [w for w, up in zip(others, alive, strict=True) if not up]

    async def ping(self) -> None:
        await self.redis.ping()

    async def close(self) -> None:
        await self.redis.aclose()
