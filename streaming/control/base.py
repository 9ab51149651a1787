"""The control contract: a message names its message id and reaches every process.

A message goes to every serving process (the sender's included), and the one that runs
that generation acts on it; the others ignore it. Delivery is at most once and only to
the processes listening at that moment: callers that need the effect wait for it (a
Stop waits for the answer's end) and the reaper covers a process that died. Control
messages are rare (a Stop, the last reader of a process leaving), never per token.

``Control`` is only the wire: what a message means is its handler's business (the
registry of generations, ``streaming.registry``).
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from typing import Any

Handler = Callable[[dict[str, Any]], Awaitable[None]]


class Control(abc.ABC):
    @abc.abstractmethod
    async def start(self, handler: Handler) -> None:
        """Listen, handing every message received to ``handler`` (errors are logged)."""

    @abc.abstractmethod
    async def send(self, message_id: str, message: dict[str, Any]) -> None:
        """Send ``message`` (a JSON-able dict) about ``message_id`` to every process."""

    @abc.abstractmethod
    def post(self, message_id: str, message: dict[str, Any]) -> None:
        """``send`` without waiting for it, from the loop's thread; a failure is logged,
        never the caller's. Messages posted and sent from one process leave in the order
        they were given."""

    async def stop(self) -> None:
        """Stop listening and release connections."""
