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
from django.db import DatabaseError

from streaming import selectors
from streaming.auth import header, refusal
from streaming.conf import streaming_settings
from streaming.errors import AUTHENTICATE, ServiceError, error_bytes
from streaming.logcontext import stream_context
from streaming.reading import PADDING, SlowConsumer, Subscription, has_more, parse_cursor
from streaming.transports import eventstream
from streaming.transports.daphne import SendBuffer, frame_send
from streaming.transports.held import streams
from streaming.transports.hosts import REFUSED, allowed_host
from streaming.transports.tasked import TaskedHttpConsumer

log = logging.getLogger(__name__)

STREAM_HEADERS = [*eventstream.HEADERS, (b"vary", b"Authorization, Cookie")]


def cursor_of(scope: dict[str, Any]) -> int:
    """``Last-Event-ID`` wins over ``?after=``; an empty header falls back to the query.
    Each names one cursor: a header sent twice is its values joined (``header``), and so
    is a parameter given twice, which no cursor reads as; an empty ``after=`` is none
    either. Both were taken for something else: the last ``after`` (a bad one before it
    unheard) and, empty, the start of the answer."""
    raw = header(scope, b"last-event-id")
    if raw is not None and raw.strip(PADDING):
        return parse_cursor(raw, "Last-Event-ID", text=True)
    query = scope.get("query_string", b"").decode("latin-1")
    values = parse_qs(query, keep_blank_values=True).get("after")
    return parse_cursor(",".join(values), "after", text=True) if values else 0


class MessageStreamConsumer(TaskedHttpConsumer):
    got_body = False

    async def http_request(self, message: dict[str, Any]) -> None:
        """Start the stream and return, so ``http.disconnect`` can still be received.

        A stream takes no request body: one is refused (after authentication, as the REST
        API checks bodies) and never kept: its chunks are dropped as they arrive."""
        if message.get("body"):
            self.got_body = True
        if message.get("more_body"):
            return
        if not await self.open_stream():
            raise StopConsumer()

    async def open_stream(self) -> bool:
        """Answer errors at once; start the stream task. False when the response is done."""
        scope = self.scope
        if allowed_host(scope) is None:
            await self.error(400, "invalid", REFUSED)
            return False
        if scope["method"] != "GET":
            await self.error(405, "method_not_allowed", "use GET", [(b"allow", b"GET")])
            return False
        try:
            user, state = await selectors.reader_state(
                scope, scope["url_route"]["kwargs"]["message_id"]
            )
        except DatabaseError:
            log.warning("could not look up a stream: the database is unavailable")
            retry = [(b"retry-after", b"2")]
            await self.error(503, "unavailable", "the database is unavailable; retry", retry)
            return False
        if not user.is_authenticated:
            challenge = [(b"www-authenticate", AUTHENTICATE.encode())]
            await self.error(401, "not_authenticated", refusal(scope, user), challenge)
            return False
        if self.got_body or header(scope, b"content-length") not in (None, "0"):
            await self.error(400, "invalid_body", "a stream takes no request body", field="body")
            return False
        try:
            after = cursor_of(scope)
        except ServiceError as exc:
            await self.error(exc.status, exc.code, exc.message, field=exc.field)
            return False
        if state is None:
            await self.error(404, "not_found", "message not found")
            return False
        if not has_more(state, after):
            await self.send_response(204, b"")
            return False
        await self.send_headers(status=200, headers=STREAM_HEADERS)
        await self.send_body(eventstream.OPEN, more_body=True)
        subscription = selectors.subscription(state, after, "sse", SendBuffer(self.base_send))
        self.respond_in_task(self.run(subscription, user.pk))
        return True

    async def run(self, subscription: Subscription, user_id: int) -> None:
        """The stream, until its end or its credentials' (``held``): either way the
        response is finished, so a revoked client's reconnect meets the 401."""
        retry = eventstream.retry(streaming_settings.RETRY_MS)
        events = send_events(subscription, frame_send(self.base_send), first=retry)
        await streams.run(self.scope, user_id, events)
        await self.send_body(b"", more_body=False)

    async def error(
        self,
        status: int,
        code: str,
        message: str,
        extra: list[tuple[bytes, bytes]] | None = None,
        field: str | None = None,
    ) -> None:
        body = error_bytes(status, code, message, field)
        headers = [(b"content-type", b"application/json")] + (extra or [])
        await self.send_response(status, body, headers=headers)


async def send_events(
    subscription: Subscription, send: Callable[..., Awaitable[None]], *, first: bytes = b""
) -> None:
    """Write a subscription's frames as SSE until it ends (the caller ends the body).
    ``send`` is the server's own (``frame_send``): frames skip the wrappers. ``first``
    goes at the head of the first event's block (the ``retry:`` field)."""
    with stream_context(subscription.state.id):
        try:
            async for batch in subscription.frames(streaming_settings.PING_INTERVAL):
                if batch is None:
                    body = eventstream.PING
                else:
                    body, first = first + eventstream.frames(batch), b""
                await send({"type": "http.response.body", "body": body, "more_body": True})
        except SlowConsumer as exc:
            log.info("closing a slow SSE client: %s", exc)
        except Exception:
            log.exception("SSE stream failed")
