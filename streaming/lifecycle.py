"""A serving process's background work and its orderly end.

Daphne implements no ASGI lifespan, so ``Lifecycle.start`` runs on the first request the
process serves (from the ASGI entry point). It starts the loops (heartbeat, write-behind
flush, reaper, the control listener) and installs the SIGTERM handler: stop accepting,
let running generations finish up to ``SHUTDOWN_DEADLINE``, interrupt the rest, give
attached readers ``SHUTDOWN_READER_FLUSH`` to send their last events, let the transports
close their connections (``on_drained``; the ASGI entry point adds the WebSocket
consumers' close with 1001), hand the database threads' connections back, then call
the server's stop hooks (``on_stopped``; the ASGI entry point adds the one for Daphne).
Stopping the server drops whatever is still open, so whatever a client must be told goes
out before.

Once the drain is over the loops stop and the process leaves (its heartbeat key goes), so
another process's reaper may end whatever it left, and nothing at the end waits on a
database that cannot answer: the process stops within seconds whatever the database does.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from streaming import database, metrics
from streaming.conf import streaming_settings
from streaming.control import Control
from streaming.control.base import Handler
from streaming.persistence import Partial, flush_partials
from streaming.presence import Presence
from streaming.reaper import Reaper
from streaming.registry import Generations

# How long interrupted generations get to write their ends at shutdown (their records and
# ``done``s; seconds) before the process stops without them.
INTERRUPT_WAIT = 5.0
# How long the database threads get at the end to finish the calls they were given (a
# flush ending; seconds): past it the process stops without them.
RELEASE_WAIT = 2.0
# How long the heartbeat key's delete may take (seconds): Redis away, the key expires.
LEAVE_WAIT = 1.0

log = logging.getLogger(__name__)


class Lifecycle:
    def __init__(
        self,
        generations: Generations,
        presence: Presence,
        control: Control,
        reaper: Reaper,
        on_control: Handler,
    ) -> None:
        """``on_control``: what control's listener hands every message to."""
        self.generations = generations
        self.on_control = on_control
        self.presence = presence
        self.control = control
        self.reaper = reaper
        self.accepting = True
        # Awaited once the process has drained after SIGTERM and its readers wrote their
        # last events, before the server stops (close the connections left open).
        self.on_drained: list[Callable[[], Awaitable[None]]] = []
        # Called once the process has drained after SIGTERM (stop the server).
        self.on_stopped: list[Callable[[], None]] = []
        self._tasks: set[asyncio.Task[object]] = set()
        # The heartbeat, write-behind and reaper loops, stopped at the drain's end.
        self._loops: list[asyncio.Task[object]] = []

    async def start(self) -> None:
        await self.control.start(self.on_control)
        # Redis down at start-up must not keep the loops from starting (nor fail the
        # request that starts them, such as /readyz): the heartbeat loop retries.
        try:
            await self.presence.beat()
        except Exception:
            log.warning("first heartbeat failed (Redis unreachable?)")
        self._loops = [
            self.spawn(self._heartbeat_loop(), "heartbeat"),
            self.spawn(self._flush_loop(), "write-behind"),
            self.spawn(self._reaper_loop(), "reaper"),
        ]
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._on_sigterm)

    def spawn(self, coro: Coroutine[Any, Any, object], name: str) -> asyncio.Task[object]:
        """Start a background task outside the current request's context (asgiref ties
        sync_to_async calls to the request's thread, which is gone once it answered), and
        hold a reference to it until it ends."""
        task = asyncio.create_task(coro, name=name, context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- the loops -----------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(streaming_settings.HEARTBEAT_INTERVAL)
            try:
                await self.presence.beat()
            except Exception:
                log.warning("heartbeat failed (Redis unreachable?)")

    async def _flush_loop(self) -> None:
        pending: dict[str, Partial] = {}
        while True:
            await asyncio.sleep(streaming_settings.FLUSH_INTERVAL)
            for generation in self.generations:
                partial = generation.partial()
                if partial is not None:
                    pending[partial.message_id] = partial
            if not pending:
                continue
            batch = list(pending.values())
            started = time.monotonic()
            try:
                refused = await database.run(flush_partials, batch)
            except Exception:
                log.warning("write-behind flush failed for %d messages; will retry", len(batch))
                continue
            for partial in refused:
                log.error("the database refused the partial text of %s", partial.message_id)
            given_up = {partial.message_id for partial in refused}
            for partial in batch:
                running = self.generations.get(partial.message_id)
                if running is not None and partial.message_id not in given_up:
                    running.stored(partial)
            metrics.PERSIST_LATENCY.labels(kind="partial").observe(time.monotonic() - started)
            pending.clear()

    async def _reaper_loop(self) -> None:
        while True:
            await asyncio.sleep(streaming_settings.HEARTBEAT_TIMEOUT / 2)
            try:
                await self.reaper.reap()
            except Exception:
                log.exception("reaper pass failed")
            metrics.forget_dead_processes()
            await self._recount_followed()

    async def _recount_followed(self) -> None:
        """This process's answers read only in other processes, counted again: a process
        that dies with readers never says they left (its count stays in Redis, and a
        count leaves out the processes without a heartbeat), so without this such an
        answer went on for nobody, holding the engine and one of its owner's slots."""
        for generation in list(self.generations):
            if not generation.readers_seen or self.presence.local.get(generation.message_id):
                continue
            try:
                await generation.recount_readers()
            except Exception:
                log.warning("could not count the readers of %s again", generation.message_id)

    # --- the end -------------------------------------------------------------------------
    def _on_sigterm(self) -> None:
        if not self.accepting:
            return
        self.accepting = False
        log.info("SIGTERM: draining %d generations", len(self.generations))
        self.spawn(self.drain_and_stop(), "drain")

    async def drain_and_stop(self) -> None:
        await self.drain(streaming_settings.SHUTDOWN_DEADLINE)
        # Let attached readers write the terminal events before connections are dropped.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(streaming_settings.SHUTDOWN_READER_FLUSH):
                await self.presence.idle.wait()
        for close in self.on_drained:
            # A hook that fails must not keep the process from stopping.
            try:
                await close()
            except Exception:
                log.exception("a shutdown hook failed")
        await self.control.stop()
        # The database threads hand their connections back (a flush may still be ending);
        # calls that cannot end (the database away) are not waited for.
        if not await asyncio.to_thread(database.release, RELEASE_WAIT):
            log.warning("stopping with database calls not ended: the database is not answering")
        await asyncio.sleep(0.1)  # one more turn for the transports to flush their buffers
        for stop in self.on_stopped:
            stop()

    async def drain(self, deadline: float) -> None:
        """Let running generations finish up to ``deadline`` s, then interrupt the rest,
        and give them ``INTERRUPT_WAIT`` s to write their ends. One that cannot (its
        record waits on a database that cannot be reached) is left to another process's
        reaper, as a crashed process's answers are (``Generation.leave_to_reaper``).
        Then the process leaves: its loops stop and its heartbeat key goes
        (``_leave``), so that reaper can take the answers over."""
        running = [g.finished.wait() for g in self.generations]
        if running:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline):
                    await asyncio.gather(*running)
        left = list(self.generations)
        for generation in left:
            generation.cancel("interrupted")
        if left:
            try:
                async with asyncio.timeout(INTERRUPT_WAIT):
                    await asyncio.gather(*(g.finished.wait() for g in left))
            except TimeoutError:
                unended = list(self.generations)
                log.warning(
                    "stopping with answers not ended (%d): a reaper ends them", len(unended)
                )
                for generation in unended:
                    generation.leave_to_reaper()
        await self._leave()

    async def _leave(self) -> None:
        """Stop the loops, then delete the heartbeat key. A beat after the delete put the
        key back: the process stayed alive for every other process's reaper for as long
        as its stop took (the database away, until it was back), and its answers were
        not taken over. Nor does this process reap or write behind any more: their
        calls would only wait on the database at its end. Redis away, the delete fails
        and the key expires (``HEARTBEAT_TIMEOUT``) since nothing renews it."""
        loops, self._loops = self._loops, []
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        try:
            async with asyncio.timeout(LEAVE_WAIT):
                await self.presence.leave()
        except Exception:
            log.warning("could not delete the heartbeat key (Redis unreachable?): it expires")
