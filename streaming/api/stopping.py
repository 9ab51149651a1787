"""Ending generations on behalf of an operation: deleting a conversation, the admin's Stop.

The generation may run in any process: ``Runtime.cancel`` ends a local one directly and
sends the others a cancel over the channel layer; waiting follows the message's log (or
the local generation) until its ``done``. Logs are dropped only after the generations
ended, so no late append recreates a deleted log.
"""

from __future__ import annotations

import asyncio
import contextlib

from streaming.runtime import get_runtime
from streaming.services import wait_until_ended
from streaming.termination import Status


async def stop_generations(
    message_ids: list[str], *, reason: str = Status.CANCELLED.value, wait: float = 5.0
) -> None:
    """Cancel each message's generation wherever it runs; wait up to ``wait`` s for the ends."""
    runtime = get_runtime()
    for message_id in message_ids:
        await runtime.cancel(message_id, reason)
    if wait > 0 and message_ids:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await asyncio.gather(*(wait_until_ended(m, wait) for m in message_ids))


async def drop_logs(message_ids: list[str]) -> None:
    runtime = get_runtime()
    for message_id in message_ids:
        await runtime.log.delete(message_id)
