"""Every touch of Daphne's and Twisted's internals, checked, in one place.

What the product needs of the server that ASGI does not give, and what the server's own
path costs besides:

- **The per-connection memory bound.** Daphne applies no backpressure: ``send()`` never
  waits and Twisted buffers without limit for a client that stops reading.
  ``SendBuffer`` finds the Twisted transport behind an ASGI ``send`` callable (Daphne
  passes ``partial(server.handle_reply, protocol)``; Channels' session middleware wraps it
  in a bound method with ``real_send``) and reads its queue length, so a reader can stop
  writing while the client is not reading and close the connection if that lasts.
- **Write-through.** Twisted never sends in ``write``: it queues the bytes and sends on the
  reactor's next writability pass (on the asyncio reactor, two ``epoll_ctl`` calls, a
  selector-map update and a callback per frame). ``install_write_through`` makes Twisted's
  plain TCP connections try the socket first, as asyncio's transports do, and queue only
  what it did not take. Bytes not taken
  are queued and sent the usual way, a failed send is left to the queued path to report,
  TLS connections and connections with bytes queued keep Twisted's behaviour, so order
  is kept and ``SendBuffer`` still sees what is unsent.
- **Raw bodies.** Before Daphne sees a POST, Twisted parses its ``Content-Type`` through
  the ``email`` package and a form body into ``request.args``, which Daphne never reads: it
  hands the raw body to the application, which parses it (1.2 % of the *users*
  benchmark's CPU). ``install_raw_bodies`` turns Twisted's form parsing off for Daphne's
  requests; the application sees the same bytes.
- **A plain HTTP module.** ``twisted.web.http`` is replaced in ``sys.modules`` by
  Twisted's deprecation proxy (for one deprecated name, ``HTTPClient``), so every
  ``http.Request.write`` Daphne makes per response body frame went through the proxy's
  ``__getattribute__`` (2 % of the CPU with 1,000 SSE streams). ``install_plain_http``
  gives Daphne's modules the module behind the proxy; Daphne uses none of the deprecated
  names, and everything else sees the proxy as before.
- **Log fields made when written.** Autobahn makes the fields of its debug lines before
  the logger drops them: it highlights a method's qualified name, the peer and a length
  (through ``click.style``) on every WebSocket frame it sends or receives, 4.6 µs a
  frame, and pretty-prints the protocol's 29 settings on every connection, 300 µs.
  ``install_lazy_log_fields`` gives autobahn's WebSocket modules highlighters and a
  ``pformat`` that return a field which makes that text only when a line is formatted,
  so a line written with debug logging on reads exactly as before.
- **Sends during a WebSocket's closing handshake.** Once a client's Close frame arrives,
  autobahn refuses every further frame (it raises ``Disconnected``), but Daphne tells the
  application only when the TCP connection is gone, a reactor pass or a flushed buffer
  later. A stream writing in between failed with a traceback, and its error frame failed
  again in a task nobody awaited. ``install_closing_sends`` has Daphne drop a frame for a
  socket that is closing or closed, as it drops replies for connections it knows are
  gone: the client asked for no more, and the disconnect follows.
- **Close codes of the protocol.** Daphne closes a WebSocket through autobahn's
  ``sendClose``, which takes only the codes a browser's script may send (1000 and
  3000-4999) and raises for the rest, so an application could not close with 1001 (going
  away) when the server shuts down, nor any other code RFC 6455 gives a server.
  ``install_close_codes`` has Daphne send those codes (autobahn's
  ``CLOSE_STATUS_CODES_ALLOWED``) as the same close frame, through ``sendCloseFrame``,
  which Daphne itself uses for 1011; every other code goes the way it went.
- **A connection's message queue.** Daphne hands each connection's ASGI messages to the
  application through an ``asyncio.Queue``: four deques and an ``Event``, 3.2 KB held for
  as long as the connection is open, to carry a request's body and its disconnect (or a
  WebSocket's frames) to one reader. ``install_application_queues`` gives Daphne's server
  module an ``asyncio`` whose ``Queue`` is ``ApplicationQueue``: the same order and
  cancellation behaviour for what Daphne uses (``put_nowait`` and ``get``), in two lists.
- **Reading held while a client does not keep up.** Twisted reads a connection for as
  long as bytes arrive, whatever it still has to send it, and Daphne queues each
  WebSocket frame for the application without a bound: a client that sends frames (or
  pings, or pipelined requests) and never reads the replies grew the process by
  hundreds of MB, without an account. ``install_read_holds`` stops reading a connection
  while more than ``STREAM_SEND_BUFFER_LIMIT`` bytes wait to be sent to it, or more than
  ``QUEUE_HOLD`` of its messages wait for the application, and reads it again once
  half of that is left: TCP then holds the client back. What was read before the hold
  is still handled (at most one read's worth), so a connection holds a bounded amount.
- **Refusals that say why.** Twisted refuses a request whose headers are over its limits
  (16 KiB, 500 headers) or that it cannot parse before Daphne sees it: with a bare
  ``400`` and no body, or, for a single line over 16 KiB, by closing the connection
  without a word. ``install_clear_refusals`` keeps the limits and answers with ``431``
  (or ``400``) and the API's error object naming what was wrong, in OpenAI's shape under
  ``/v1/`` (``streaming.errors.error_for_path``).
- **Daphne's own errors in the API's shape.** Daphne answers a request it refuses (a
  header value with a control character it refuses, a header name that is no token) and an
  application that failed before it answered with an HTML page (``basic_error``).
  ``install_json_errors`` has it answer with the same status and the error object, in
  OpenAI's shape under ``/v1/``, closing the connection after a refusal.
- **Absolute-form targets.** A request may name its target whole (``GET
  http://host/api/conversations/ HTTP/1.1``, RFC 9112 section 3.2.2); Daphne passed the
  whole URL on as the path, and Django answered an HTML 404. ``install_absolute_targets``
  serves it by its path, with the target's authority for its ``Host`` (as the RFC
  requires), so ``ALLOWED_HOSTS`` judges the host the target names.

All are checked when the process starts (``check_server``: the versions are the tested
ones, the attributes exist) and when used. When one cannot work, a warning is logged once
per process and ``chat_server_hooks_available{hook=...}`` drops to 0; the product keeps
working without it (without the bound, only the kernel's buffers limit a connection).
``stop_server`` ends Daphne after the SIGTERM drain. Under another server all of these
report themselves unavailable and do nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import inspect
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from importlib import metadata
from types import ModuleType
from typing import Any

from django.conf import settings

from streaming import metrics
from streaming.conf import streaming_settings
from streaming.errors import error_for_path
from streaming.jsonbody import body_limit, too_large_detail

log = logging.getLogger(__name__)

SEND_BUFFER = "send_buffer"
WRITE_THROUGH = "write_through"
RAW_BODIES = "raw_bodies"
PLAIN_HTTP = "plain_http"
LAZY_LOG_FIELDS = "lazy_log_fields"
CLOSING_SENDS = "closing_sends"
CLOSE_CODES = "close_codes"
APPLICATION_QUEUES = "application_queues"
CLEAR_REFUSALS = "clear_refusals"
READ_HOLDS = "read_holds"
JSON_ERRORS = "json_errors"
ABSOLUTE_TARGETS = "absolute_targets"
HOOKS = (
    SEND_BUFFER,
    WRITE_THROUGH,
    RAW_BODIES,
    PLAIN_HTTP,
    LAZY_LOG_FIELDS,
    CLOSING_SENDS,
    CLOSE_CODES,
    APPLICATION_QUEUES,
    CLEAR_REFUSALS,
    READ_HOLDS,
    JSON_ERRORS,
    ABSOLUTE_TARGETS,
)
# What each hook's absence costs, for the warning.
WITHOUT = {
    SEND_BUFFER: "the per-connection memory bound is off",
    WRITE_THROUGH: "frames wait",
    RAW_BODIES: "Twisted parses every POST for forms",
    PLAIN_HTTP: "every response write looks Twisted's HTTP module up through a proxy",
    LAZY_LOG_FIELDS: "every WebSocket frame and connection formats debug-log fields nobody reads",
    CLOSING_SENDS: "a stream writing to a closing WebSocket fails with a traceback",
    CLOSE_CODES: "a WebSocket cannot be closed with 1001 at shutdown (its client sees 1006)",
    APPLICATION_QUEUES: "every open connection holds an asyncio.Queue (3.2 KB)",
    CLEAR_REFUSALS: "a request Twisted cannot parse gets a bare 400, or no answer at all",
    READ_HOLDS: "a client that sends without reading what it is sent grows the server's memory",
    JSON_ERRORS: "a request Daphne refuses, or an application failing, gets an HTML page",
    ABSOLUTE_TARGETS: "a request naming its target as a whole URL gets a 404",
}
# Daphne's modules that name ``twisted.web.http`` as ``http``, and what they use of it.
DAPHNE_HTTP_USERS = ("daphne.http_protocol", "daphne.server")
DAPHNE_HTTP_NAMES = ("Request", "HTTPFactory", "HTTPChannel", "H2_ENABLED")
# Daphne's protocol modules, which put a connection's messages on its application queue.
DAPHNE_QUEUE_USERS = ("daphne.http_protocol", "daphne.ws_protocol")
# Autobahn's WebSocket modules, and the functions they make debug-log fields with.
AUTOBAHN_LOG_FIELDS = {
    "autobahn.websocket.protocol": ("hltype", "hlval", "pformat"),
    "autobahn.twisted.websocket": ("hltype", "hlval"),
}
# The Twisted releases these hooks are tested against (also pyproject.toml's range).
TESTED_TWISTED = ((24, 7), (27, 0))
# What the clear refusals read and override on Twisted's HTTP channel.
CHANNEL_ATTRIBUTES = (
    "_respondToBadRequestAndDisconnect",
    "allHeadersReceived",
    "allContentReceived",
    "dataReceived",
    "connectionLost",
    "callLater",
    "lineLengthExceeded",
    "loseConnection",
    "maxHeaders",
    "totalHeadersSize",
    "MAX_LENGTH",
)
# What the hooks read or call on Twisted's TCP connections.
TRANSPORT_ATTRIBUTES = ("dataBuffer", "offset", "_tempDataLen")
SERVER_METHODS = ("write", "writeSequence", "writeSomeData")
# What the read holds wrap on Twisted's TCP connections.
READ_METHODS = ("doRead", "doWrite", "startReading", "stopReading")
# Messages a connection's application queue holds before its socket is no longer read
# (a WebSocket's frames not taken yet; the websockets library's ``max_queue``).
QUEUE_HOLD = 16
# Why a connection is not read from now.
UNSENT, QUEUED = "unsent", "queued"

_warned: set[str] = set()


def unavailable(hook: str, why: str) -> None:
    """Record that ``hook`` cannot work here: one warning per process, and the metric."""
    metrics.SERVER_HOOKS.labels(hook=hook).set(0)
    if hook not in _warned:
        _warned.add(hook)
        log.warning("server hook %s unavailable (%s): %s", hook, why, WITHOUT[hook])


def _version(text: str) -> tuple[int, int]:
    parts = ([*text.split("."), "0"])[:2]
    return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)


def check_server() -> bool:
    """At start-up: True when Twisted is the tested one and has what the hooks use."""
    try:
        from twisted.internet import tcp
    except ImportError:
        for hook in HOOKS:
            unavailable(hook, "not served by Twisted")
        return False
    low, high = TESTED_TWISTED
    version = metadata.version("twisted")
    if not low <= _version(version) < high:
        for hook in HOOKS:
            unavailable(hook, f"Twisted {version} is outside the tested range")
        return False
    missing = [name for name in SERVER_METHODS if not hasattr(tcp.Server, name)]
    if missing:
        for hook in HOOKS:
            unavailable(hook, f"tcp.Server lacks {', '.join(missing)}")
        return False
    metrics.SERVER_HOOKS.labels(hook=SEND_BUFFER).set(1)
    return True


def innermost_send(send: Any) -> functools.partial[Any] | None:
    """Daphne's own ``send`` behind the wrappers (Channels' session middleware and the
    consumer), or None on other servers. Stream frames go to it directly: the wrappers
    only act on response starts and WebSocket accepts, and cost a chain of coroutine
    calls per frame."""
    current = send
    for _ in range(8):
        if isinstance(current, functools.partial):
            return current
        owner = getattr(current, "__self__", None)
        if owner is None:
            return None
        inner = getattr(owner, "real_send", None) or getattr(owner, "base_send", None)
        if inner is None or inner is current:
            return None
        current = inner
    return None


def frame_send(send: Any) -> Callable[..., Any]:
    """The callable stream frames are written with: the innermost send, else ``send``."""
    return innermost_send(send) or send


def _transport_of(send: Any) -> Any | None:
    innermost = innermost_send(send)
    protocol = innermost.args[0] if innermost is not None and innermost.args else None
    if protocol is None:
        return None
    channel = getattr(protocol, "channel", None)  # twisted.web Request -> HTTPChannel
    transport = getattr(channel, "transport", None) if channel is not None else None
    if transport is None:
        transport = getattr(protocol, "transport", None)  # autobahn WebSocket protocol
    if transport is None or not all(hasattr(transport, a) for a in TRANSPORT_ATTRIBUTES):
        return None
    return transport


def _queued(transport: Any) -> int:
    """The bytes a Twisted TCP connection has queued and not sent yet."""
    return int(len(transport.dataBuffer) - transport.offset + transport._tempDataLen)


class SendBuffer:
    """A probe of the connection's unsent bytes; ``pending()`` is None when unknowable
    (and then the hook is reported unavailable)."""

    __slots__ = ("_transport",)

    def __init__(self, send: Callable[..., Any]) -> None:
        self._transport = _transport_of(send)
        if self._transport is None:
            unavailable(SEND_BUFFER, "no Twisted transport behind the ASGI send")

    def pending(self) -> int | None:
        t = self._transport
        if t is None:
            return None
        try:
            return _queued(t)
        except (AttributeError, TypeError) as exc:
            self._transport = None
            unavailable(SEND_BUFFER, f"the transport changed shape: {exc}")
            return None


def install_write_through() -> bool:
    """Patch Twisted's TCP server connections; False (and reported) when it cannot."""
    if not check_server():
        unavailable(WRITE_THROUGH, "the server check failed")
        return False
    from twisted.internet import tcp

    server: Any = tcp.Server
    if getattr(server, "write_through", False):
        return True
    queued_write = server.write

    def write(self: Any, data: bytes) -> None:
        if (
            data
            and self.connected
            and not self.disconnecting
            and not self._writeDisconnected
            and not self.TLS
            and self.offset == len(self.dataBuffer)
            and not self._tempDataLen
        ):
            sent = self.writeSomeData(data)
            if isinstance(sent, int) and sent > 0:
                if sent == len(data):
                    return
                data = data[sent:]
        queued_write(self, data)

    def write_sequence(self: Any, iovec: Iterable[bytes]) -> None:
        write(self, b"".join(iovec))

    server.write = write
    server.writeSequence = write_sequence
    server.write_through = True
    metrics.SERVER_HOOKS.labels(hook=WRITE_THROUGH).set(1)
    return True


