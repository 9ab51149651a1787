"""One round trip per answer: a ``POST`` that starts an answer and asks for
``Accept: text/event-stream`` is answered with the answer's stream itself.

Django handles the ``POST`` as it handles every other (authentication, CSRF, body limits,
validation, the error shapes and the OpenAPI contract are the REST API's, untouched: it
is told the client accepts JSON). When its answer is a ``201`` that describes a started
answer (``message.stream``), the client gets, instead of that JSON, a ``200`` stream: a
first ``created`` event (no ``id``) whose data is the 201's body, with both messages and
their ids, then the answer's events exactly as ``GET /api/messages/<id>/stream/`` sends
them from the start. Any other answer (an error, a 201 that started nothing) goes out as
Django wrote it. A client that loses the stream resumes with that GET and
``Last-Event-ID``, as after any dropped stream.

Applies to ``POST /api/conversations/<id>/messages/``, ``POST /api/messages/`` (a new
conversation), ``/regenerate/`` and ``/edit/``: any POST whose 201 describes a started answer.
A message post is created without Django's request cycle wherever the answer is the same
(``streaming.transports.leanpost``, on the routes that say ``lean``); the rest of this
holds for both.

The stream's head carries ``STREAM_HEADERS`` and the headers Django's middleware set on the
201 (security headers, a session's cookie), not those that describe its JSON body or the
JSON resource (``Allow``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from streaming import selectors, services
from streaming.auth import authenticate, header, with_session
from streaming.conf import streaming_settings
from streaming.errors import error_bytes, headers_of, unavailable
from streaming.metrics import ONE_STEP_POSTS
from streaming.reading import MessageState
from streaming.termination import Status
from streaming.transports import eventstream, leanpost
from streaming.transports.daphne import SendBuffer, frame_send
from streaming.transports.held import streams
from streaming.transports.sse import STREAM_HEADERS, send_events

log = logging.getLogger(__name__)

EVENT_STREAM = "text/event-stream"
# Django's headers that describe its JSON body or the resource, not the stream that
# replaces them.
BODY_HEADERS = {b"content-type", b"content-length", b"content-encoding", b"vary", b"allow"}


def wants_stream(scope: dict[str, Any]) -> bool:
    """A POST whose ``Accept`` takes ``text/event-stream`` (not with ``q=0``, which
    refuses it)."""
    if scope.get("type") != "http" or scope.get("method") != "POST":
        return False
    accept = (header(scope, b"accept") or "").lower()
    if EVENT_STREAM not in accept:
        return False
    for media_range in accept.split(","):
        kind, *parameters = (part.strip() for part in media_range.split(";"))
        if kind == EVENT_STREAM:
            return all(not _refused(parameter) for parameter in parameters)
    return False


def _refused(parameter: str) -> bool:
    """Whether a media range's parameter is a quality of zero (``q=0``, ``q=0.000``)."""
    name, _, value = parameter.partition("=")
    if name.strip() != "q":
        return False
    try:
        return float(value) == 0
    except ValueError:
        return False


def _as_json_request(scope: dict[str, Any]) -> dict[str, Any]:
    headers = [(k, v) for k, v in scope["headers"] if k != b"accept"]
    return {**scope, "headers": [*headers, (b"accept", b"application/json")]}


class _Capture:
    """Django's ``send``: a 201 is held back for the stream; anything else goes through."""

    def __init__(self, send: Any) -> None:
        self.send = send
        self.holding = False
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.holding = message["status"] == 201
            if self.holding:
                self.headers = list(message.get("headers", []))
                return
        elif message["type"] == "http.response.body" and self.holding:
            self.body += message.get("body", b"")
            return
        await self.send(message)

    def started_answer(self) -> dict[str, Any] | None:
        """The 201's body when it describes a started answer."""
        try:
            data = json.loads(self.body)
            return data if data["message"]["stream"]["message_id"] else None
        except (ValueError, KeyError, TypeError):
            return None


class _HeldDisconnect:
    """The ``receive`` of a post Django answers (``for_django``): the request's messages
    as they come, but a disconnect after the body is held from Django. Django drops its
    response when the client leaves, while the view's thread goes on and makes the
    answer: nobody would know it was made, and it would run to its end for nobody. Held,
    the response is made and its stream opened, and the stream's ``receive`` (``after``)
    gets the disconnect first: it leaves as any reader that leaves does."""

    def __init__(self, receive: Any) -> None:
        self.receive = receive
        self.body_read = False
        self.held: dict[str, Any] | None = None

    async def for_django(self) -> dict[str, Any]:
        message = await self.receive()
        if not self.body_read:
            self.body_read = message["type"] != "http.request" or not message.get("more_body")
            return message
        if message["type"] == "http.disconnect":
            self.held = message
            # Django's watch for the disconnect waits here until Django, its response
            # made, cancels it.
            await asyncio.get_running_loop().create_future()
        return message

    async def after(self) -> dict[str, Any]:
        if self.held is not None:
            message, self.held = self.held, None
            return message
        return await self.receive()


def _lean_answer(made: tuple[MessageState, int] | leanpost.Receive) -> str | None:
    """The answer the lean path made, if it made one (``services.read_by_caller``)."""
    return made[0].id if isinstance(made, tuple) else None


def _django_answer(state: MessageState | None) -> str | None:
    """The answer Django made, if it made one (``services.read_by_caller``)."""
    return None if state is None else state.id


