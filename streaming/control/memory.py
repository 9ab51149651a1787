"""Control within one process: the embedded default. Every process is this one, so a
message goes straight to this process's handler."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from streaming.control.base import Control, Handler

log = logging.getLogger(__name__)


class MemoryControl(Control):
    def __init__(self) -> None:
        self._handler: Handler | None = None
        self._posted: set[asyncio.Task[None]] = set()

    async def start(self, handler: Handler) -> None:
        self._handler = handler

    async def send(self, message_id: str, message: dict[str, Any]) -> None:
        if self._handler is None:
            return
        try:
            await self._handler({**message, "mid": message_id})
        except Exception:
            log.exception("control message failed: %r", message)

    def post(self, message_id: str, message: dict[str, Any]) -> None:
        task = asyncio.create_task(self.send(message_id, message))
        self._posted.add(task)
        task.add_done_callback(self._posted.discard)