def _daphne_modules(hook: str, names: Sequence[str]) -> list[ModuleType] | None:
    """Daphne's modules ``names`` for ``hook``; None (and reported) when the server check
    fails or Daphne is not serving."""
    if not check_server():
        unavailable(hook, "the server check failed")
        return None
    try:
        return [importlib.import_module(name) for name in names]
    except ImportError:
        unavailable(hook, "not served by Daphne")
        return None


def install_raw_bodies() -> bool:
    """Daphne's requests skip Twisted's form parsing; False (and reported) when they cannot."""
    found = _daphne_modules(RAW_BODIES, ["daphne.http_protocol"])
    if found is None:
        return False
    request: Any = found[0].WebRequest
    if getattr(request, "raw_bodies", False):
        return True
    parameters = inspect.signature(request.__mro__[1].__init__).parameters
    if "parsePOSTFormSubmission" not in parameters:
        unavailable(RAW_BODIES, "twisted.web's Request takes no parsePOSTFormSubmission")
        return False
    initialise = request.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        initialise(self, *args, **kwargs)
        self._parsePOSTFormSubmission = False

    request.__init__ = __init__
    request.raw_bodies = True
    metrics.SERVER_HOOKS.labels(hook=RAW_BODIES).set(1)
    return True


# Daphne's error answers (``WebRequest.basic_error``): the text it gives each, and ours.
DAPHNE_ERRORS = {
    "Invalid header name": "a header's name is not a token (RFC 9110 section 5.1)",
    "Invalid header value": "a header's value holds a control character (RFC 9110 section 5.5)",
    "Invalid characters in path": "the request's path is not ASCII",
    "Invalid query string": "the request's query string is not ASCII",
    "Daphne HTTP processing error": "internal server error",
    "Exception inside application.": "internal server error",
    "Application failed to respond within time limit.": "the application did not answer in time",
}
# The ``code`` of each status Daphne answers with; any other is a ``server_error``.
DAPHNE_CODES = {400: "bad_request"}
# What the hooks on Daphne's request read or replace, with the arguments they take.
WEB_REQUEST_METHODS = {
    "basic_error": ["self", "status", "status_text", "body"],
    "handle_reply": ["self", "message"],
    "process": ["self"],
}


