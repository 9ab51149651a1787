"""Control messages between processes over the Channels layer: cancel, readers changed.

Only control traffic goes through the channel layer (it may drop messages when full and
costs a DB-thread hop per consumer dispatch, so tokens never do). Each process owns one
channel in the group of all processes; a control message names its message and goes to
every process, and the one that runs that generation acts on it. Control messages are
rare (a Stop, the last reader of a process leaving), so this costs less than joining and
leaving a group per generation, which was two Redis calls on every answer's path.

``Control`` is only the wire: what a message means is its handler's business (the
registry of generations, ``streaming.registry``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

GROUP = "streaming.workers"

Handler = Callable[[dict[str, Any]], Awaitable[None]]


class Control:
    def __init__(self) -> None:
        self.layer = get_channel_layer()
        self.channel: str | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, handler: Handler) -> None:
        """Join the group and hand every message received to ``handler``."""
        if self.layer is None:
            return
        self.channel = await self.layer.new_channel("worker.")
        self._task = asyncio.create_task(
            self._listen(handler), name="control-listener", context=contextvars.Context()
        )
        try:
            await self.renew()
        except Exception:
            log.warning("joining the control group failed (Redis unreachable?); will retry")

    async def renew(self) -> None:
        """(Re)join the group of all processes: membership expires after the layer's
        ``group_expiry``, and a Redis restart loses it, so the heartbeat renews it."""
        if self.layer is not None and self.channel is not None:
            await self.layer.group_add(GROUP, self.channel)

    async def send(self, message_id: str, message: dict[str, Any]) -> None:
        if self.layer is not None:
            await self.layer.group_send(GROUP, {**message, "mid": message_id})

    async def _listen(self, handler: Handler) -> None:
        assert self.layer is not None and self.channel is not None
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("control channel receive failed; retrying")
                await asyncio.sleep(1.0)
                continue
            try:
                await handler(message)
            except Exception:
                log.exception("control message failed: %r", message)

    async def stop(self) -> None:
        if self.layer is not None and self.channel is not None:
            with contextlib.suppress(Exception):
                await self.layer.group_discard(GROUP, self.channel)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
