"""How many bytes a connection has queued in the server, unsent.

Daphne applies no backpressure: ``send()`` never waits and Twisted buffers without limit
for a client that stops reading. ``SendBuffer`` finds the Twisted transport behind an
ASGI ``send`` callable (Daphne passes ``partial(server.handle_reply, protocol)``; Channels'
session middleware wraps it in a bound method with ``real_send``) and reads its queue
length, so a reader can stop writing while the client is not reading and close the
connection if that lasts (the client resumes from its cursor; the log holds the rest).

Other servers: the probe answers ``None`` and only the per-connection lag budget applies.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


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


def _protocol_of(send: Any) -> Any | None:
    innermost = innermost_send(send)
    return innermost.args[0] if innermost is not None and innermost.args else None


def _transport_of(protocol: Any) -> Any | None:
    channel = getattr(protocol, "channel", None)  # twisted.web Request -> HTTPChannel
    transport = getattr(channel, "transport", None) if channel is not None else None
    if transport is None:
        transport = getattr(protocol, "transport", None)  # autobahn WebSocket protocol
    if transport is None or not hasattr(transport, "_tempDataLen"):
        return None
    return transport


class SendBuffer:
    """A probe of the connection's unsent bytes; ``pending()`` is None when unknowable."""

    def __init__(self, send: Callable[..., Any]) -> None:
        protocol = _protocol_of(send)
        self._transport = _transport_of(protocol) if protocol is not None else None

    @property
    def known(self) -> bool:
        return self._transport is not None

    def pending(self) -> int | None:
        t = self._transport
        if t is None:
            return None
        try:
            return len(t.dataBuffer) - t.offset + t._tempDataLen
        except AttributeError:
            return None