def _web_request(hook: str) -> Any | None:
    """Daphne's ``WebRequest`` when it has the methods the hooks use, as they use them;
    else None, reported as ``hook``'s absence."""
    found = _daphne_modules(hook, ["daphne.http_protocol"])
    if found is None:
        return None
    request = found[0].WebRequest
    for name, arguments in WEB_REQUEST_METHODS.items():
        method = getattr(request, name, None)
        if method is None or list(inspect.signature(method).parameters) != arguments:
            unavailable(hook, f"Daphne's WebRequest.{name} changed shape")
            return None
    return request


def answer_error(request: Any, status: int, code: str, message: str) -> None:
    """Answer Daphne's ``request`` with ``status`` and the error body its path calls for
    (``error_for_path``). A refusal (4xx) closes the connection once it is sent: the
    request was not served as sent, and nothing after it on the connection is read."""
    channel = request.channel
    if channel is None:
        return  # the connection is gone: nobody to tell
    body = error_for_path(target_path(request.uri), status, code, message)
    headers = [(b"Content-Type", b"application/json"), (b"Content-Length", b"%d" % len(body))]
    if status < 500:
        channel.persistent = False
        headers.append((b"Connection", b"close"))
    request.handle_reply({"type": "http.response.start", "status": status, "headers": headers})
    request.handle_reply({"type": "http.response.body", "body": body})


