"""In-process stream log: the embedded default, a real backend for one process.

Like Django's LocMemCache it is complete but private to its process: resume works across
reconnects to the same process, not across processes. Finished logs are kept for
``LOG_TTL`` seconds and at most ``max_messages`` of them.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator

from streaming.conf import streaming_settings
from streaming.events import DONE, Event
from streaming.streamlog.base import (
    TOMBSTONE_SECONDS,
    Appended,
    LogDeleted,
    LogLost,
    SeqConflict,
    StreamLog,
    deleted_done,
)


class _Entry:
    __slots__ = ("deleted", "events", "expires_at", "wake")

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.wake = asyncio.Event()
        self.expires_at: float | None = None
        self.deleted = False


class MemoryStreamLog(StreamLog):
    def __init__(self, max_messages: int = 10_000) -> None:
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._max_messages = max_messages
        # Deleted logs, and until when their late followers are told so.
        self._tombstones: dict[str, float] = {}

    def _entry(self, message_id: str, create: bool = False) -> _Entry | None:
        entry = self._entries.get(message_id)
        if entry is not None and entry.expires_at is not None and entry.expires_at < time.time():
            del self._entries[message_id]
            entry = None
        if entry is None and create:
            entry = self._entries[message_id] = _Entry()
            self._evict()
        return entry

    def _evict(self) -> None:
        while len(self._entries) > self._max_messages:
            for key, entry in self._entries.items():
                if entry.expires_at is not None:
                    del self._entries[key]
                    break
            else:
                return

    def submit(
        self,
        message_id: str,
        events: list[Event],
        appended: Appended,
        *,
        contiguous: bool = False,
    ) -> None:
        error: Exception | None = None
        try:
            self._add(message_id, events, contiguous)
        except (LogLost, LogDeleted, SeqConflict) as refused:
            error = refused
        asyncio.get_running_loop().call_soon(appended, error)

    async def append(
        self, message_id: str, events: list[Event], *, contiguous: bool = False
    ) -> None:
        """Applied at once, without a turn of the loop (nothing to wait for here)."""
        self._add(message_id, events, contiguous)

    def _add(self, message_id: str, events: list[Event], contiguous: bool) -> None:
        entry = self._entry(message_id)
        last = entry.events[-1]["seq"] if entry is not None and entry.events else 0
        if contiguous and events and last < events[0]["seq"] - 1:
            if self._tombstones.get(message_id, 0.0) > time.time():
                raise LogDeleted(message_id)
            raise LogLost(message_id, last)
        entry = self._entry(message_id, create=True)
        assert entry is not None
        for event in events:
            if event["seq"] <= last:
                raise SeqConflict(f"seq {event['seq']} <= {last} in {message_id}")
            last = event["seq"]
        entry.events.extend(events)
        ended = bool(events) and events[-1]["type"] == DONE
        entry.expires_at = time.time() + streaming_settings.LOG_TTL if ended else None
        entry.wake.set()
        entry.wake = asyncio.Event()

    async def read(self, message_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        entry = self._entry(message_id)
        if entry is None:
            return []
        found = _after(entry.events, after)
        return found if limit is None else found[:limit]

    async def follow(self, message_id: str, after: int = 0) -> AsyncIterator[list[Event]]:
        cursor = after
        entry = self._entry(message_id)
        if entry is not None and entry.events:
            cursor = min(after, entry.events[-1]["seq"] - 1)
        while True:
            if self._tombstones.get(message_id, 0.0) > time.time():
                yield [deleted_done(max(after, cursor))]
                return
            entry = self._entry(message_id, create=True)
            assert entry is not None
            batch = _after(entry.events, cursor)
            if batch:
                cursor = batch[-1]["seq"]
                yield batch
                if batch[-1]["type"] == DONE:
                    return
                continue
            await entry.wake.wait()

    async def last_seq(self, message_id: str) -> int:
        entry = self._entry(message_id)
        return entry.events[-1]["seq"] if entry and entry.events else 0

    async def delete(self, message_id: str) -> None:
        # Tombstones are kept in the order they expire (each lives as long): the expired
        # ones are at the front. Scanning them all on every delete made a conversation's
        # delete quadratic in its messages (70,000 took minutes).
        now = time.time()
        tombstones = self._tombstones
        while tombstones:
            oldest = next(iter(tombstones))
            if tombstones[oldest] > now:
                break
            del tombstones[oldest]
        tombstones.pop(message_id, None)
        tombstones[message_id] = now + TOMBSTONE_SECONDS
        entry = self._entries.pop(message_id, None)
        if entry is not None:
            entry.deleted = True
            entry.wake.set()


def _after(events: list[Event], after: int) -> list[Event]:
    """Events with seq > after; seqs are increasing, so bisect on the tail."""
    if not events or events[-1]["seq"] <= after:
        return []
    lo, hi = 0, len(events)
    while lo < hi:
        mid = (lo + hi) // 2
        if events[mid]["seq"] <= after:
            lo = mid + 1
        else:
            hi = mid
    return events[lo:]
