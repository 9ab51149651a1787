"""An HTTP application that fails after its response started ends that response itself.

Daphne answers an application's exception with a 500, which it cannot send once the
response has started: its ``handle_exception`` then raises inside the server's periodic
check of its connections, and that check never runs again in the process. From then on
no finished connection is forgotten (every later request's state is kept: the process
grows without bound), no application timeout is enforced, and later exceptions go
unlogged. So an exception must never reach Daphne after ``http.response.start``: this
middleware logs it and ends the body, which tells the client the response is over
(a chunked stream ends; a reader sees its stream stop without its final event, as after
any dropped connection, and resumes). An exception before the response started goes to
Daphne as before, which answers it with a 500.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

App = Callable[[dict[str, Any], Any, Any], Awaitable[Any]]


class _Watched:
    """The application's ``send``: notes whether the response started and ended. Its
    ``real_send`` is the server's, which the server hooks find behind it as they find it
    behind Channels' wrappers (``daphne.innermost_send``): stream frames go there
    directly, and the per-connection memory bound reads that connection's buffer."""

    __slots__ = ("ended", "real_send", "started")

    def __init__(self, send: Any) -> None:
        self.real_send = send
        self.started = self.ended = False

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        elif message["type"] == "http.response.body" and not message.get("more_body"):
            self.ended = True
        await self.real_send(message)


class EndsStartedResponses:
    def __init__(self, inner: App) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        watched = _Watched(send)
        try:
            return await self.inner(scope, receive, watched.send)
        except Exception:
            if not watched.started:
                raise
            log.exception("%s %s failed after its response started", scope["method"], scope["path"])
            if not watched.ended:
                with contextlib.suppress(Exception):  # the client may be gone too
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
        return None