def install_json_errors() -> bool:
    """Daphne answers what it refuses, and an application that failed before answering,
    with the API's error object instead of an HTML page; False (and reported) when it
    cannot.

    Daphne's ``basic_error`` answers a header name that is no token or a header value
    holding one of the control characters it refuses (``\\x0b``, ``\\x0c``,
    ``\\x1c``-``\\x1e``, ``\\x85``; Twisted refuses NUL, CR and LF) with ``400``, an
    exception in the application before its answer with ``500``; each keeps its status,
    its message is ours (``DAPHNE_ERRORS``) and the body is in OpenAI's shape under ``/v1/``."""
    request = _web_request(JSON_ERRORS)
    if request is None:
        return False
    if getattr(request, "json_errors", False):
        return True

    def basic_error(self: Any, status: int, status_text: bytes, body: str) -> None:
        code = DAPHNE_CODES.get(status, "server_error")
        answer_error(self, status, code, DAPHNE_ERRORS.get(body, body))

    request.basic_error = basic_error
    request.json_errors = True
    metrics.SERVER_HOOKS.labels(hook=JSON_ERRORS).set(1)
    return True


def install_absolute_targets() -> bool:
    """Daphne serves a request whose target is in absolute form by its path; False (and
    reported) when it cannot.

    RFC 9112 section 3.2.2 has a server take ``GET http://host:port/path?query`` as a
    request for ``/path?query`` whose host is the target's authority, whatever its
    ``Host`` header says: the header is replaced by it, so ``ALLOWED_HOSTS`` judges the
    host the target names (Django, and ``streaming.transports.hosts`` for the routes it
    does not serve), and a host it refuses there is refused as in a ``Host`` header. A
    target with no host or with user information (``http://user@host/``) is refused
    with ``400``, as RFC 9110 sections 4.2.1 and 4.2.4 ask. The request's scheme stays
    the connection's (or the proxy's ``X-Forwarded-Proto``), not the target's."""
    request = _web_request(ABSOLUTE_TARGETS)
    if request is None:
        return False
    if getattr(request, "absolute_targets", False):
        return True
    process = request.process

    def process_target(self: Any) -> Any:
        found = absolute_form(self.uri)
        if found is None:
            return process(self)
        authority, origin = found
        if not authority or b"@" in authority:
            why = "user information" if authority else "no host"
            return answer_error(self, 400, "bad_request", f"the request's target names {why}")
        self.uri = origin
        self.path = origin.split(b"?", 1)[0]
        self.requestHeaders.setRawHeaders(b"host", [authority])
        return process(self)

    request.process = process_target
    request.absolute_targets = True
    metrics.SERVER_HOOKS.labels(hook=ABSOLUTE_TARGETS).set(1)
    return True


