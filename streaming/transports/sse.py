"""Server-Sent Events: ``GET /api/messages/<id>/stream/``.

Contract: the response streams ``id``/``event``/``data`` frames of the shared event schema,
``: ping`` comments while nothing else is sent, and ends after the terminal ``done``.
Resume with ``Last-Event-ID`` (EventSource does it itself) or ``?after=N``. A reader that
has already seen the end gets ``204`` (which also stops EventSource from reconnecting).

Channels serialises a consumer's handlers, so the stream runs in its own task and the
``http.disconnect`` handler cancels it the moment the client goes away.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from channels.exceptions import StopConsumer
from django.conf import settings

from streaming import events
from streaming.auth import header
from streaming.errors import error_bytes
from streaming.logcontext import stream_context
from streaming.runtime import get_runtime
from streaming.selectors import reader_state
from streaming.transports.flow import SendBuffer, innermost_send
from streaming.transports.subscription import SlowConsumer, Subscription, has_more
from streaming.transports.tasked import TaskedHttpConsumer

log = logging.getLogger(__name__)

STREAM_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache, no-store, no-transform"),
    (b"x-accel-buffering", b"no"),
    (b"content-encoding", b"identity"),
    (b"vary", b"Authorization, Cookie"),
]


class CursorError(ValueError):
    pass


def parse_cursor(scope: dict[str, Any]) -> int:
    """``Last-Event-ID`` wins over ``?after=``; both must be non-negative integers."""
    raw = header(scope, b"last-event-id")
    name = "Last-Event-ID"
    if raw is None or raw.strip() == "":
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        values = query.get("after")
        if not values:
            return 0
        raw, name = values[-1], "after"
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise CursorError(f"{name} must be a non-negative integer event id")
    return int(raw)


class MessageStreamConsumer(TaskedHttpConsumer):
    # No per-connection channel: control traffic goes through the runtime's one channel
    # (streaming.control). A channel per connection costs a layer receive per consumer and,
    # with Redis, ends every open stream when Redis is slow or restarting. An alias that is
    # not configured is how Channels is told "no layer" (get_channel_layer returns None).
    channel_layer_alias = "streams-use-no-channel-layer"

    async def http_request(self, message: dict[str, Any]) -> None:
        """Start the stream and return, so ``http.disconnect`` can still be received."""
        if "body" in message:
            self.body.append(message["body"])
        if message.get("more_body"):
            return
        if not await self.open_stream():
            raise StopConsumer()

    async def open_stream(self) -> bool:
        """Answer errors at once; start the stream task. False when the response is done."""
        scope = self.scope
        if scope["method"] != "GET":
            await self.error(405, "method_not_allowed", "use GET", [(b"allow", b"GET")])
            return False
        user, state = await reader_state(scope, scope["url_route"]["kwargs"]["message_id"])
        if not user.is_authenticated:
            await self.error(
                401, "not_authenticated", "authentication credentials were not provided"
            )
            return False
        try:
            after = parse_cursor(scope)
        except CursorError as exc:
            await self.error(400, "invalid_cursor", str(exc))
            return False
        if state is None:
            await self.error(404, "not_found", "message not found")
            return False
        if not has_more(state, after):
            await self.send_response(204, b"")
            return False
        runtime = get_runtime()
        await runtime.ensure_started()
        await self.send_headers(status=200, headers=STREAM_HEADERS)
        await self.send_body(events.sse_retry(settings.STREAM_RETRY_MS), more_body=True)
        subscription = Subscription(runtime, state, after, "sse", SendBuffer(self.base_send))
        self.respond_in_task(
            self.run(subscription, innermost_send(self.base_send) or self.base_send)
        )
        return True

    async def run(self, subscription: Subscription, send: Callable[..., Awaitable[None]]) -> None:
        """``send`` is the server's own (``innermost_send``): frames skip the wrappers."""
        with stream_context(subscription.state.id):
            try:
                async for batch in subscription.frames(settings.STREAM_PING_INTERVAL):
                    body = events.SSE_PING if batch is None else events.sse_frames(batch)
                    await send({"type": "http.response.body", "body": body, "more_body": True})
            except SlowConsumer as exc:
                log.info("closing a slow SSE client: %s", exc)
            except Exception:
                log.exception("SSE stream failed")
            await self.send_body(b"", more_body=False)

    async def error(
        self, status: int, code: str, message: str, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        body = error_bytes(status, code, message)
        headers = [(b"content-type", b"application/json")] + (extra or [])
        await self.send_response(status, body, headers=headers)
