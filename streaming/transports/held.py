"""HTTP streams that end when the credentials they were opened with do.

A Server-Sent Events response (``GET .../stream/``, a one-step post's answer, a ``/v1``
stream) is authenticated when it opens and may run for minutes. When a user's
credentials are revoked (a token deleted or replaced, a logout, a deactivation:
``Runtime.on_revoked``), each such stream of theirs in this process resolves its own
credentials again, as the WebSockets do (``ws.Sockets.revoked``), and one they no longer
authenticate is ended: the caller finishes its response without the answer's ``done``,
and the client's reconnect is refused 401. A session also ends by age, which nothing
announces: a stream opened with one checks it again within every ``SESSION_RECHECK``
seconds, as a WebSocket does.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any

from streaming.auth import authenticate, by_session
from streaming.conf import streaming_settings

log = logging.getLogger(__name__)


def start_check(checks: set[asyncio.Task[Any]], coroutine: Coroutine[Any, Any, Any]) -> None:
    """Run a credential check as a task held in ``checks`` until it ends (the loop keeps
    only a weak reference to a task: one nobody holds may be collected mid-way)."""
    task = asyncio.create_task(coroutine)
    checks.add(task)
    task.add_done_callback(checks.discard)


def session_recheck_delay() -> float | None:
    """When a stream or socket opened with a session checks it again: within
    ``SESSION_RECHECK`` seconds, in the second half of the interval so that ones opened
    together do not check together; None when sessions are not checked again."""
    interval = streaming_settings.SESSION_RECHECK
    return interval * (0.5 + random.random() / 2) if interval > 0 else None


@dataclass(eq=False, slots=True)
class _Held:
    scope: dict[str, Any]
    # Whose stream it is: only their revocations check it.
    user_id: int
    task: asyncio.Task[Any]
    ended: bool = False
    # The next check of a session's stream.
    recheck: asyncio.TimerHandle | None = None


class OpenStreams:
    """This process's open HTTP streams, by the scope they were authenticated with."""

    def __init__(self) -> None:
        self.held: set[_Held] = set()
        # Credential checks under way, held until they end.
        self.checks: set[asyncio.Task[Any]] = set()

    async def run(self, scope: dict[str, Any], user_id: int, stream: Awaitable[None]) -> bool:
        """Await ``stream`` in this task; True when it ran to its end, False when a
        revocation ended it (the caller then finishes its response). Any other
        cancellation (the client left) goes on as it came. ``scope`` must hold the
        credentials the stream was opened with (its session too, when it was opened with
        one): a check that resolves no user from them ends it."""
        task = asyncio.current_task()
        assert task is not None
        held = _Held(scope, user_id, task)
        self.held.add(held)
        if by_session(scope):
            self._arm(held)
        try:
            await stream
        except asyncio.CancelledError:
            if not held.ended:
                raise
            task.uncancel()
            return False
        finally:
            self.held.discard(held)
            if held.recheck is not None:
                held.recheck.cancel()
        return True

    def revoked(self, user_id: int) -> None:
        """``Runtime.on_revoked``: the user's streams check their credentials again."""
        for held in list(self.held):
            if held.user_id == user_id:
                start_check(self.checks, self._check(held))

    def _arm(self, held: _Held) -> None:
        delay = session_recheck_delay()
        if delay is not None:
            held.recheck = asyncio.get_running_loop().call_later(delay, self._recheck, held)

    def _recheck(self, held: _Held) -> None:
        held.recheck = None
        start_check(self.checks, self._check(held, again=True))

    async def _check(self, held: _Held, *, again: bool = False) -> None:
        """End ``held`` if its credentials no longer authenticate its user; ``again``:
        a session's periodic check, armed anew while the stream runs."""
        try:
            user = await authenticate(held.scope)
            valid = user.is_authenticated and user.pk == held.user_id
        except Exception:
            # Not known now: the next revocation or the next periodic check asks again.
            log.exception("could not check a stream's credentials")
            valid = True
        if valid:
            if again and held in self.held and not held.ended:
                self._arm(held)
            return
        if held in self.held and not held.ended:
            log.info("ending a stream whose credentials were revoked")
            held.ended = True
            held.task.cancel()


streams = OpenStreams()