def install_plain_http() -> bool:
    """Daphne's modules use ``twisted.web.http`` itself, not its deprecation proxy; False
    (and reported) when they cannot."""
    users = _daphne_modules(PLAIN_HTTP, DAPHNE_HTTP_USERS)
    if users is None:
        return False
    from twisted.python import deprecate
    from twisted.web import http

    proxy: Any = http
    if isinstance(proxy, deprecate._ModuleProxy):
        try:
            module = object.__getattribute__(proxy, "_module")
            deprecated = set(object.__getattribute__(proxy, "_deprecatedAttributes"))
        except AttributeError as exc:
            unavailable(PLAIN_HTTP, f"Twisted's deprecation proxy changed shape: {exc}")
            return False
        if deprecated & set(DAPHNE_HTTP_NAMES):
            unavailable(PLAIN_HTTP, f"Daphne uses deprecated names: {sorted(deprecated)}")
            return False
    else:
        module = proxy  # no proxy (a later Twisted): nothing to go around
    for user in users:
        if getattr(user, "http", None) is not proxy and getattr(user, "http", None) is not module:
            unavailable(PLAIN_HTTP, f"{user.__name__} does not name twisted.web.http as http")
            return False
    for user in users:
        user.http = module  # type: ignore[attr-defined]
    metrics.SERVER_HOOKS.labels(hook=PLAIN_HTTP).set(1)
    return True


class _Field:
    """A log field whose text (``make(*args, **options)``) is made when a line is
    formatted."""

    __slots__ = ("args", "make", "options")

    def __init__(
        self, make: Callable[..., str], args: tuple[Any, ...], options: dict[str, Any]
    ) -> None:
        self.make = make
        self.args = args
        self.options = options

    def __str__(self) -> str:
        return self.make(*self.args, **self.options)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    __repr__ = __str__


def _lazy(make: Callable[..., str]) -> Callable[..., _Field]:
    @functools.wraps(make)
    def field(*args: Any, **options: Any) -> _Field:
        return _Field(make, args, options)

    return field


def install_lazy_log_fields() -> bool:
    """Autobahn's WebSocket modules make debug-log fields only for lines written; False
    (and reported) when they cannot."""
    modules = _daphne_modules(LAZY_LOG_FIELDS, list(AUTOBAHN_LOG_FIELDS))
    if modules is None:
        return False
    protocol: Any = modules[0]
    if getattr(protocol, "lazy_log_fields", False):
        return True
    import pprint

    from autobahn import util

    originals: dict[str, Callable[..., str]] = {
        "hltype": util.hltype,
        "hlval": util.hlval,
        "pformat": pprint.pformat,
    }
    timings = getattr(protocol, "Timings", None)
    if timings is None or "__str__" not in vars(timings):
        unavailable(LAZY_LOG_FIELDS, "autobahn's Timings changed shape")
        return False
    for module in modules:
        for name in AUTOBAHN_LOG_FIELDS[module.__name__]:
            if getattr(module, name, None) is not originals[name]:
                unavailable(LAZY_LOG_FIELDS, f"{module.__name__}.{name} is not the one expected")
                return False

    # Timings' text is the one use of pformat there that is not a log field.
    def __str__(self: Any) -> str:
        return pprint.pformat(self._timings)

    timings.__str__ = __str__
    for module in modules:
        for name in AUTOBAHN_LOG_FIELDS[module.__name__]:
            setattr(module, name, _lazy(originals[name]))
    protocol.lazy_log_fields = True
    metrics.SERVER_HOOKS.labels(hook=LAZY_LOG_FIELDS).set(1)
    return True


def _websocket_protocol(hook: str, needs: Sequence[str]) -> Any | None:
    """Daphne's WebSocket protocol class when it has the attributes ``needs``, else
    None, reported as ``hook``'s absence."""
    found = _daphne_modules(hook, ["daphne.ws_protocol"])
    if found is None:
        return None
    protocol = found[0].WebSocketProtocol
    if not all(hasattr(protocol, name) for name in needs):
        unavailable(hook, "Daphne's WebSocket protocol changed shape")
        return None
    return protocol


def install_closing_sends() -> bool:
    """Daphne drops frames for a WebSocket that is closing or closed; False (and
    reported) when it cannot."""
    protocol = _websocket_protocol(CLOSING_SENDS, ("STATE_CLOSING", "STATE_CLOSED", "serverSend"))
    if protocol is None:
        return False
    if getattr(protocol, "closing_sends", False):
        return True
    server_send = protocol.serverSend
    gone = (protocol.STATE_CLOSING, protocol.STATE_CLOSED)

    def serverSend(self: Any, content: Any, binary: bool = False) -> None:
        if self.state in gone:
            return
        server_send(self, content, binary)

    protocol.serverSend = serverSend
    protocol.closing_sends = True
    metrics.SERVER_HOOKS.labels(hook=CLOSING_SENDS).set(1)
    return True


