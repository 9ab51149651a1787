"""HTTP streams that end when the credentials they were opened with do.

A Server-Sent Events response (``GET .../stream/``, a one-step post's answer, a ``/v1``
stream) is authenticated when it opens and may run for minutes. When a user's
credentials are revoked (a token deleted or replaced, a logout, a deactivation:
``Runtime.on_revoked``), each such stream of theirs in this process resolves its own
credentials again, as the WebSockets do (``ws.Sockets.revoked``), and one they no longer
authenticate is ended: the caller finishes its response without the answer's ``done``,
and the client's reconnect is refused 401.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any

from streaming.auth import authenticate

log = logging.getLogger(__name__)


def start_check(checks: set[asyncio.Task[Any]], coroutine: Coroutine[Any, Any, Any]) -> None:
    """Run a credential check as a task held in ``checks`` until it ends (the loop keeps
    only a weak reference to a task: one nobody holds may be collected mid-way)."""
    task = asyncio.create_task(coroutine)
    checks.add(task)
    task.add_done_callback(checks.discard)


@dataclass(eq=False, slots=True)
class _Held:
    scope: dict[str, Any]
    # Whose stream it is; None when the caller could not tell cheaply (checked on every
    # revocation, which are rare).
    user_id: int | None
    task: asyncio.Task[Any]
    ended: bool = False


class OpenStreams:
    """This process's open HTTP streams, by the scope they were authenticated with."""

    def __init__(self) -> None:
        self.held: set[_Held] = set()
        # Credential checks under way, held until they end.
        self.checks: set[asyncio.Task[Any]] = set()

    async def run(
        self, scope: dict[str, Any], user_id: int | None, stream: Awaitable[None]
    ) -> bool:
        """Await ``stream`` in this task; True when it ran to its end, False when a
        revocation ended it (the caller then finishes its response). Any other
        cancellation (the client left) goes on as it came."""
        task = asyncio.current_task()
        assert task is not None
        held = _Held(scope, user_id, task)
        self.held.add(held)
        try:
            await stream
        except asyncio.CancelledError:
            if not held.ended:
                raise
            task.uncancel()
            return False
        finally:
            self.held.discard(held)
        return True

    def revoked(self, user_id: int) -> None:
        """``Runtime.on_revoked``: the user's streams check their credentials again."""
        for held in list(self.held):
            if held.user_id is None or held.user_id == user_id:
                start_check(self.checks, self._check(held))

    async def _check(self, held: _Held) -> None:
        try:
            user = await authenticate(held.scope)
        except Exception:
            log.exception("could not check a stream's credentials")
            return
        if user.is_authenticated and held.user_id in (None, user.pk):
            return
        if held in self.held and not held.ended:
            log.info("ending a stream whose credentials were revoked")
            held.ended = True
            held.task.cancel()


streams = OpenStreams()
