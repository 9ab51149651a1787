"""HTTP consumers whose response is produced by a task.

Channels serialises a consumer's handlers: a response produced inside ``http_request``
would keep ``http.disconnect`` from being received until it ended. The streaming
consumers (SSE, the OpenAI-compatible endpoint) start their response in a task and
return, and the disconnect handler cancels it the moment the client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from streaming.transports.dispatch import LoopHttpConsumer


class TaskedHttpConsumer(LoopHttpConsumer):
    task: asyncio.Task[None] | None = None

    def respond_in_task(self, response: Coroutine[Any, Any, None]) -> None:
        self.task = asyncio.create_task(response)

    async def disconnect(self) -> None:
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