def install_close_codes() -> bool:
    """Daphne closes a WebSocket with any code RFC 6455 lets a server send; False (and
    reported) when it cannot."""
    protocol = _websocket_protocol(
        CLOSE_CODES, ("serverClose", "sendCloseFrame", "CLOSE_STATUS_CODES_ALLOWED")
    )
    if protocol is None:
        return False
    if getattr(protocol, "close_codes", False):
        return True
    if not protocol.CLOSE_STATUS_CODES_ALLOWED:
        unavailable(CLOSE_CODES, "Daphne's WebSocket protocol changed shape")
        return False
    server_close = protocol.serverClose
    # The ones ``sendClose`` refuses; 1000 and 3000-4999 keep Daphne's own path.
    codes = frozenset(
        code
        for code in protocol.CLOSE_STATUS_CODES_ALLOWED
        if isinstance(code, int) and code != 1000
    )

    def serverClose(self: Any, code: Any = None) -> None:
        if isinstance(code, int) and code in codes:
            self.sendCloseFrame(code=code, isReply=False)
            return
        server_close(self, code)

    protocol.serverClose = serverClose
    protocol.close_codes = True
    metrics.SERVER_HOOKS.labels(hook=CLOSE_CODES).set(1)
    return True


def _unsent(transport: Any) -> int:
    """``_queued``, 0 for another kind of transport."""
    try:
        return _queued(transport)
    except (AttributeError, TypeError):
        return 0


def hold_reading(transport: Any, reason: str) -> None:
    """Stop reading ``transport`` for ``reason`` (``UNSENT``, ``QUEUED``) until
    ``release_reading``; it is read again once no reason holds it and its protocol
    wants it read (its own pauses, Twisted's HTTP channel's, are kept meanwhile)."""
    holds: set[str] | None = getattr(transport, "_read_holds", None)
    if holds is None or reason in holds:
        return  # not a held kind of connection, or held for this already
    if not holds:
        _stop_reading(transport)
    holds.add(reason)


def release_reading(transport: Any, reason: str) -> None:
    holds: set[str] | None = getattr(transport, "_read_holds", None)
    if not holds or reason not in holds:
        return
    holds.discard(reason)
    if not holds and transport._wants_reading and transport.connected:
        _start_reading(transport)


_start_reading: Callable[[Any], None] = lambda transport: None  # noqa: E731
_stop_reading: Callable[[Any], None] = lambda transport: None  # noqa: E731


def install_read_holds() -> bool:
    """Twisted's TCP server connections are not read while their client leaves too
    much unread, or their application has too many of their messages waiting
    (``hold_reading``); False (and reported) when they cannot be."""
    global _start_reading, _stop_reading
    if not check_server():
        unavailable(READ_HOLDS, "the server check failed")
        return False
    from twisted.internet import tcp

    server: Any = tcp.Server
    if getattr(server, "read_holds", False):
        return True
    missing = [name for name in READ_METHODS if not hasattr(server, name)]
    if missing:
        unavailable(READ_HOLDS, f"tcp.Server lacks {', '.join(missing)}")
        return False
    _start_reading, _stop_reading = server.startReading, server.stopReading
    read, wrote = server.doRead, server.doWrite

    def startReading(self: Any) -> None:
        self._wants_reading = True
        if self._read_holds is None:
            self._read_holds = set()  # its first start: as the connection is made
        if not self._read_holds:
            _start_reading(self)

    def stopReading(self: Any) -> None:
        self._wants_reading = False
        _stop_reading(self)

    def doRead(self: Any) -> Any:
        if self._read_holds is not None and _unsent(self) > streaming_settings.SEND_BUFFER_LIMIT:
            hold_reading(self, UNSENT)
            return None
        return read(self)

    def doWrite(self: Any) -> Any:
        result = wrote(self)
        if self._read_holds and _unsent(self) <= streaming_settings.SEND_BUFFER_LIMIT // 2:
            release_reading(self, UNSENT)
        return result

    server._read_holds = None  # a set once the connection starts reading
    server._wants_reading = False
    server.startReading = startReading
    server.stopReading = stopReading
    server.doRead = doRead
    server.doWrite = doWrite
    server.read_holds = True
    metrics.SERVER_HOOKS.labels(hook=READ_HOLDS).set(1)
    return True


class ApplicationQueue:
    """One connection's ASGI messages, from Daphne (``put_nowait``) to the application
    (``await get()``), in arrival order.

    What ``asyncio.Queue`` guarantees for those two calls holds here: each message goes to
    exactly one ``get``; a waiting ``get`` that is cancelled, even after it was woken,
    takes nothing and passes the wake-up on, so no message is lost or reordered. Nothing
    else of ``asyncio.Queue`` is offered: Daphne uses nothing else, which
    ``install_application_queues`` checks in its modules' source."""

    __slots__ = ("_getters", "_items", "transport")

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._getters: list[asyncio.Future[None]] = []
        # A WebSocket's connection, not read while ``QUEUE_HOLD`` frames wait here.
        self.transport: Any = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        if self.transport is not None and len(self._items) >= QUEUE_HOLD:
            hold_reading(self.transport, QUEUED)
        self._wake_next()

    def _wake_next(self) -> None:
        getters = self._getters
        while getters:
            getter = getters.pop(0)
            if not getter.done():
                getter.set_result(None)
                return

    async def get(self) -> Any:
        items = self._items
        while not items:
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                getter.cancel()  # in case it was not woken
                with contextlib.suppress(ValueError):
                    self._getters.remove(getter)
                if items and not getter.cancelled():
                    self._wake_next()  # woken, then cancelled: the message is another's
                raise
        item = items.pop(0)
        if self.transport is not None and len(items) <= QUEUE_HOLD // 2:
            release_reading(self.transport, QUEUED)
        return item


