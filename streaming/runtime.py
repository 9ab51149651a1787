"""The composition root: the parts of one serving process, built once and wired together.

``Runtime`` builds the stream log, the hub, the engines, control, the registry of
generations, presence, the reaper and the lifecycle from ``STREAMING`` and injects each
into the parts that need it; no part below holds the root. The services and selectors
reach the parts through ``get_runtime()``, the one accessor. The runtime belongs to the
event loop that started it (``ensure_started``, from the ASGI entry point); request
threads reach that loop through ``launch_threadsafe`` and ``call``. A process that serves
nothing (a management command, the shell, the admin driven in-process) has no such loop:
its runtime runs on a private loop thread, without the background work.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from streaming import tokens
from streaming.conf import streaming_settings
from streaming.control import build_control
from streaming.engines import build_engines
from streaming.engines.catalog import Catalog
from streaming.feed import Feed
from streaming.generation import Backends, Generation, SegmentPlan
from streaming.hub import Hub
from streaming.lifecycle import Lifecycle
from streaming.presence import build_presence
from streaming.reading import MessageState, SendBuffer, Subscription, wait_until_ended
from streaming.reaper import Reaper
from streaming.registry import Generations
from streaming.streamlog import build_streamlog
from streaming.worker import WORKER_ID

T = TypeVar("T")
log = logging.getLogger(__name__)


class Runtime:
    def __init__(self) -> None:
        self.worker_id = WORKER_ID
        self.log = build_streamlog()
        self.hub = Hub(self.log, streaming_settings.HUB_MAX_EVENTS)
        self.engines = build_engines()
        self.engine = self.engines["default"]
        self.catalog = Catalog(self.engines)
        self.control = build_control()
        self.generations = Generations(self.control)
        self.feed = Feed(self.control)
        self.presence = build_presence(self.worker_id, self.generations)
        self.backends = Backends(self.log, self.hub, self.presence, self.engine, self.catalog)
        self.reaper = Reaper(self.log, self.hub, self.presence)
        self.lifecycle = Lifecycle(
            self.generations, self.presence, self.control, self.reaper, self._on_control
        )
        # Told the id of a user whose tokens were revoked, in every process, after this
        # process's cache forgot them (the WebSocket consumers check their sockets).
        self.on_revoked: list[Callable[[int], None]] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        # True once the loop is a private one: this process serves nothing (see below).
        self._private = False
        self._started: asyncio.Future[None] | None = None
        self._binding = threading.Lock()

    async def _on_control(self, message: dict[str, Any]) -> None:
        if message.get("type") == tokens.REVOKED:
            if isinstance(message.get("user"), int):
                tokens.cache().forget_user(message["user"])
                for revoked in self.on_revoked:
                    revoked(message["user"])
        elif not self.feed.handles(message):
            await self.generations.on_control(message)

    async def ensure_started(self) -> None:
        """Bind to the running loop and start the background work, once."""
        loop = asyncio.get_running_loop()
        with self._binding:
            if self.loop is None:
                self.loop = loop
        if self.loop is not loop:
            raise RuntimeError("the streaming runtime belongs to another event loop")
        if self._started is None:
            self._started = loop.create_future()
            try:
                await self.lifecycle.start()
            except BaseException as exc:
                self._started.set_exception(exc)
                self._started = None
                raise
            self._started.set_result(None)
        elif not self._started.done():
            await asyncio.shield(self._started)

    @property
    def accepting(self) -> bool:
        """False once the process drains after SIGTERM: no new answers start here."""
        return self.lifecycle.accepting

    def _loop(self) -> asyncio.AbstractEventLoop:
        with self._binding:
            if self.loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="runtime", daemon=True).start()
                self.loop = loop
                self._private = True
            return self.loop

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop()
        except RuntimeError:
            return False

    def launch_threadsafe(self, plan: SegmentPlan) -> Generation:
        """Start a generation on this runtime's loop from any thread, the loop's included
        (a database thread or a request thread after it wrote the segment's rows).

        From another thread the start is queued, not waited for: the calling thread (a
        database thread, which others queue behind) goes on at once. A callback queued
        now runs before any the loop is handed later, so by the time the caller's answer
        reaches the loop (the result of ``database.run``, a response) the generation is
        registered and running."""
        if self._on_loop():
            return self.generations.launch(plan, self.backends)
        generation = self.generations.prepare(plan, self.backends)
        self._loop().call_soon_threadsafe(self.generations.start, generation)
        return generation

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this runtime's loop from a thread that is not the loop's, and
        wait for its result (a request thread stopping answers, say)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop()).result()

    def notify(self, user_id: int, events: list[dict[str, Any]]) -> None:
        """Publish feed events from any thread (a request thread, after its transaction
        committed), in one message; a failure is logged, never the caller's."""
        self._post(f"user:{user_id}", self.feed.message(user_id, events))

    def revoke_tokens(self, user_id: int) -> None:
        """Tell every process (this one's included) to drop ``user_id``'s cached tokens,
        from any thread."""
        self._post(f"user:{user_id}", {"type": tokens.REVOKED, "user": user_id})

    def _post(self, key: str, message: dict[str, Any]) -> None:
        """A control message from any thread. A serving process's loop outlives the
        caller, so the message is queued and the caller goes on. A process that serves
        nothing (``manage.py drf_create_token -r``, the shell) may exit as soon as the
        caller returns, taking its private loop with it: there the message is sent before
        returning, or a revocation made there would never reach the servers."""
        loop = self._loop()
        if not self._private:
            loop.call_soon_threadsafe(self.control.post, key, message)
            return
        try:
            asyncio.run_coroutine_threadsafe(self.control.send(key, message), loop).result()
        except Exception as exc:
            log.warning("control message not sent: %s", exc)

    def subscription(
        self,
        state: MessageState,
        after: int,
        transport: str,
        send_buffer: SendBuffer | None = None,
    ) -> Subscription:
        return Subscription(self.hub, self.log, self.presence, state, after, transport, send_buffer)

    async def wait_until_ended(
        self, message_id: str, limit: float | None = None, segment: int | None = None
    ) -> None:
        """``reading.wait_until_ended``, on the local generation when it runs here (and is
        of ``segment``), else on the log."""
        generation = self.generations.get(message_id)
        if generation is not None and segment not in (None, generation.plan.segment_index):
            generation = None  # another segment's: the log tells when ``segment`` ended
        finished = generation.finished if generation is not None else None
        await wait_until_ended(self.hub, message_id, limit, finished, segment)

    async def cancel(self, message_id: str, reason: str, segment: int | None = None) -> None:
        await self.generations.cancel(message_id, reason, segment)

    async def close(self) -> None:
        """Release the backends' connections (a command that used the runtime once)."""
        await self.log.close()
        await self.presence.close()
        await self.control.stop()


_runtime: Runtime | None = None
_building = threading.Lock()


def get_runtime() -> Runtime:
    """This process's runtime, from any thread; built on first use."""
    global _runtime
    if _runtime is None:
        with _building:
            if _runtime is None:
                _runtime = Runtime()
    return _runtime
