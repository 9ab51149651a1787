"""The stream log contract.

A message's log is a sequence of events with strictly increasing ``seq``. ``append`` with a
seq that is not above the last one raises ``SeqConflict``: that is what makes the reaper's
terminal event exactly-once when two processes race to finish the same segment.
A ``contiguous`` append is the writer saying the log must already hold the event before
it; a log that lost its tail (a Redis restarted empty, a failover to a replica that had
not caught up) refuses it with ``LogLost`` instead of leaving a silent hole, so the
writer can put back what it still holds first.

``submit`` is the append the writers use: it starts the append and calls back when it
is over, so a generation hands its events on without a task waiting on each write;
``append`` awaits the same.

``follow`` replays everything after a cursor, then yields new batches as they are appended,
and ends with the batch whose last event is a ``done``: a reader's stream covers one
segment's end. A Continue appends a new segment to the same log; readers of it subscribe
again from their cursor.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Callable

from streaming import events
from streaming.events import Event

# Told how an append ended: None once the log holds its events, else the error.
Appended = Callable[[BaseException | None], None]

# How long a deleted log is remembered as deleted, for followers that start late.
TOMBSTONE_SECONDS = 60


def deleted_done(after: int) -> Event:
    """The terminal event a follower of a deleted log ends with (the answer was stopped
    with its conversation)."""
    return events.done(
        after + 1,
        segment=-1,
        termination={
            "status": "cancelled",
            "error_type": "Deleted",
            "error_message": "the conversation was deleted",
        },
    )


class SeqConflict(Exception):
    """An event with this seq (or a later one) is already in the log."""


class LogLost(Exception):
    """The log no longer holds the event before a ``contiguous`` append; ``have`` is the
    seq of the newest event it does hold (0: none). Nothing of the append was written."""

    def __init__(self, message_id: str, have: int) -> None:
        super().__init__(f"the log of {message_id} lost its events after seq {have}")
        self.have = have


class LogDeleted(Exception):
    """The log was deleted (its conversation with it) within ``TOMBSTONE_SECONDS``: a
    ``contiguous`` append adds nothing, and its writer, whose answer is gone, stops."""

    def __init__(self, message_id: str) -> None:
        super().__init__(f"the log of {message_id} was deleted with its conversation")


class LogUnreachable(Exception):
    """The log could not be written for as long as its backend holds appends: what the
    writers are told, in the product's words (the client library's error names the
    server's address, which an answer's record never shows)."""


class StreamLog(abc.ABC):
    @abc.abstractmethod
    def submit(
        self,
        message_id: str,
        events: list[Event],
        appended: Appended,
        *,
        contiguous: bool = False,
    ) -> None:
        """Start adding ``events`` (seqs increasing, above the log's last: else
        ``SeqConflict``) and call ``appended`` once, later (never from within this call),
        with None or the error. When ``contiguous``, the log must hold seq
        ``events[0]["seq"] - 1``: else ``LogLost`` (``LogDeleted`` when the log was
        deleted), and nothing is added. The appends of
        one message are applied in the order they were submitted. A ``done`` ends a
        segment: its append alone starts the log's expiry (kept ``STREAM_LOG_TTL``
        seconds for resumes, no call of its own); a later ``start`` (a Continue) makes
        the log live again."""

    async def append(
        self, message_id: str, events: list[Event], *, contiguous: bool = False
    ) -> None:
        """``submit``, awaited: returns once the log holds ``events``, else raises."""
        await until_appended(
            lambda appended: self.submit(message_id, events, appended, contiguous=contiguous)
        )

    @abc.abstractmethod
    async def read(self, message_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        """The events with seq > after, oldest first, at most ``limit`` of them (empty if
        the log is gone)."""

    @abc.abstractmethod
    def follow(self, message_id: str, after: int = 0) -> AsyncIterator[list[Event]]:
        """Batches of events with seq > after; ends after a trailing ``done``. An
        ``after`` at or past the log's last event follows from that event instead (it
        is yielded again): a reader whose cursor is ahead of the log (a client's id from
        another message, or made up) still learns when the message ends, where a follow
        from its cursor would wait for a seq that never comes."""

    @abc.abstractmethod
    async def last_seq(self, message_id: str) -> int: ...

    @abc.abstractmethod
    async def delete(self, message_id: str) -> None:
        """Remove the log. Its followers, those waiting now and those that start within
        ``TOMBSTONE_SECONDS``, end with ``deleted_done`` instead of waiting for events
        that will never come."""

    async def delete_many(self, message_ids: list[str]) -> None:
        """``delete`` each of ``message_ids`` (a conversation's, deleted with it)."""
        for message_id in message_ids:
            await self.delete(message_id)

    async def ping(self) -> None:
        """Raise if the backend is unreachable (used by /readyz)."""

    async def close(self) -> None:
        """Release connections (tests and shutdown)."""


async def until_appended(start: Callable[[Appended], None]) -> None:
    """Call ``start`` with an ``Appended`` callback and wait for it; raise its error."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def appended(error: BaseException | None) -> None:
        if future.done():  # the waiter was cancelled
            return
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    start(appended)
    await future