class _AsyncioForDaphne(ModuleType):
    """``asyncio`` as Daphne's server module sees it: ``Queue`` is ``ApplicationQueue``."""

    Queue = ApplicationQueue

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)


def install_application_queues() -> bool:
    """Daphne's connections queue their messages in ``ApplicationQueue``; False (and
    reported) when they cannot."""
    found = _daphne_modules(APPLICATION_QUEUES, ["daphne.server", *DAPHNE_QUEUE_USERS])
    if found is None:
        return False
    server: Any = found[0]
    current = getattr(server, "asyncio", None)
    if isinstance(current, _AsyncioForDaphne):
        return True
    if current is not asyncio:
        unavailable(APPLICATION_QUEUES, "daphne.server does not name asyncio as asyncio")
        return False
    source = inspect.getsource(server)
    if source.count("asyncio.Queue(") != 1 or ".Queue" in source.replace("asyncio.Queue(", ""):
        unavailable(APPLICATION_QUEUES, "daphne.server uses asyncio's queues otherwise")
        return False
    for user in found[1:]:
        used = set(re.findall(r"application_queue\.(\w+)", inspect.getsource(user)))
        if not used <= {"put_nowait"}:
            unavailable(APPLICATION_QUEUES, f"{user.__name__} uses {sorted(used)} of its queue")
            return False
    server.asyncio = _AsyncioForDaphne("asyncio")
    create = server.Server.create_application

    def create_application(self: Any, protocol: Any, scope: dict[str, Any]) -> Any:
        queue = create(self, protocol, scope)
        if isinstance(queue, ApplicationQueue) and scope.get("type") == "websocket":
            queue.transport = getattr(protocol, "transport", None)
        return queue

    server.Server.create_application = create_application
    metrics.SERVER_HOOKS.labels(hook=APPLICATION_QUEUES).set(1)
    return True


_REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    413: b"Content Too Large",
    431: b"Request Header Fields Too Large",
}


# An absolute-form request target (RFC 9112 section 3.2.2): its scheme, its authority
# (up to the path, the query or a fragment) and the rest.
_ABSOLUTE_FORM = re.compile(rb"(?i)(https?)://([^/?#]*)(.*)", re.DOTALL)


def absolute_form(target: bytes) -> tuple[bytes, bytes] | None:
    """The authority and the origin-form (``/path?query``) of an absolute-form request
    target (``http://host:port/path?query``), or None for a target of another form."""
    found = _ABSOLUTE_FORM.fullmatch(target)
    if found is None:
        return None
    rest = found.group(3)
    return found.group(2), rest if rest.startswith(b"/") else b"/" + rest


def target_path(target: bytes | None) -> str:
    """The path a request target names (its query left off, an absolute-form one's path),
    for the error shape it is answered in; "" when no target is known."""
    if target is None:
        return ""
    origin = absolute_form(target)
    path = (target if origin is None else origin[1]).split(b"?", 1)[0]
    return path.decode("latin-1")


