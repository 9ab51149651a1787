"""WebSocket: ``/ws/chat/``, one socket per tab, many message subscriptions.

Contract (docs/protocol.md has examples): client frames are JSON objects with a ``type``
(``auth``, ``message.create``, ``message.regenerate``, ``message.edit``, ``subscribe``,
``unsubscribe``, ``cancel``, ``continue``, ``ping``); server frames are the shared events
with ``message_id`` added, one event per text frame, plus the replies to client frames
(``authenticated``, ``message.created``, ``subscribed``, ``unsubscribed``, ``cancelled``,
``pong``; each carries the frame's ``ref``), ``heartbeat``, the user's feed (``{"type":
"feed", "event": ...}`` after ``subscribe`` to ``"topic": "user"``) and ``{"type":
"error", ...}`` for a bad frame - which never closes the socket. A field of a frame is
taken only with its documented type; anything else is refused naming the field, before
anything is done. When the process shuts down, every socket is closed with 1001 once the
drain has ended its streams (``close_sockets``).

The receive handler only parses and dispatches: generation runs in the generation
service, and each subscription streams from its own task, so a slow handler can never
hold back a stream and a disconnect is seen at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Coroutine
from typing import Any

from streaming import events, selectors
from streaming.auth import authenticate, by_session, user_for_token
from streaming.conf import streaming_settings
from streaming.errors import NotFound, ServiceError, describe, unavailable
from streaming.feed import Listener
from streaming.ids import spelled_as_paths_take
from streaming.jsonbody import InvalidJSON, decode_json
from streaming.logcontext import stream_context
from streaming.params import unknown_field
from streaming.reading import (
    MessageState,
    SlowConsumer,
    Subscription,
    drained,
    has_more,
    parse_cursor,
)
from streaming.services import (
    Exchange,
    answer_made,
    cancel_message,
    continue_message,
    created_fields,
    edit_message,
    post_message,
    read_by_caller,
    reader_left,
    regenerate_message,
)
from streaming.storable import is_storable
from streaming.transports.daphne import SendBuffer, frame_send
from streaming.transports.dispatch import LoopWebsocketConsumer
from streaming.transports.held import session_recheck_delay, start_check

log = logging.getLogger(__name__)

CLOSE_SLOW_CONSUMER = 4408
# The credentials the socket was opened with were revoked (a token deleted or replaced,
# its user deactivated or changed so that it no longer authenticates).
CLOSE_REVOKED = 4401
CLOSE_GOING_AWAY = 1001


# A client's ``ref`` is echoed in every reply to its frame.
MAX_REF_CHARS = 200
# How long a shutdown waits for clients to answer the 1001 close before the server stops.
GOING_AWAY_WAIT = 1.0


class FrameError(Exception):
    """A frame refused by the consumer; ``field``: the field it names, when one is wrong."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field


class Sockets:
    """This process's open sockets, so that its shutdown can close each with 1001 (going
    away): a socket the server merely drops reaches its client as 1006, which cannot be
    told from a network fault, while 1001 says "reconnect, to another process"."""

    def __init__(self) -> None:
        self.open: set[ChatConsumer] = set()
        # Set once the shutdown closed the sockets: one that opens after is closed at once.
        self.closing = False
        # Set when the last socket ended, once the shutdown waits for it.
        self.all_gone: asyncio.Event | None = None
        # Credential checks under way (``revoked``), held until they end.
        self.checks: set[asyncio.Task[Any]] = set()

    def revoked(self, user_id: int) -> None:
        """A user's tokens were revoked (``Runtime.on_revoked``): each of their sockets
        checks its credentials again, and one they no longer authenticate is closed. A
        socket whose handshake is still being resolved is checked too: what it resolves
        may have been read before the revocation."""
        for consumer in list(self.open):
            user = consumer.user
            if user is None or (user.is_authenticated and user.pk == user_id):
                start_check(self.checks, consumer.check_credentials())

    def discard(self, consumer: ChatConsumer) -> None:
        self.open.discard(consumer)
        if not self.open and self.all_gone is not None:
            self.all_gone.set()

    async def close_all(self, wait: float) -> None:
        """Close every open socket with 1001, then wait up to ``wait`` s for the clients
        to answer the close, so the server stops with no connection left to drop. Each
        socket's tasks end with its connection, as after any close."""
        self.closing = True
        self.all_gone = asyncio.Event()
        for consumer in list(self.open):
            try:
                await consumer.close(code=CLOSE_GOING_AWAY)
            except Exception:
                log.exception("could not close a WebSocket for the shutdown")
        if self.open:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self.all_gone.wait()


