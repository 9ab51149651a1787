"""Per-process runtime: the stream log, local fan-out, engine, running generations and the
background loops (heartbeat, write-behind flush, reaper, control listener).

Daphne implements no ASGI lifespan, so the loops start on the first request this process
serves (``ensure_started``), from the ASGI entry point. Everything here belongs to the
running event loop; a new loop (tests) gets a new runtime.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import logging
import signal
import time
from collections.abc import Coroutine
from typing import Any

from django.conf import settings

from streaming import database, metrics
from streaming.control import Control
from streaming.engines import build_engine
from streaming.engines.base import Engine
from streaming.generation import Generation, SegmentPlan, launch
from streaming.hub import Hub
from streaming.persistence import flush_partials
from streaming.presence import Presence
from streaming.streamlog import StreamLog, build_streamlog
from streaming.worker import WORKER_ID, heartbeat_ttl_ms, worker_key

log = logging.getLogger(__name__)

# On shutdown, how long readers get to send their terminal events after generations ended.
READER_FLUSH_SECONDS = 3.0


class Runtime:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.worker_id = WORKER_ID
        self.log: StreamLog = build_streamlog()
        self.redis = getattr(self.log, "client", None)
        self.hub = Hub(self.log)
        self.engine: Engine = build_engine()
        self.generations: dict[str, Generation] = {}
        self.presence = Presence(self, self.redis)
        self.control = Control(self)
        self.accepting = True
        # Workers the reaper has found without a heartbeat, and since when (monotonic).
        self.missing_workers: dict[str, float] = {}
        self._tasks: set[asyncio.Task[object]] = set()
        self._started: asyncio.Future[None] | None = None

    # --- lifecycle ------------------------------------------------------------------
    async def ensure_started(self) -> None:
        if self._started is None:
            self._started = self.loop.create_future()
            try:
                await self._start()
            except BaseException as exc:
                self._started.set_exception(exc)
                self._started = None
                raise
            self._started.set_result(None)
        elif not self._started.done():
            await asyncio.shield(self._started)

    async def _start(self) -> None:
        await self.control.start()
        if self.redis is not None:
            # Redis down at start-up must not keep the loops from starting (nor fail the
            # request that starts them, such as /readyz): the heartbeat loop retries.
            try:
                await self._beat()
            except Exception:
                log.warning("first heartbeat failed (Redis unreachable?)")
        self.spawn(self._heartbeat_loop(), "heartbeat")
        self.spawn(self._flush_loop(), "write-behind")
        self.spawn(self._reaper_loop(), "reaper")
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            self.loop.add_signal_handler(signal.SIGTERM, self._on_sigterm)

    def spawn(self, coro: Coroutine[Any, Any, object], name: str) -> asyncio.Task[object]:
        """Start a background task outside the current request's context: asgiref ties
        sync_to_async calls to the request's thread, which is gone once it answered."""
        task = asyncio.create_task(coro, name=name, context=contextvars.Context())
        self.keep(task)
        return task

    def keep(self, task: asyncio.Task[object]) -> None:
        """Hold a reference to a fire-and-forget task until it ends."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- generations -----------------------------------------------------------------
    def launch_threadsafe(self, plan: SegmentPlan) -> Generation:
        """Start a generation on this runtime's loop from any thread, the loop's included
        (a database thread or a request thread after it wrote the segment's rows)."""
        if _on_loop(self.loop):
            return launch(plan, self)
        started: concurrent.futures.Future[Generation] = concurrent.futures.Future()

        def start() -> None:
            try:
                started.set_result(launch(plan, self))
            except BaseException as exc:
                started.set_exception(exc)

        self.loop.call_soon_threadsafe(start)
        return started.result()

    def generation_started(self, generation: Generation) -> None:
        self.generations[generation.message_id] = generation

    def generation_ended(self, generation: Generation) -> None:
        if self.generations.get(generation.message_id) is generation:
            del self.generations[generation.message_id]
        self.hub.close_local(generation.message_id)

    def cancel_local(self, generation: Generation, reason: str) -> bool:
        cancelled = generation.cancel(reason)
        if cancelled and reason == "cancelled":
            metrics.CANCELS.inc()
        elif cancelled and reason == "abandoned":
            metrics.ABANDONS.inc()
        return cancelled

    async def cancel(self, message_id: str, reason: str = "cancelled") -> None:
        """End a generation wherever it runs (this process or another)."""
        generation = self.generations.get(message_id)
        if generation is not None:
            self.cancel_local(generation, reason)
        else:
            await self.control.send(message_id, {"type": "generation.cancel", "reason": reason})

    # --- background loops ------------------------------------------------------------
    async def _beat(self) -> None:
        assert self.redis is not None
        await self.redis.set(worker_key(self.worker_id), "1", px=heartbeat_ttl_ms())

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(settings.STREAM_HEARTBEAT_INTERVAL)
            try:
                if self.redis is not None:
                    await self._beat()
                # Membership of the control group expires, and a Redis restart loses it.
                await self.control.renew()
            except Exception:
                log.warning("heartbeat failed (Redis unreachable?)")

    async def _flush_loop(self) -> None:
        pending: dict[str, object] = {}
        while True:
            await asyncio.sleep(settings.STREAM_FLUSH_INTERVAL)
            for generation in list(self.generations.values()):
                partial = generation.partial()
                if partial is not None:
                    pending[partial.message_id] = partial
            if not pending:
                continue
            batch = list(pending.values())
            started = time.monotonic()
            try:
                await database.run(flush_partials, batch)
            except Exception:
                log.warning("write-behind flush failed for %d messages; will retry", len(batch))
                continue
            metrics.PERSIST_LATENCY.labels(kind="partial").observe(time.monotonic() - started)
            pending.clear()

    async def _reaper_loop(self) -> None:
        from streaming.reaper import reap

        while True:
            await asyncio.sleep(settings.STREAM_HEARTBEAT_TIMEOUT / 2)
            try:
                await reap(self)
            except Exception:
                log.exception("reaper pass failed")
            metrics.forget_dead_processes()

    # --- shutdown --------------------------------------------------------------------
    def _on_sigterm(self) -> None:
        if not self.accepting:
            return
        self.accepting = False
        log.info("SIGTERM: draining %d generations", len(self.generations))
        self.spawn(self.drain_and_stop(), "drain")

    async def drain_and_stop(self) -> None:
        await self.drain(settings.STREAM_SHUTDOWN_DEADLINE)
        # Let attached readers write the terminal events before connections are dropped.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(READER_FLUSH_SECONDS):
                await self.presence.idle.wait()
        await self.control.stop()
        await asyncio.sleep(0.1)  # one more turn for the transports to flush their buffers
        _stop_reactor()

    async def drain(self, deadline: float) -> None:
        """Let running generations finish up to ``deadline`` s, then interrupt the rest."""
        running = [g.finished.wait() for g in self.generations.values()]
        if running:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline):
                    await asyncio.gather(*running)
        left = list(self.generations.values())
        for generation in left:
            generation.cancel("interrupted")
        if left:
            await asyncio.gather(*(g.finished.wait() for g in left))
        if self.redis is not None:
            with contextlib.suppress(Exception):
                await self.redis.delete(worker_key(self.worker_id))


def _stop_reactor() -> None:
    try:
        from twisted.internet import reactor
    except ImportError:  # not under Daphne
        return
    if reactor.running:
        reactor.callFromThread(reactor.stop)


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


_runtime: Runtime | None = None


def current_runtime() -> Runtime:
    """The runtime of this process's server loop, from any thread (a REST request's):
    the ASGI entry point starts it before the first request is handled."""
    if _runtime is None:
        raise RuntimeError("the streaming runtime has not started (no request served yet)")
    return _runtime


def get_runtime() -> Runtime:
    global _runtime
    loop = asyncio.get_running_loop()
    if _runtime is None or _runtime.loop is not loop:
        _runtime = Runtime(loop)
    return _runtime