def _refusal(status: int, code: str, message: str, target: bytes | None) -> bytes:
    """A refusal written on the connection, with the error body ``target``'s path calls
    for; in the plain shape when no request line was read (``target`` None)."""
    body = error_for_path(target_path(target), status, code, message)
    head = (
        f"HTTP/1.1 {status} ".encode()
        + _REASONS[status]
        + b"\r\nContent-Type: application/json\r\nConnection: close\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    return head + body


def install_clear_refusals() -> bool:
    """A request Twisted refuses before Daphne sees it gets a status and an error body
    that say why; False (and reported) when it cannot.

    Twisted answers a header block over ``totalHeadersSize``, more than ``maxHeaders``
    headers or a request it cannot parse with a bare ``400`` and no body, and closes a
    connection whose line is over ``MAX_LENGTH`` without a word. The limits stay
    Twisted's; only the answer changes: ``431`` for the size and the count (RFC 6585),
    ``400`` otherwise, each with the API's error object, and the connection closed. The
    object is in OpenAI's shape when the request's target is under ``/v1/``
    (``error_for_path``), and in the plain one when no target is known: the request line
    was not read yet (a line over ``MAX_LENGTH``) or could not be parsed.

    An HTTP/1.1 request without a ``Host`` header is refused the same way (``400``, as
    RFC 9112 section 3.2 requires of a server): Twisted and Daphne served it, and Django
    took the host from the listening address, so ``ALLOWED_HOSTS`` never saw it.

    A body over ``MAX_REQUEST_BYTES`` is refused (``413``) when its ``Content-Length``
    says so, before a byte of it is read, or once a chunked one passes the limit:
    Twisted wrote every body to a file, and Django copied it to another, before the
    application could refuse it (a 400 MB post without credentials held 800 MB of disk
    until its 401). And a pipelined request is not served while more than
    ``STREAM_SEND_BUFFER_LIMIT`` of the responses before it wait to be read: the
    connection is closed once those are sent (each such request added a response to
    what the process holds for a client that reads none)."""
    if not check_server():
        unavailable(CLEAR_REFUSALS, "the server check failed")
        return False
    from twisted.web import http

    channel: Any = http.HTTPChannel
    if getattr(channel, "clear_refusals", False):
        return True
    missing = [name for name in CHANNEL_ATTRIBUTES if not hasattr(channel, name)]
    if missing:
        unavailable(CLEAR_REFUSALS, f"HTTPChannel lacks {', '.join(missing)}")
        return False

    def refuse(self: Any, status: int, code: str, message: str) -> None:
        # The target of the request being read (Twisted keeps it until the request is
        # whole), none while its line is not read or could not be parsed.
        target = getattr(self, "_path", None)
        self.transport.write(_refusal(status, code, message, target))
        self.loseConnection()

    def _respondToBadRequestAndDisconnect(self: Any) -> None:
        if getattr(self, "_receivedHeaderSize", 0) > self.totalHeadersSize:
            refuse(
                self,
                431,
                "headers_too_large",
                f"the request line and headers are over {self.totalHeadersSize} bytes",
            )
        elif getattr(self, "_receivedHeaderCount", 0) > self.maxHeaders:
            refuse(self, 431, "too_many_headers", f"the request has over {self.maxHeaders} headers")
        else:
            refuse(self, 400, "bad_request", "the request is not valid HTTP/1.1")

    headers_received = channel.allHeadersReceived
    content_received = channel.allContentReceived
    data_received = channel.dataReceived
    connection_lost = channel.connectionLost

    def _late(self: Any) -> None:
        self._request_deadline = None
        self._refused_request = True
        late = settings.HTTP_REQUEST_TIMEOUT
        refuse(self, 408, "request_timeout", f"the request did not arrive whole within {late:g} s")

    def _stop_deadline(self: Any) -> None:
        deadline = getattr(self, "_request_deadline", None)
        if deadline is not None:
            self._request_deadline = None
            if deadline.active():
                deadline.cancel()

    def dataReceived(self: Any, data: bytes) -> None:
        # A request's first byte starts its clock, not its first whole line: a client
        # trickling the request line held the connection for as long as the line stayed
        # under MAX_LENGTH. Bytes that arrive while a request is handled are kept by
        # Twisted and handed back here once it is answered, starting the next one's.
        idle = not getattr(self, "_handlingRequest", False)
        if data and getattr(self, "_request_deadline", None) is None and idle:
            seconds = settings.HTTP_REQUEST_TIMEOUT
            if seconds:
                self._request_deadline = self.callLater(seconds, functools.partial(_late, self))
        data_received(self, data)

    def connectionLost(self: Any, reason: Any) -> None:
        _stop_deadline(self)
        connection_lost(self, reason)

    def allHeadersReceived(self: Any) -> None:
        request = self.requests[-1]
        limit = body_limit()
        if _unsent(self.transport) > streaming_settings.SEND_BUFFER_LIMIT:
            self._refused_request = True
            self.loseConnection()  # once the responses before it are sent
        elif self._version == b"HTTP/1.1" and not request.requestHeaders.hasHeader(b"host"):
            self._refused_request = True
            refuse(self, 400, "bad_request", "an HTTP/1.1 request names its host: no Host header")
        elif limit and self.length is not None and self.length > limit:
            self._refused_request = True
            refuse(self, 413, "too_large", too_large_detail(limit))
        else:
            headers_received(self)

    def allContentReceived(self: Any) -> None:
        _stop_deadline(self)
        if getattr(self, "_refused_request", False):
            return  # refused when its headers ended; the connection is closing
        content_received(self)

    def lineLengthExceeded(self: Any, line: bytes) -> None:
        refuse(
            self,
            431,
            "headers_too_large",
            f"a line of the request is over {self.MAX_LENGTH} bytes",
        )

    request: Any = http.Request
    chunk_received = request.handleContentChunk

    def handleContentChunk(self: Any, data: bytes) -> None:
        limit = body_limit()
        self._body_bytes = getattr(self, "_body_bytes", 0) + len(data)
        if not limit or self._body_bytes <= limit:
            chunk_received(self, data)
            return
        refused = self.channel
        if refused is not None and not getattr(refused, "_refused_request", False):
            refused._refused_request = True
            refuse(refused, 413, "too_large", too_large_detail(limit))

    request.handleContentChunk = handleContentChunk
    channel._respondToBadRequestAndDisconnect = _respondToBadRequestAndDisconnect
    channel.lineLengthExceeded = lineLengthExceeded
    channel.allHeadersReceived = allHeadersReceived
    channel.allContentReceived = allContentReceived
    channel.dataReceived = dataReceived
    channel.connectionLost = connectionLost
    channel.clear_refusals = True
    metrics.SERVER_HOOKS.labels(hook=CLEAR_REFUSALS).set(1)
    return True


def stop_server() -> None:
    """Stop Daphne's reactor (after the SIGTERM drain); nothing under another server."""
    try:
        from twisted.internet import reactor
    except ImportError:
        return
    running: Any = reactor
    if running.running:
        running.callFromThread(running.stop)
