"""Redis Streams backend: one stream per message, entry id ``<seq>-1``.

Explicit ids make ``Last-Event-ID`` map straight onto ``XRANGE``/``XREAD`` cursors and let
Redis itself reject a duplicate seq (``SeqConflict``). Appends from every generation in
the process are group-committed: whatever is queued while one pipeline is in flight goes
out in the next one, so a thousand streams cost a few round trips per tick, not a
thousand. A batch also waits ``GROUP_COMMIT_WINDOW`` after its first append, so at a token
rate where round trips are shorter than the gaps between tokens the appends of many
generations still share one round trip; while batches carry one message's appends only
(one fast generation), they go at once instead, so the window never caps a generation.
A batch is one call of a server-side script (``APPEND_SCRIPT``: the ``XADD`` and
``EXPIRE`` commands, each applied on its own as in a non-transactional pipeline) per key
group, so the client encodes one command and parses one reply per group instead of one
per event (per-command client work is the costly part of a pipeline).

Key groups keep that valid on Redis Cluster, which runs a script only over keys of one
hash slot. A log's key carries its group as a hash tag (``chat:log:{7}:<message id>``,
the group a hash of the message id), so the logs of one group share a slot and one call
appends to all of them, and the groups spread over the cluster's nodes. A batch sends
its groups' calls back to back on one connection (one round trip to a single Redis).

Redis going away (a restart, a failover) is waited out: a batch whose connection failed
is sent again with backoff for up to ``UNAVAILABLE_RETRY_SECONDS`` while later appends
queue behind it, so the log keeps its order and the generations just pause; followers
keep their cursor and resume reading when Redis answers again.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import zlib
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from streaming.conf import streaming_settings
from streaming.events import DONE, START, Event, Logged, decode, encode
from streaming.redisclient import reconnecting
from streaming.streamlog.base import (
    TOMBSTONE_SECONDS,
    Appended,
    LogDeleted,
    LogLost,
    LogUnreachable,
    SeqConflict,
    StreamLog,
    deleted_done,
)

KEY_PREFIX = "chat:log:"
# The default number of key groups (``KEY_GROUPS``): enough to spread over the masters of
# a cluster, few enough that a batch of many messages is a few calls.
KEY_GROUPS = 16
RETRY_FIRST_DELAY = 0.05
# Messages whose logs go in one round trip when a conversation is deleted.
DELETE_BATCH = 500
RETRY_MAX_DELAY = 1.0
UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, OSError)

log = logging.getLogger(__name__)

# KEYS[i] is the log of event i. ARGV: the TTL for a finished log, the TTL for a live one,
# one letter per event ("d": a `done`, sets the finished TTL; "s": a `start`, sets the live
# TTL; "-": neither), one letter per event ("c": the first of a contiguous append, whose
# log must hold the seq before it; "-": no check), then (entry id, payload) per event.
# Each XADD is applied or fails on its own (pcall); the reply lists, per event, "" or the
# error's message, or "lost <seq>" for every event of an append whose log lost its tail
# (none of them is added; <seq> is the newest the log holds).
APPEND_SCRIPT = """
local out = {}
local kinds = ARGV[3]
local checks = ARGV[4]
local lost_key = nil
local lost = ''
for i = 1, #KEYS do
  local key = KEYS[i]
  local id = ARGV[2 * i + 3]
  if string.sub(checks, i, i) == 'c' then
    lost_key = nil
    local want = tonumber(string.match(id, '^%d+')) - 1
    -- Seqs are distinct and positive, so a log of `want` entries or more holds a seq of
    -- `want` or above: one cheap count answers for every log that is whole from seq 1;
    -- only the others are asked for their newest entry.
    if redis.call('XLEN', key) < want then
      local newest = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)[1]
      local have = 0
      if newest then
        have = tonumber(string.match(newest[1], '^%d+'))
      end
      if have < want then
        lost_key = key
        lost = 'lost ' .. have
      end
    end
  elseif lost_key ~= key then
    lost_key = nil
  end
  if lost_key == key then
    out[i] = lost
  else
    local added = redis.pcall('XADD', key, id, 'e', ARGV[2 * i + 4])
    if type(added) == 'table' and added.err then
      out[i] = added.err
    else
      out[i] = ''
    end
    local kind = string.sub(kinds, i, i)
    if kind == 'd' then
      redis.call('EXPIRE', key, ARGV[1])
    elseif kind == 's' then
      redis.call('EXPIRE', key, ARGV[2])
    end
  end