class OneStepAnswers:
    """ASGI middleware in front of Django (see the module's docstring). ``lean``: the
    route is a message post's, tried on the lean path first."""

    def __init__(self, django: Any, *, lean: bool = False) -> None:
        self.django = django
        self.lean = lean

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        """The answer is made for this caller to read: a caller gone while it is made
        (this call cancelled) leaves it unread (``services.read_by_caller``)."""
        if not wants_stream(scope):
            return await self.django(scope, receive, send)
        if self.lean:
            try:
                lean = await services.read_by_caller(
                    self._create_lean(scope, receive, send), _lean_answer
                )
            except Exception as exc:
                # Nothing was sent yet (``_open`` encodes before it sends): the error is
                # answered as the REST API answers one, in its JSON shape.
                await _failed(send, exc)
                return
            if isinstance(lean, tuple):
                await self._stream(*lean, scope, receive, send)
                return
            receive = lean  # the body read so far, then the rest
        ONE_STEP_POSTS.labels(path="django").inc()
        held = _HeldDisconnect(receive)
        state = await services.read_by_caller(
            self._create(scope, held.for_django, send), _django_answer
        )
        if state is None:
            return
        # Whose answer it is, Django knew and did not say: the credentials it accepted
        # tell again (held as that user's stream, it is checked on their revocations only).
        scope = with_session(scope)
        user = await authenticate(scope)
        if not user.is_authenticated:  # revoked since: as a revocation ends a stream
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            # Nobody may read it now: it is left as its caller leaving would leave it.
            await services.left_unread(state.id)
            return
        await self._stream(state, user.pk, scope, held.after, send)

    async def _create_lean(
        self, scope: dict[str, Any], receive: Any, send: Any
    ) -> tuple[MessageState, int] | leanpost.Receive:
        """The lean path's answer: the stream's head and ``created`` event sent and the
        answer's state returned with its owner's id, or the ``receive`` Django must be
        called with. As with Django's, nothing of the 201 outlives this call."""
        created = await leanpost.create(scope, receive)
        if not isinstance(created, leanpost.Created):
            return created
        ONE_STEP_POSTS.labels(path="lean").inc()
        await _open(send, created.body, created.headers)
        return created.state, created.user_id

    async def _create(self, scope: dict[str, Any], receive: Any, send: Any) -> MessageState | None:
        """Django's answer, sent as it is unless it started an answer: then the stream's
        head and its ``created`` event are sent, and the answer's state is returned.
        Nothing of the 201 outlives this call (the stream can last minutes)."""
        capture = _Capture(send)
        await self.django(_as_json_request(scope), receive, capture)
        if not capture.holding:
            return None
        created = capture.started_answer()
        if created is None:  # a 201 of something else: as Django wrote it
            await send({"type": "http.response.start", "status": 201, "headers": capture.headers})
            await send({"type": "http.response.body", "body": bytes(capture.body)})
            return None
        await _open(send, created, capture.headers)
        # The answer was created for this caller a moment ago: its state is known.
        message = created["message"]
        return MessageState(
            id=message["id"],
            status=message.get("status", Status.STREAMING.value),
            last_seq=message.get("last_seq", 0),
            termination=message.get("termination") or {},
        )

    async def _stream(
        self,
        state: MessageState,
        user_id: int,
        scope: dict[str, Any],
        receive: Any,
        send: Any,
    ) -> None:
        """The answer's events, written by this task until the answer ends, the client
        leaves or its credentials are revoked (``held``). The client's ``http.disconnect``
        is awaited in a second task, which cancels this one when it comes first, as the
        SSE consumer's disconnect handler cancels its stream: a third task and an
        ``asyncio.wait`` would be held for as long as the stream lasts. A cancellation
        from elsewhere (the server's) goes on."""
        subscription = selectors.subscription(state, 0, "sse", SendBuffer(send))
        this = asyncio.current_task()
        assert this is not None
        writing, left = True, False

        def on_disconnect(watcher: asyncio.Task[None]) -> None:
            nonlocal left
            if writing and not watcher.cancelled():
                left = True
                this.cancel()

        gone = asyncio.create_task(_disconnected(receive))
        gone.add_done_callback(on_disconnect)
        # Held with the credentials it was created with, its session's included (these
        # routes are outside Channels' session middleware), for the checks to read again.
        held = with_session(scope)
        try:
            await streams.run(held, user_id, send_events(subscription, frame_send(send)))
        except asyncio.CancelledError:
            if not left:
                raise
        finally:
            writing = False
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone
        if left:
            this.uncancel()  # the cancellation was this stream's own
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _open(send: Any, created: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> None:
    """The stream's head, with what of the 201's ``headers`` is kept, and its ``created``
    event (the 201's body). The event is encoded before anything is sent: a failure then
    is the server's error answer, not a stream that never says what it created."""
    kept = [(k, v) for k, v in headers if k.lower() not in BODY_HEADERS]
    opening = eventstream.retry(streaming_settings.RETRY_MS)
    opening += eventstream.named("created", created)
    await send({"type": "http.response.start", "status": 200, "headers": [*STREAM_HEADERS, *kept]})
    await send({"type": "http.response.body", "body": opening, "more_body": True})


async def _failed(send: Any, exc: Exception) -> None:
    """The answer to a one-step post that failed before it sent anything: a 503 when the
    database failed it (``Unavailable``: sent again with its ``Idempotency-Key``, the
    post gets what a commit whose answer was lost made), else a 500."""
    down = unavailable(exc)
    if down is None:
        log.error("one-step post failed", exc_info=exc)
        status, body, extra = 500, error_bytes(500, "server_error", "internal server error"), []
    else:
        log.warning("a one-step post failed on the database: %s", exc)
        status, body = down.status, error_bytes(down.status, down.code, down.message)
        extra = [
            (name.lower().encode(), value.encode()) for name, value in headers_of(down).items()
        ]
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
