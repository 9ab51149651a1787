"""Control over Redis pub/sub, on a connection of its own.

Every process subscribes to one channel (``chat:control``, named after the Redis database
when it is not 0: ``channel_for``) on a dedicated connection and
publishes on the shared pool; the listener task only reads that connection, so no other
consumer of any shared receive path (the Channels layer's, say) can delay a Stop.
Pub/sub delivers to the processes connected at that moment: a process that is not (a
Redis restart in progress) misses the message, as it would miss any; the registry's
callers wait for the end and the reaper covers a process that died.

Messages are group-committed, as the log's appends are: whatever is given while one
``PUBLISH`` is in flight leaves in the next, as one JSON array (a lone message as its
object), in the order given. A few feed messages go with every answer, so at a hundred
answers a second that is one command and one parse per process per batch instead of
one per message.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from streaming.control.base import Control, Handler
from streaming.redisclient import reconnecting

log = logging.getLogger(__name__)

UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, OSError)


CHANNEL = "chat:control"


def channel_for(database: int) -> str:
    """The channel of the deployments using Redis database ``database``. Pub/sub channels
    are the server's, not a database's: deployments sharing one Redis server under other
    database numbers (staging beside production, a test run beside a dev server) heard
    each other's control messages, the feed's titles of another deployment's users among
    them. Database 0 keeps the plain name."""
    return CHANNEL if database == 0 else f"{CHANNEL}:{database}"


class RedisControl(Control):
    """Options: ``LOCATION`` (the Redis URL), ``CHANNEL`` (by default ``chat:control``,
    and ``chat:control:<n>`` on database ``n``: ``channel_for``)."""

    def __init__(self, *, location: str, channel: str | None = None) -> None:
        # Blocking: a burst of sends past the bound waits for a connection, never fails.
        pool = aioredis.BlockingConnectionPool.from_url(
            location,
            max_connections=64,
            timeout=10,
            **reconnecting(),
            health_check_interval=30,
            socket_keepalive=True,
            socket_connect_timeout=5,
        )
        self.redis: aioredis.Redis = aioredis.Redis.from_pool(pool)
        self.channel = channel or channel_for(int(pool.connection_kwargs.get("db") or 0))
        self._task: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()
        # Encoded messages waiting for the next PUBLISH, with their senders' waiters
        # (None: posted, nobody waits).
        self._outgoing: list[tuple[bytes, asyncio.Future[None] | None]] = []
        self._in_flight: list[tuple[bytes, asyncio.Future[None] | None]] = []
        self._sender: asyncio.Task[None] | None = None

    async def start(self, handler: Handler) -> None:
        self._task = asyncio.create_task(
            self._listen(handler), name="control-listener", context=contextvars.Context()
        )

    async def send(self, message_id: str, message: dict[str, Any]) -> None:
        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue(message_id, message, sent)
        await sent

    def post(self, message_id: str, message: dict[str, Any]) -> None:
        self._queue(message_id, message, None)

    def _queue(
        self, message_id: str, message: dict[str, Any], sent: asyncio.Future[None] | None
    ) -> None:
        self._outgoing.append((orjson.dumps({**message, "mid": message_id}), sent))
        if self._sender is None:
            self._sender = asyncio.create_task(
                self._send_queued(), name="control-sender", context=contextvars.Context()
            )

    async def _send_queued(self) -> None:
        try:
            while self._outgoing:
                self._in_flight, self._outgoing = self._outgoing, []
                batch = self._in_flight
                if len(batch) == 1:
                    payload = batch[0][0]
                else:
                    payload = b"[%b]" % b",".join(message for message, _sent in batch)
                try:
                    await self.redis.publish(self.channel, payload)
                except Exception as exc:
                    _settle(batch, exc)
                else:
                    _settle(batch, None)
                self._in_flight = []
        finally:
            self._sender = None

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
                        decoded = orjson.loads(raw["data"])
                    except orjson.JSONDecodeError:
                        log.exception("control message failed: %r", raw)
                        continue
                    for message in decoded if isinstance(decoded, list) else [decoded]:
                        try:
                            await handler(message)
                        except Exception:
                            log.exception("control message failed: %r", message)
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
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
            self._sender = None
        # Whatever was not sent is not going to be: no waiter is left hanging.
        for _message, sent in [*self._in_flight, *self._outgoing]:
            if sent is not None:
                sent.cancel()
        self._in_flight, self._outgoing = [], []
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.redis.aclose()


def _settle(
    batch: list[tuple[bytes, asyncio.Future[None] | None]], error: Exception | None
) -> None:
    """Tell a batch's waiters how its ``PUBLISH`` went. Posted messages have nobody to
    tell, so a failed batch logs once how many of them it dropped: a Redis outage
    during a burst is one line per batch, not one per message."""
    dropped = 0
    for _message, sent in batch:
        if sent is None:
            dropped += error is not None
        elif not sent.done():
            if error is None:
                sent.set_result(None)
            else:
                sent.set_exception(error)
    if dropped:
        log.warning("%d control message(s) not sent: %s", dropped, error)