end
return out
"""


# One queued append: the message, its events, its callback, whether it is ``contiguous``.
_Append = tuple[str, list[Event], Appended, bool]


def _bulk(data: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%b\r\n" % (len(data), data)


_EVALSHA = _bulk(b"EVALSHA")
_EVAL = _bulk(b"EVAL")
_SCRIPT = _bulk(APPEND_SCRIPT.encode())
_SHA = _bulk(hashlib.sha1(APPEND_SCRIPT.encode()).hexdigest().encode())


def key_group(message_id: str, groups: int = KEY_GROUPS) -> int:
    """The group of a message's log keys: a stable hash of its id (every process agrees)."""
    return zlib.crc32(message_id.encode()) % groups


def stream_key(message_id: str, groups: int = KEY_GROUPS) -> str:
    """The log's key; ``{<group>}`` is its Redis Cluster hash tag."""
    return _grouped_key(key_group(message_id, groups), message_id)


def _grouped_key(group: int, message_id: str) -> str:
    return f"{KEY_PREFIX}{{{group}}}:{message_id}"


def tombstone_key(message_id: str, groups: int = KEY_GROUPS) -> str:
    """Set for a while when a log is deleted (a follower blocked on it learns why it
    stopped); in the log's hash slot."""
    return f"{stream_key(message_id, groups)}:deleted"


def _entry_id(seq: int) -> str:
    return f"{seq}-1"


async def _run_scripts(
    connection: Any, calls: list[list[bytes]], verb: bytes, script: bytes
) -> list[Any]:
    """Send ``verb script <call>`` for each call in one write, then read every reply: an
    error reply is returned in its place (the connection stays in step)."""
    frames = [b"".join([b"*%d\r\n" % (2 + len(args)), verb, script, *args]) for args in calls]
    await connection.send_packed_command(b"".join(frames))
    replies: list[Any] = []
    for _ in calls:
        try:
            replies.append(await connection.read_response())
        except ResponseError as exc:
            replies.append(exc)
    return replies


def _errors(appends: list[_Append], replies: list[Any], retry: bool) -> list[Exception | None]:
    """Each append's outcome from its group's reply (one entry per event, in order)."""
    results: list[Exception | None] = []
    position = 0
    for message_id, events, _appended, _contiguous in appends:
        error: Exception | None = None
        for reply in replies[position : position + len(events)]:
            if not reply:
                continue
            text = reply.decode() if isinstance(reply, bytes) else str(reply)
            if text.startswith("lost "):
                error = LogLost(message_id, int(text[5:]))
            elif "equal or smaller" not in text:
                error = ResponseError(text)
            elif not retry:
                error = SeqConflict(text)
            else:
                continue
            break
        results.append(error)
        position += len(events)
    return results


def _decode(entries: Any) -> list[Event]:
    """Events from ``XRANGE``/``XREAD`` entries, each keeping the bytes it was stored as."""
    return [Logged(decode(raw := fields[b"e"]), raw) for _id, fields in entries]


