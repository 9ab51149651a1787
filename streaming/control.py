"""Control messages between processes over the Channels layer: cancel, readers changed.

Only control traffic goes through the channel layer (it may drop messages when full and
costs a DB-thread hop per consumer dispatch, so tokens never do). Each process owns one
channel; a generation joins the group ``gen.<message hex>`` while it runs, so a Stop sent
from any process reaches the one that runs the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import TYPE_CHECKING, Any

from channels.layers import get_channel_layer

if TYPE_CHECKING:
    from streaming.runtime import Runtime

log = logging.getLogger(__name__)


def group_name(message_id: str) -> str:
    return f"gen.{uuid.UUID(message_id).hex}"


class Control:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.layer = get_channel_layer()
        self.channel: str | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.layer is None:
            return
        self.channel = await self.layer.new_channel("worker.")
        self._task = self.runtime.spawn(self._listen(), "control-listener")

    async def join(self, message_id: str) -> None:
        if self.layer is not None and self.channel is not None:
            await self.layer.group_add(group_name(message_id), self.channel)

    async def leave(self, message_id: str) -> None:
        if self.layer is not None and self.channel is not None:
            with contextlib.suppress(Exception):
                await self.layer.group_discard(group_name(message_id), self.channel)

    async def send(self, message_id: str, message: dict[str, Any]) -> None:
        if self.layer is not None:
            await self.layer.group_send(group_name(message_id), {**message, "mid": message_id})

    async def _listen(self) -> None:
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
                await self._dispatch(message)
            except Exception:
                log.exception("control message failed: %r", message)

    async def _dispatch(self, message: dict[str, Any]) -> None:
        generation = self.runtime.generations.get(message.get("mid", ""))
        if generation is None:
            return
        kind = message.get("type")
        if kind == "generation.cancel":
            self.runtime.cancel_local(generation, message.get("reason", "cancelled"))
        elif kind == "generation.readers":
            generation.readers_changed(await self.runtime.presence.count(generation.message_id))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
