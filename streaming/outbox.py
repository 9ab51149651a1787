"""A generation's events on their way to the log: coalesced over a short window, written in
order, published to this process's readers once they are in the log.

The generation adds events as the engine produces them and never waits on the log, so a
slow append never holds up reading the engine. Events added while a write is in flight,
or within ``window`` seconds of the previous write, are merged (``events.merge``: a run of
deltas becomes one delta) and numbered when they are written, so seqs stay contiguous and
one log event may carry many engine chunks. Under load that is the point: a busy process
writes fewer, larger events instead of falling behind one event per token. An ``urgent``
event (a segment's ``start``, its first text) is written without waiting for the window.

Writes are sequential: the log holds events in the order they were added. A batch is
handed to ``published`` (the hub, and the generation's own record of what is written)
only after the log accepted it, so no reader ever sees an event the log does not hold.
A failed write is kept as ``error``: nothing more is written (the events after it would
leave a hole), ``failed`` is told at once, and ``drain`` raises it. Its seqs stay taken:
a write that failed once it was sent may be in the log all the same (Redis took it, and
its answer was lost), so whatever comes after it (the segment's ``done``) is numbered
after it; a log that lacks it has a gap there, which its readers are told of. Reusing
them put the ``done`` on a seq the log held as a delta, where the retry of its append
took it for written.

No task runs here: a write is started from a loop callback (the next turn of the loop,
so the events of one turn go out together, or the end of the window) and the log calls
back when it holds the batch, and that call publishes it and starts the next write. A
token is handed over twice on its way to a reader (the log's batch, the reader), where a
task per write would add two task steps and a future per token, the most frequent work
of a busy process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from streaming import events
from streaming.events import Event, Logged
from streaming.streamlog import Appended


class Outbox:
    def __init__(
        self,
        write: Callable[[list[Event], Appended], None],
        published: Callable[[list[Event]], None],
        *,
        first_seq: int,
        window: float,
        failed: Callable[[BaseException], None] | None = None,
    ) -> None:
        """``write(batch, appended)`` starts a batch's append and calls ``appended`` once
        it is over (with the error, if any), never from within ``write`` itself."""
        self._write = write
        self._published = published
        self._failed = failed
        self.window = window
        # The seq of the last event handed to the log: a batch counts from the moment its
        # write starts (the log holds it once ``published`` is called).
        self.seq = first_seq - 1
        self.error: BaseException | None = None
        self._pending: list[Event] = []
        self._urgent = False
        # The batch being written, and the callback that starts the next write (either,
        # never both: a write started while one is in flight would break the order).
        self._writing: list[Event] | None = None
        self._next: asyncio.Handle | None = None
        self._last_write = float("-inf")
        self._drained: list[asyncio.Future[None]] = []

    def add(self, event: Event, *, urgent: bool = False) -> None:
        """Queue ``event`` (its ``seq`` is set when it is written)."""
        if self.error is not None:
            return
        self._pending.append(event)
        if urgent and not self._urgent:
            self._hurry()
        if self._writing is None and self._next is None:
            self._schedule()

    async def drain(self) -> None:
        """Wait until every event added so far is in the log (and published); raise the
        write error if one happened."""
        if self._writing is not None or self._next is not None:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._drained.append(done)
            self._hurry()  # nothing more is coming: no reason to wait out the window
            await done
        if self.error is not None:
            raise self.error

    def _hurry(self) -> None:
        """Cut a window wait short: what is pending goes out in the loop's next turn."""
        self._urgent = True
        if self._next is not None:
            self._next.cancel()
            self._next = None
            self._schedule()

    def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        delay = self._last_write + self.window - loop.time()
        if delay > 0 and not self._urgent:
            self._next = loop.call_later(delay, self._start_write)
        else:
            self._next = loop.call_soon(self._start_write)

    def _start_write(self) -> None:
        self._next = None
        self._urgent = False
        merged = events.merge(self._pending)
        self._pending = []
        batch: list[Event] = []
        for event in merged:
            self.seq += 1
            event["seq"] = self.seq
            batch.append(Logged(event))
        self._last_write = asyncio.get_running_loop().time()
        self._writing = batch
        try:
            self._write(batch, self._written)
        except Exception as exc:  # refused before it started: as if the log had failed it
            self._written(exc)
            self.seq = batch[0]["seq"] - 1  # but it never reached the log

    def _written(self, error: BaseException | None) -> None:
        batch = self._writing
        assert batch is not None
        self._writing = None
        if error is not None:
            self.error = error
            self._pending = []
            self._resolve_drained()
            if self._failed is not None:
                self._failed(error)
            return
        try:
            self._published(batch)
        finally:
            if self._pending:
                self._schedule()
            else:
                self._resolve_drained()

    def _resolve_drained(self) -> None:
        drained, self._drained = self._drained, []
        for done in drained:
            if not done.done():
                done.set_result(None)
