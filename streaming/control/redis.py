"""Control over Redis pub/sub, on a connection of its own.

Every process subscribes to one channel (``chat:control``) on a dedicated connection and
publishes on the shared pool; the listener task only reads that connection, so no other
consumer of any shared receive path (the Channels layer's, say) can delay a Stop.
Pub/sub delivers to the processes connected at that moment: a process that is not (a
Redis restart in progress) misses the message, as it would miss any; the registry's
callers wait for the end and the reaper covers a process that died.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from streaming.control.base import Control, Handler

log = logging.getLogger(__name__)

UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, OSError)


class RedisControl(Control):
    """Options: ``LOCATION`` (the Redis URL), ``CHANNEL`` (``chat:control``)."""

    def __init__(self, *, location: str, channel: str = "chat:control") -> None:
        self.channel = channel
        # Blocking: a burst of sends past the bound waits for a connection, never fails.
        pool = aioredis.BlockingConnectionPool.from_url(
            location,
            max_connections=64,
            timeout=10,
            health_check_interval=30,
            socket_keepalive=True,
            socket_connect_timeout=5,
        )
        self.redis: aioredis.Redis = aioredis.Redis.from_pool(pool)
        self._task: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()

    async def start(self, handler: Handler) -> None:
        self._task = asyncio.create_task(
            self._listen(handler), name="control-listener", context=contextvars.Context()
        )

    async def send(self, message_id: str, message: dict[str, Any]) -> None:
        await self.redis.publish(self.channel, json.dumps({**message, "mid": message_id}))

    async def _listen(self, handler: Handler) -> None:
        delay = 0.05
        while True:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                self.subscribed.set()
                delay = 0.05
                while True:
                    raw = await pubsub.get_message(timeout=30.0)
                    if raw is None:
                        continue
                    try:
                        message = json.loads(raw["data"])
                        await handler(message)
                    except Exception:
                        log.exception("control message failed: %r", raw)
            except asyncio.CancelledError:
                raise
            except UNAVAILABLE:
                self.subscribed.clear()
                log.warning("control channel lost (Redis unreachable?); resubscribing")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.redis.aclose()