class RedisStreamLog(StreamLog):
    """Options (``STREAMING["LOG"]``): ``LOCATION`` (the Redis URL); ``FOLLOW_BLOCK_MS``,
    how long a follower blocks per ``XREAD`` before re-checking (short enough to notice a
    stream deleted under it, long enough to cost nothing when idle);
    ``GROUP_COMMIT_WINDOW``, seconds a pipeline collects appends before it is sent (a few
    ms of latency per token for a several-fold cut in pipelines per second under load);
    ``UNAVAILABLE_RETRY_SECONDS``, how long an append waits for an unreachable Redis
    before its generation gets the error; ``MAX_CONNECTIONS``, the pool's bound;
    ``KEY_GROUPS``, how many hash tags the logs' keys spread over (every process of a
    deployment must use the same number: it is part of every log's key)."""

    def __init__(
        self,
        location: str,
        *,
        follow_block_ms: int = 5_000,
        group_commit_window: float = 0.002,
        unavailable_retry_seconds: float = 60.0,
        max_connections: int = 4096,
        key_groups: int = KEY_GROUPS,
    ) -> None:
        if not isinstance(key_groups, int) or key_groups < 1:
            raise ValueError("KEY_GROUPS must be a whole number of at least 1")
        self._url = location
        self.key_groups = key_groups
        self.follow_block_ms = follow_block_ms
        self.group_commit_window = group_commit_window
        self.unavailable_retry_seconds = unavailable_retry_seconds
        # Appends and reads share one pool; each follower holds one connection while it
        # blocks, so the pool is sized for many concurrent cross-process followers.
        # The socket timeout must outlast a blocking XREAD (redis-py defaults to 5 s, which
        # equals the default block and would turn idle follows into timeouts).
        self._redis = aioredis.Redis.from_url(
            location,
            max_connections=max_connections,
            **reconnecting(),
            health_check_interval=30,
            socket_keepalive=True,
            socket_timeout=follow_block_ms / 1000 + 10,
            socket_connect_timeout=5,
        )
        self._queue: list[_Append] = []
        # Whether the last batch carried the appends of more than one message.
        self._shared = True
        self._flusher: asyncio.Task[None] | None = None
        # The connection appends go out on (``_call_script``).
        self._writer: Any = None

    def submit(
        self,
        message_id: str,
        events: list[Event],
        appended: Appended,
        *,
        contiguous: bool = False,
    ) -> None:
        self._queue.append((message_id, events, appended, contiguous))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_loop())

    async def _flush_loop(self) -> None:
        while self._queue:
            # The window pays when appends of several messages share a batch; when the last
            # batch held one message's only, waiting would just slow that one generation
            # (to one event per window), so the next batch goes at once.
            if self._shared:
                await asyncio.sleep(self.group_commit_window)
            else:
                await asyncio.sleep(0)  # let the appends of this loop turn join the batch
            batch, self._queue = self._queue, []
            self._shared = len({append[0] for append in batch}) > 1
            try:
                results: list[Exception | None] = await self._send_until_reachable(batch)
            except Exception as exc:  # unreachable for too long: every writer learns it
                results = [exc] * len(batch)
            for (_mid, _events, appended, _contiguous), error in zip(batch, results, strict=True):
                try:
                    appended(error)
                except Exception:  # one writer's failure is not the other writers'
                    log.exception("an append's callback failed")

    async def _send_until_reachable(self, batch: list[_Append]) -> list[Exception | None]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.unavailable_retry_seconds
        delay = RETRY_FIRST_DELAY
        retry = False
        while True:
            try:
                return await self._send(batch, retry)
            except UNAVAILABLE as exc:
                if loop.time() + delay > deadline:
                    held = self.unavailable_retry_seconds
                    log.error("Redis unreachable for %g s; appends given up: %s", held, exc)
                    raise LogUnreachable(
                        f"the event log could not be reached for {held:g} s"
                    ) from exc
                if not retry:
                    log.warning("Redis unreachable; holding %d appends and retrying", len(batch))
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_DELAY)
                retry = True

    def _key(self, message_id: str) -> str:
        return stream_key(message_id, self.key_groups)

    async def _send(self, batch: list[_Append], retry: bool = False) -> list[Exception | None]:
        """One script call per key group of the batch, sent together. On a ``retry`` an
        event Redis already holds was applied by the attempt whose connection failed, so
        it counts as appended (and satisfies a ``contiguous`` check: the check sees it
        there). A message's appends are all in its group's call, in the order given."""
        groups: dict[int, list[int]] = {}
        for at, append in enumerate(batch):
            groups.setdefault(key_group(append[0], self.key_groups), []).append(at)
        calls = [[batch[at] for at in members] for members in groups.values()]
        replies = await self._call_script(
            [
                self._script_args(group, appends)
                for group, appends in zip(groups, calls, strict=True)
            ]
        )
        results: list[Exception | None] = [None] * len(batch)
        for members, appends, reply in zip(groups.values(), calls, replies, strict=True):
            for at, error in zip(members, _errors(appends, reply, retry), strict=True):
                results[at] = error
        lost = [at for at, error in enumerate(results) if isinstance(error, LogLost)]
        if lost:  # rare: a log deleted, or a Redis that lost data
            pipe = self._redis.pipeline(transaction=False)
            for at in lost:
                pipe.exists(tombstone_key(batch[at][0], self.key_groups))
            for at, deleted in zip(lost, await pipe.execute(), strict=True):
                if deleted:
                    results[at] = LogDeleted(batch[at][0])
        return results

    def _script_args(self, group: int, appends: list[_Append]) -> list[bytes]:
        """``APPEND_SCRIPT``'s keys and arguments for ``appends``, all of key group
        ``group`` (RESP bulk strings)."""
        keys: list[bytes] = []
        kinds: list[str] = []
        checks: list[str] = []
        entries: list[bytes] = []
        for message_id, events, _appended, contiguous in appends:
            key = _bulk(_grouped_key(group, message_id).encode())
            checks.append("c" if contiguous else "-")
            if len(events) > 1:
                checks.append("-" * (len(events) - 1))
            for event in events:
                keys.append(key)
                kind = event["type"]
                kinds.append("d" if kind == DONE else "s" if kind == START else "-")
                entries += (_bulk(_entry_id(event["seq"]).encode()), _bulk(encode(event)))
        # A live log outlives any generation; a finished one is kept for resumes.
        ttl = streaming_settings.LOG_TTL
        return [
            _bulk(b"%d" % len(keys)),
            *keys,
            _bulk(b"%d" % ttl),
            _bulk(b"%d" % (ttl * 2)),
            _bulk("".join(kinds).encode()),
            _bulk("".join(checks).encode()),
            *entries,
        ]

    async def _call_script(self, calls: list[list[bytes]]) -> list[Any]:
        """``APPEND_SCRIPT`` once for each of ``calls`` (its keys and arguments, RESP bulk
        strings), sent back to back, by its SHA, and whole again for the calls Redis
        could not run by SHA (a restarted Redis has no scripts); the replies in order.
        Another error reply fails the whole batch, once every reply is read.

        Packed here and sent on the appends' own connection: redis-py's command packing
        encodes every argument on its own, which was most of an append's client-side
        cost, and taking a connection from the pool and giving it back cost as much as
        the rest of the call. One batch is in flight at a time (one flusher), so one
        connection, taken once, serves them all; it goes back, closed, when a call on it
        fails in a way that may leave a reply unread. And no retry inside the client:
        only ``_send_until_reachable`` knows that a batch sent again may find its events
        already there."""
        connection = self._writer
        if connection is None:
            pool = self._redis.connection_pool
            connection = self._writer = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            replies = await _run_scripts(connection, calls, _EVALSHA, _SHA)
            unknown = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
            if unknown:
                again = await _run_scripts(connection, [calls[i] for i in unknown], _EVAL, _SCRIPT)
                for i, reply in zip(unknown, again, strict=True):
                    replies[i] = reply
        except BaseException:
            self._writer = None
            await connection.disconnect()
            await self._redis.connection_pool.release(connection)
            raise
        for reply in replies:
            if isinstance(reply, ResponseError):
                raise reply
        return replies

    async def read(self, message_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        entries: Any = await self._redis.xrange(
            self._key(message_id), min=f"({_entry_id(after)}", count=limit
        )
        return _decode(entries)

    async def follow(self, message_id: str, after: int = 0) -> AsyncIterator[list[Event]]:
        key = self._key(message_id)
        cursor: str | None = None  # known once the log's end is read (see the contract)
        delay = RETRY_FIRST_DELAY
        while True:
            try:
                if cursor is None:
                    last = await self.last_seq(message_id) if after > 0 else 0
                    cursor = _entry_id(max(min(after, last - 1), 0))
                reply: Any = await self._redis.xread(
                    {key: cursor}, block=self.follow_block_ms, count=1000
                )
            except UNAVAILABLE:
                await asyncio.sleep(delay)  # Redis restarting: keep the cursor, try again
                delay = min(delay * 2, RETRY_MAX_DELAY)
                continue
            delay = RETRY_FIRST_DELAY
            if not reply:
                # Idle for a block: was the log deleted under us (a deletion does not wake
                # a blocked XREAD)? One EXISTS per idle follower per block.
                try:
                    deleted = bool(
                        await self._redis.exists(tombstone_key(message_id, self.key_groups))
                    )
                except UNAVAILABLE:
                    deleted = False
                if deleted:
                    yield [deleted_done(max(after, int(cursor.split("-")[0])))]
                    return
                continue
            entries = reply[0][1]
            batch = _decode(entries)
            cursor = entries[-1][0].decode()
            yield batch
            if batch[-1]["type"] == DONE:
                return

    async def last_seq(self, message_id: str) -> int:
        entries: Any = await self._redis.xrevrange(self._key(message_id), count=1)
        return int(entries[0][0].split(b"-")[0]) if entries else 0

    async def delete(self, message_id: str) -> None:
        await self.delete_many([message_id])

    async def delete_many(self, message_ids: list[str]) -> None:
        """A round trip per ``DELETE_BATCH`` messages, not per message: each command on
        its own key (no transaction), so the keys may live on different shards."""
        for start in range(0, len(message_ids), DELETE_BATCH):
            pipe = self._redis.pipeline(transaction=False)
            for message_id in message_ids[start : start + DELETE_BATCH]:
                pipe.set(tombstone_key(message_id, self.key_groups), "1", ex=TOMBSTONE_SECONDS)
                pipe.delete(self._key(message_id))
            await pipe.execute()

    async def ping(self) -> None:
        await self._redis.ping()

    async def close(self) -> None:
        if self._writer is not None:
            await self._redis.connection_pool.release(self._writer)
            self._writer = None
        await self._redis.aclose()