sockets = Sockets()


async def close_sockets() -> None:
    """The shutdown hook (``Lifecycle.on_drained``): runs once the drain has ended this
    process's generations and their readers wrote the last events."""
    await sockets.close_all(GOING_AWAY_WAIT)


class ChatConsumer(LoopWebsocketConsumer):
    async def connect(self) -> None:
        # None until the handshake's credentials are resolved (``_resolve``).
        self.user: Any = None
        # The token of an auth frame; None: the handshake's credentials (its token or
        # session), which ``authenticate`` resolves.
        self.token: str | None = None
        # The handshake's resolution, awaited by the first frame.
        self.resolving: asyncio.Task[None] | None = None
        # The next check of a session's socket (``SESSION_RECHECK``).
        self.session_check: asyncio.TimerHandle | None = None
        self.subscriptions: dict[str, asyncio.Task[None]] = {}
        # The subscription each of those tasks streams (one subscribing again takes it over).
        self.readers: dict[str, Subscription] = {}
        self.feed: tuple[Listener, asyncio.Task[None]] | None = None
        self.last_sent = time.monotonic()
        self.send_buffer = SendBuffer(self.base_send)
        # Stream frames go straight to the server's send (see ``frame_send``).
        self.frame_send = frame_send(self.base_send)
        await self.accept()
        # The heartbeat is a timer while the socket is busy or quiet, and a task only
        # while its frame is being sent: a task per socket would be held all along.
        self.heartbeat: asyncio.Task[None] | None = None
        self.heartbeat_timer: asyncio.TimerHandle | None = None
        if sockets.closing:
            # The shutdown closed the sockets already: this one is told at once too.
            await self.close(code=CLOSE_GOING_AWAY)
            return
        # Resolved once the socket is among the open ones, which a revocation checks.
        sockets.open.add(self)
        self.resolving = asyncio.create_task(self._resolve())
        self._arm_heartbeat(streaming_settings.PING_INTERVAL)

    async def _resolve(self) -> None:
        """The handshake's credentials (its token, else its session), resolved while the
        first frame is awaited. The user is set as soon as it is known, not when a frame
        comes, so that a revocation meanwhile checks this socket as any other."""
        self.user = await authenticate(self.scope)
        if self._authenticated() and self._by_session():
            self._arm_session_check()

    def _by_session(self) -> bool:
        return self.token is None and by_session(self.scope)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """However the socket ends (a close, a handshake refused, an error the server
        closes with 1011), its subscriptions and heartbeat end with it."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            sockets.discard(self)
            await self._end_tasks()

    async def disconnect(self, code: int) -> None:
        await self._end_tasks()

    async def _end_tasks(self) -> None:
        tasks = [*getattr(self, "subscriptions", {}).values()]
        if (feed := getattr(self, "feed", None)) is not None:
            self.feed = None
            selectors.forget_feed(self.user, feed[0])
            tasks.append(feed[1])
        for name in ("heartbeat_timer", "session_check"):
            if (timer := getattr(self, name, None)) is not None:
                setattr(self, name, None)
                timer.cancel()
        for name in ("resolving", "heartbeat"):
            if (task := getattr(self, name, None)) is not None:
                tasks.append(task)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if hasattr(self, "subscriptions"):
            self.subscriptions.clear()
            # Those whose stream never began (cancelled before it ran): a stream that ran
            # took its reader off as it ended.
            unread, self.readers = list(self.readers.values()), {}
            for subscription in unread:
                await reader_left(subscription)

    # --- receive: parse, dispatch, answer; never stream here -----------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        ref = None
        if (resolving := self.resolving) is not None:
            await resolving
            self.resolving = None  # a finished task keeps its coroutine
        try:
            frame = self._parse(text_data, bytes_data)
            ref = _ref_of(frame)
            kind = frame.get("type")
            if not isinstance(kind, str) or (handler := self.HANDLERS.get(kind)) is None:
                raise FrameError("unknown_type", f"unknown frame type {kind!r}")
            _refuse_unknown_fields(kind, frame)
            if kind not in ("auth", "ping") and not self._authenticated():
                raise FrameError("not_authenticated", "authenticate first (an auth frame)")
            await handler(self, frame)
        except FrameError as exc:
            field = {"field": exc.field} if exc.field is not None else {}
            await self._send_error(ref, code=exc.code, message=exc.message, **field)
        except ServiceError as exc:
            await self._send_error(ref, **describe(exc))
        except Exception as exc:
            if (down := unavailable(exc)) is not None:
                log.warning("a WebSocket frame failed on the database: %s", exc)
                await self._send_error(ref, **describe(down))
                return
            # A bug must cost one frame its answer, never the socket and its streams.
            log.exception("WebSocket frame failed")
            await self._send_error(ref, code="server_error", message="internal server error")

    def _parse(self, text_data: str | None, bytes_data: bytes | None) -> dict[str, Any]:
        if text_data is None:
            raise FrameError("binary_frame", "binary frames are not accepted; send JSON text")
        limit = streaming_settings.WS_MAX_FRAME_CHARS
        if len(text_data) > limit:
            raise FrameError("frame_too_large", f"frames are limited to {limit} chars")
        try:
            frame = decode_json(text_data)
        except InvalidJSON as exc:
            message = exc.detail if exc.field is not None else f"the frame {exc}"
            raise FrameError("invalid_json", message, exc.field) from None
        if not isinstance(frame, dict):
            raise FrameError("invalid_frame", "a frame must be a JSON object")
        return frame

    def _authenticated(self) -> bool:
        return bool(self.user is not None and self.user.is_authenticated)

    # --- the fields of a frame: each taken only with its documented type ------------
    @staticmethod
    def _message_id(frame: dict[str, Any], *, looked_up: bool = True) -> str:
        """``looked_up``: the id must name a message (any spelling but the paths' names
        none); an unsubscribe only drops what it names, if anything."""
        value = frame.get("message_id")
        if not isinstance(value, str) or not value:
            raise FrameError("invalid_frame", "message_id must be a string", "message_id")
        return _named(value, "message not found") if looked_up else value

    @staticmethod
    def _conversation(frame: dict[str, Any]) -> str | None:
        """The conversation's id; None (absent or null) for a new conversation."""
        value = frame.get("conversation")
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise FrameError(
                "invalid_frame",
                "conversation must be a string (or absent, for a new conversation)",
                "conversation",
            )
        return _named(value, "conversation not found")

    @staticmethod
    def _flag(frame: dict[str, Any], name: str, default: bool) -> bool:
        """A boolean field: a string or a number is refused, not taken for true."""
        value = frame.get(name, default)
        if not isinstance(value, bool):
            raise FrameError("invalid_frame", f"{name} must be true or false", name)
        return value

    @staticmethod
    def _topic(frame: dict[str, Any]) -> bool:
        """True for the user's feed (``"topic": "user"``); False for a message's stream.
        A feed's frame carries none of a message's fields: one beside the topic is
        refused, naming it, not dropped (the caller meant one of the two)."""
        topic = frame.get("topic")
        if topic is None:
            return False
        if topic != "user":
            raise FrameError(
                "invalid_frame", 'topic must be "user" (or absent, with message_id)', "topic"
            )
        for field in ("message_id", "after"):
            if field in frame:
                raise FrameError(
                    "invalid_frame", f"{field} is not taken with topic: one or the other", field
                )
        return True

    # --- the handlers: every direct reply goes through ``_reply`` ---------------------
    async def on_auth(self, frame: dict[str, Any]) -> None:
        token = frame.get("token")
        if not isinstance(token, str) or not token:
            raise FrameError("invalid_frame", "token must be a string", "token")
        user = await user_for_token(token)
        if not user.is_authenticated:
            raise FrameError("not_authenticated", "invalid token")
        if self._authenticated() and user.pk != self.user.pk:
            # The socket's subscriptions, feed and revocation checks are its user's:
            # another user takes another socket.
            raise FrameError(
                "conflict", "this socket is authenticated as another user; open a new one", "token"
            )
        self.user, self.token = user, token
        await self._reply(frame, {"type": "authenticated", "user": user.get_username()})

    async def check_credentials(self) -> bool:
        """Resolve this socket's credentials again; close it (``CLOSE_REVOKED``) when they
        no longer authenticate its user. A socket lives for hours: a deleted token, a
        deactivated user or a session logged out or expired must end its access as it
        ends a request's. True when the socket keeps its user."""
        if (resolving := self.resolving) is not None:
            # Waited for, not awaited: this check's cancellation must not cancel it.
            await asyncio.wait({resolving})
        if not self._authenticated():
            return False  # nobody to check: its first frames must authenticate
        try:
            if self.token is not None:
                user = await user_for_token(self.token)
            else:
                user = await authenticate(self.scope)
        except Exception:
            log.exception("could not check a WebSocket's credentials")
            return True
        if not user.is_authenticated or user.pk != self.user.pk:
            log.info("closing a WebSocket whose credentials were revoked")
            await self.close(code=CLOSE_REVOKED)
            return False
        return True

    def _arm_session_check(self) -> None:
        """A session ends by age too, which nothing announces: a socket opened with one
        checks it again within every ``SESSION_RECHECK`` seconds (spread over the second
        half of the interval, so sockets opened together do not check together)."""
        delay = session_recheck_delay()
        if delay is not None:
            loop = asyncio.get_running_loop()
            self.session_check = loop.call_later(delay, self._session_check_due)

    def _session_check_due(self) -> None:
        self.session_check = None
        start_check(sockets.checks, self._check_session())

    async def _check_session(self) -> None:
        if await self.check_credentials() and self._by_session() and self in sockets.open:
            self._arm_session_check()

    async def on_ping(self, frame: dict[str, Any]) -> None:
        await self._reply(frame, {"type": "pong"})

    def _room_to_follow(self, subscribe: bool, message_id: str | None = None) -> None:
        """Refuse a subscription (``subscribe``) past ``WS_MAX_SUBSCRIPTIONS``; one to
        ``message_id``, which this socket already follows, replaces that one and needs no
        room. A frame that starts an answer (or a Continue's segment) asks this before
        anything is made: the answer was made, then its subscription refused, and it
        streamed to nobody while the client was told its frame had failed."""
        most = streaming_settings.WS_MAX_SUBSCRIPTIONS
        if subscribe and message_id not in self.subscriptions and len(self.subscriptions) >= most:
            raise FrameError("too_many_subscriptions", f"at most {most} at once")

    async def on_create(self, frame: dict[str, Any]) -> None:
        conversation = self._conversation(frame)
        subscribe = self._flag(frame, "subscribe", True)
        self._room_to_follow(subscribe)
        # Checked by the service, whatever its type: "" (or null) is the default model.
        model = frame.get("model")
        posting = post_message(
            self.user,
            conversation,
            frame.get("content"),
            frame.get("params"),
            model="" if model is None else model,
            parent_id=frame.get("parent_id"),
            **_keyed(frame),
        )
        await self._started(frame, await _made(posting, subscribe), subscribe)

    async def on_regenerate(self, frame: dict[str, Any]) -> None:
        message_id = self._message_id(frame)
        subscribe = self._flag(frame, "subscribe", True)
        stop = self._flag(frame, "stop", False)
        self._room_to_follow(subscribe)
        regenerating = regenerate_message(
            self.user, message_id, frame.get("params"), stop=stop, **_keyed(frame)
        )
        await self._started(frame, await _made(regenerating, subscribe), subscribe)

    async def on_edit(self, frame: dict[str, Any]) -> None:
        message_id = self._message_id(frame)
        subscribe = self._flag(frame, "subscribe", True)
        stop = self._flag(frame, "stop", False)
        self._room_to_follow(subscribe)
        editing = edit_message(
            self.user,
            message_id,
            frame.get("content"),
            frame.get("params"),
            model=frame.get("model"),
            stop=stop,
            **_keyed(frame),
        )
        await self._started(frame, await _made(editing, subscribe), subscribe)

    async def _started(self, frame: dict[str, Any], exchange: Exchange, subscribe: bool) -> None:
        """Answer a frame that started an answer with its ids, then stream it (unless
        the frame said ``"subscribe": false``)."""
        answer = exchange.assistant_message
        message_id = str(answer.id)
        reply: dict[str, Any] = {
            "type": "message.created",
            **created_fields(exchange.user_message, answer),
            "siblings": exchange.siblings.get(message_id, [message_id]),
        }
        if exchange.generation is None:
            reply["replayed"] = True  # a retry: the answer its first frame started
        await self._reply(frame, reply)
        if subscribe:
            await self._subscribe(frame, message_id, 0, MessageState.of(answer))

    async def on_subscribe(self, frame: dict[str, Any]) -> None:
        if self._topic(frame):
            await self._follow_feed(frame)
            return
        after = parse_cursor(frame.get("after", 0), "after", text=False)
        await self._subscribe(frame, self._message_id(frame), after)

    async def on_unsubscribe(self, frame: dict[str, Any]) -> None:
        """Answered with ``unsubscribed`` whether or not there was anything to stop: after
        it, no frame of that subscription follows."""
        if self._topic(frame):
            if self.feed is not None:
                listener, following = self.feed
                self.feed = None
                selectors.forget_feed(self.user, listener)
                following.cancel()
            await self._reply(frame, {"type": "unsubscribed", "topic": "user"})
            return
        message_id = self._message_id(frame, looked_up=False)
        task = self.subscriptions.pop(message_id, None)
        reader = self.readers.pop(message_id, None)
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # its end, whatever it was; not this frame's
        if reader is not None:
            # A stream cancelled before it ran never told its answer it had a reader, nor
            # that the reader left: the answer streamed on for nobody.
            await reader_left(reader)
        await self._reply(frame, {"type": "unsubscribed", "message_id": message_id})

    async def on_cancel(self, frame: dict[str, Any]) -> None:
        message = await cancel_message(self.user, self._message_id(frame))
        await self._reply(
            frame, {"type": "cancelled", "message_id": str(message.id), "status": message.status}
        )

    async def on_continue(self, frame: dict[str, Any]) -> None:
        message_id = self._message_id(frame)
        self._room_to_follow(True, message_id)
        exchange = await _made(continue_message(self.user, message_id), True)
        answer = exchange.assistant_message
        await self._subscribe(frame, str(answer.id), exchange.after, MessageState.of(answer))

    HANDLERS = {
        "auth": on_auth,
        "ping": on_ping,
        "message.create": on_create,
        "message.regenerate": on_regenerate,
        "message.edit": on_edit,
        "subscribe": on_subscribe,
        "unsubscribe": on_unsubscribe,
        "cancel": on_cancel,
        "continue": on_continue,
    }

    # --- streaming ---------------------------------------------------------------------
    async def _subscribe(
        self,
        frame: dict[str, Any],
        message_id: str,
        after: int,
        state: MessageState | None = None,
    ) -> None:
        """Reply ``subscribed`` to ``frame`` and stream the message after ``after``.
        ``state``: the message as just created, when this socket created it."""
        if state is None:
            state = await selectors.message_state(self.user, message_id)
        message_id = state.id
        old = self.subscriptions.pop(message_id, None)
        previous = self.readers.pop(message_id, None)
        # Never refused when it replaces one: the count just went down.
        self._room_to_follow(True)
        subscription = None
        if has_more(state, after):
            subscription = selectors.subscription(state, after, "ws", self.send_buffer)
            if previous is not None:
                # The answer keeps its reader across the switch (``take_over``).
                subscription.take_over(previous)
        if old is not None:
            old.cancel()
        try:
            await self._reply(
                frame,
                {
                    "type": "subscribed",
                    "message_id": message_id,
                    "after": after,
                    "status": state.status,
                },
            )
        except BaseException:
            if subscription is not None:
                await reader_left(subscription)
            raise
        if subscription is None:
            return
        task = asyncio.create_task(self._stream(subscription))
        self.subscriptions[message_id] = task
        self.readers[message_id] = subscription

    async def _stream(self, subscription: Subscription) -> None:
        """Write the subscription's events. It ends with the ``done`` that ends the stream
        or, when there was none to send (the client's cursor was at or past the end: the
        SSE response closes empty then), with ``unsubscribed`` and the message's status,
        so the client is never left waiting on a subscription that is over."""
        message_id = subscription.state.id
        with stream_context(message_id):
            try:
                async for batch in subscription.frames(None):
                    if batch is None:
                        continue
                    send = self.frame_send
                    for event in batch:
                        await send(
                            {"type": "websocket.send", "text": events.ws_frame(event, message_id)}
                        )
                    self.last_sent = time.monotonic()
                if subscription.ended_status is None:
                    state = await selectors.message_state(self.user, message_id)
                    await self._send_json(
                        {
                            "type": "unsubscribed",
                            "message_id": message_id,
                            "after": subscription.cursor,
                            "status": state.status,
                        }
                    )
            except SlowConsumer as exc:
                log.info("closing a slow WebSocket client: %s", exc)
                await self.close(code=CLOSE_SLOW_CONSUMER)
            except ServiceError as exc:
                # The message is gone (deleted) as its stream ended: say so for it.
                await self._send_error(None, **describe(exc), message_id=message_id)
            except Exception:
                # The reader could not follow (Redis unreachable, say): tell the client,
                # with its cursor, instead of leaving it with heartbeats only.
                log.exception("WebSocket stream failed")
                await self._send_error(
                    None,
                    code="stream_failed",
                    message="this stream failed on the server; subscribe again with after",
                    message_id=message_id,
                    after=subscription.cursor,
                )
            finally:
                if self.subscriptions.get(message_id) is asyncio.current_task():
                    del self.subscriptions[message_id]
                if self.readers.get(message_id) is subscription:
                    del self.readers[message_id]

    async def _follow_feed(self, frame: dict[str, Any]) -> None:
        if self.feed is None:
            listener = selectors.feed_of(self.user)
            self.feed = (listener, asyncio.create_task(self._feed(listener)))
        await self._reply(frame, {"type": "subscribed", "topic": "user"})

    async def _feed(self, listener: Listener) -> None:
        while True:
            # Not written while the client does not read: the events then wait in the
            # listener's bounded queue, and those past it are dropped (``feed_lagging``).
            await drained(self.send_buffer)
            event = await listener.get()
            await self._send_json({"type": "feed", **event})
            if listener.lagging and listener.queue.empty():
                listener.lagging = False
                await self._send_error(
                    None,
                    code="feed_lagging",
                    message="feed events were dropped while this socket did not read; "
                    "fetch the conversations again",
                )

    def _arm_heartbeat(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self.heartbeat_timer = loop.call_later(delay, self._heartbeat_due)

    def _heartbeat_due(self) -> None:
        """A ``heartbeat`` frame once nothing was sent for ``PING_INTERVAL``; otherwise
        the timer is armed again for the rest of the interval. After a send that failed
        (the socket is gone) no timer is armed: the socket's end awaits the task."""
        self.heartbeat_timer = None
        interval = streaming_settings.PING_INTERVAL
        quiet = time.monotonic() - self.last_sent
        if quiet < interval:
            self._arm_heartbeat(max(interval - quiet, 0.05))
            return
        self.heartbeat = asyncio.create_task(self._beat(interval))

    async def _beat(self, interval: float) -> None:
        await self._send_json({"type": "heartbeat"})
        self.heartbeat = None
        self._arm_heartbeat(interval)

    async def _reply(self, frame: dict[str, Any], payload: dict[str, Any]) -> None:
        """A direct reply to ``frame``: it carries the frame's ``ref`` when it had one
        (``receive`` checked it with ``_ref_of``), so a client can match every answer to
        its frame, whatever else the socket carries meanwhile."""
        ref = frame.get("ref")
        await self._send_json({**payload, "ref": ref} if ref is not None else payload)

    async def _send_error(self, ref: Any, **fields: Any) -> None:
        """An ``error`` frame; it carries the client's ``ref`` when its frame had one."""
        await self._send_json(
            {"type": "error", **fields, **({"ref": ref} if ref is not None else {})}
        )

    async def _send_json(self, payload: dict[str, Any]) -> None:
        self.last_sent = time.monotonic()
        await self.send(text_data=events.encode(payload).decode())


async def no_such_socket(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A WebSocket handshake to a path that serves none: refused before it is accepted
    (Daphne answers ``403``), where the router's missing route was a ``500`` and a
    traceback in the log for every try."""
    if (await receive())["type"] == "websocket.connect":
        await send({"type": "websocket.close"})


async def _made(making: Coroutine[Any, Any, Exchange], subscribe: bool) -> Exchange:
    """The exchange a frame makes; one made for this socket to read (``subscribe``) is
    left unread if the socket ends while it is made (``services.read_by_caller``)."""
    if not subscribe:
        return await making
    return await read_by_caller(making, answer_made)


def _keyed(frame: dict[str, Any]) -> dict[str, Any]:
    """A frame's ``idempotency_key``, for the services that take one (checked there)."""
    return {"idempotency_key": frame.get("idempotency_key"), "idempotency_field": "idempotency_key"}


# The fields each frame type takes besides ``type`` and ``ref`` (docs/protocol.md).
_KEYED = ("subscribe", "idempotency_key")
FIELDS: dict[str, frozenset[str]] = {
    "auth": frozenset({"token"}),
    "ping": frozenset(),
    "message.create": frozenset(
        {"conversation", "content", "params", "model", "parent_id", *_KEYED}
    ),
    "message.regenerate": frozenset({"message_id", "params", "stop", *_KEYED}),
    "message.edit": frozenset({"message_id", "content", "params", "model", "stop", *_KEYED}),
    "subscribe": frozenset({"topic", "message_id", "after"}),
    "unsubscribe": frozenset({"topic", "message_id"}),
    "cancel": frozenset({"message_id"}),
    "continue": frozenset({"message_id"}),
}


def _refuse_unknown_fields(kind: str, frame: dict[str, Any]) -> None:
    """A field the frame's type does not take is refused, naming it, as the REST API
    refuses one: a misspelt or misplaced field (``max_tokens`` beside ``content``) would
    be ignored, and the answer not be what was asked."""
    taken = FIELDS[kind]
    unknown = sorted(key for key in frame if key not in taken and key not in ("type", "ref"))
    if unknown:
        raise FrameError("invalid_frame", f"{unknown[0]} {unknown_field(unknown[0])}", unknown[0])


def _ref_of(frame: dict[str, Any]) -> Any:
    """The frame's ``ref``, echoed in replies: a number or storable string (``None`` when
    absent); anything else is an ``invalid_frame`` (it could not be sent back)."""
    ref = frame.get("ref")
    if ref is None:
        return None
    if isinstance(ref, int | float) and not isinstance(ref, bool) and math.isfinite(ref):
        return ref
    if isinstance(ref, str) and is_storable(ref) and len(ref) <= MAX_REF_CHARS:
        return ref
    raise FrameError(
        "invalid_frame",
        f"ref must be a number or a string of at most {MAX_REF_CHARS} characters",
        "ref",
    )


def _named(value: str, missing: str) -> str:
    """An id as the REST paths take it (``<uuid:...>``: lowercase, with hyphens), so that a
    frame and a path agree on what exists and subscriptions have one key per message;
    any other spelling names nothing."""
    if not spelled_as_paths_take(value):
        raise NotFound(missing)
    return value
