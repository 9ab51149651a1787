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
leave a hole), ``failed`` is told at once, and ``drain`` raises it.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable

from streaming import events
from streaming.events import Event, Logged


class Outbox:
    def __init__(
        self,
        write: Callable[[list[Event]], Awaitable[None]],
        published: Callable[[list[Event]], None],
        *,
        first_seq: int,
        window: float,
        failed: Callable[[BaseException], None] | None = None,
    ) -> None:
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
        self._task: asyncio.Task[None] | None = None
        self._last_write = float("-inf")
        # Resolved to cut a window wait short (an urgent event arrived).
        self._window_wait: asyncio.Future[None] | None = None
        self._drained: list[asyncio.Future[None]] = []

    def add(self, event: Event, *, urgent: bool = False) -> None:
        """Queue ``event`` (its ``seq`` is set when it is written)."""
        if self.error is not None:
            return
        self._pending.append(event)
        if urgent:
            self._urgent = True
            wait = self._window_wait
            if wait is not None and not wait.done():
                wait.set_result(None)
        if self._task is None:
            self._task = asyncio.create_task(
                self._run(), name="outbox", context=contextvars.Context()
            )

    async def drain(self) -> None:
        """Wait until every event added so far is in the log (and published); raise the
        write error if one happened."""
        if self._task is not None:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._drained.append(done)
            self._urgent = True  # nothing more is coming: no reason to wait out the window
            wait = self._window_wait
            if wait is not None and not wait.done():
                wait.set_result(None)
            await done
        if self.error is not None:
            raise self.error

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                delay = self._last_write + self.window - loop.time()
                if delay > 0 and not self._urgent:
                    await self._wait_window(loop, delay)
                self._urgent = False
                merged = events.merge(self._pending)
                self._pending = []
                batch: list[Event] = []
                for event in merged:
                    self.seq += 1
                    event["seq"] = self.seq
                    batch.append(Logged(event))
                self._last_write = loop.time()
                try:
                    await self._write(batch)
                except BaseException as exc:
                    self.seq = batch[0]["seq"] - 1
                    self.error = exc
                    self._pending = []
                    if self._failed is not None:
                        self._failed(exc)
                    if not isinstance(exc, Exception):
                        raise
                    return
                self._published(batch)
        finally:
            self._task = None
            drained, self._drained = self._drained, []
            for done in drained:
                if not done.done():
                    done.set_result(None)

    async def _wait_window(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        wait: asyncio.Future[None] = loop.create_future()
        self._window_wait = wait
        timer = loop.call_later(delay, _resolve, wait)
        try:
            await wait
        finally:
            timer.cancel()
            self._window_wait = None


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
