"""ASGI entry point: HTTP to Django (bounded in concurrency) plus the streaming consumers,
WebSocket behind auth rules. A POST answered with its stream goes through
``OneStepAnswers``; on the message routes it tries the lean path first
(``streaming.transports.leanpost``), which hands Django whatever it cannot answer.

The streaming consumers sit behind Channels' session middleware (they resolve the user
themselves, with tokens first); the WebSocket behind ``WebSocketAuthMiddleware`` (Origin
and token rules), which runs the session middleware only where the cookie may count.
"""

import asyncio
import os
import weakref
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

# Before Django loads django-prometheus: with PROMETHEUS_MULTIPROC_DIR set (by the launcher),
# this creates the directory and drops dead processes' live gauges (docs/metrics.md).
import streaming.metrics  # noqa: F401
from chatsite.handler import get_application

django_asgi_app = get_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.urls import re_path  # noqa: E402

from chatsite import collector  # noqa: E402
from chatsite.routing import (  # noqa: E402
    http_urlpatterns,
    message_post_urlpatterns,
    websocket_urlpatterns,
)
from streaming.runtime import get_runtime  # noqa: E402
from streaming.transports import daphne, held, ws  # noqa: E402
from streaming.transports.failsafe import EndsStartedResponses  # noqa: E402
from streaming.transports.onestep import OneStepAnswers  # noqa: E402
from streaming.transports.wsauth import WebSocketAuthMiddleware  # noqa: E402

# Frames go out when written, not on the reactor's next writability pass; checks the server
# hooks and says (log line, metric) when one cannot work.
daphne.install_write_through()
# POST bodies go to the application as they came, without Twisted's form parsing.
daphne.install_raw_bodies()
# Daphne's reply path uses Twisted's HTTP module itself, not its deprecation proxy.
daphne.install_plain_http()
# Autobahn's debug-log fields (per frame, per connection) are made only for lines written.
daphne.install_lazy_log_fields()
# Frames for a WebSocket in its closing handshake are dropped, not errors.
daphne.install_closing_sends()
# A WebSocket can be closed with the codes the protocol gives a server (1001 at shutdown).
daphne.install_close_codes()
# A connection's ASGI messages wait in two lists, not an asyncio.Queue's four deques.
daphne.install_application_queues()
# A request Twisted refuses (headers over 16 KiB, a line it cannot parse, a body over
# MAX_REQUEST_BYTES) is told why, before its body is read.
daphne.install_clear_refusals()
# What Daphne refuses itself (a header value it disallows), and an application failing
# before it answered, get the error object instead of an HTML page.
daphne.install_json_errors()
# A request naming its target as a whole URL is served by its path, for the host it names.
daphne.install_absolute_targets()
# A connection is not read while its client leaves replies unread or its frames queue up.
daphne.install_read_holds()
# After the SIGTERM drain, every WebSocket is closed with 1001, then the server stops.
get_runtime().lifecycle.on_drained.append(ws.close_sockets)
# A user's revoked tokens (or a changed user) have their open WebSockets and HTTP
# streams checked again.
get_runtime().on_revoked.append(ws.sockets.revoked)
get_runtime().on_revoked.append(held.streams.revoked)
get_runtime().lifecycle.on_stopped.append(daphne.stop_server)


class StartRuntime:
    """Start this process's background loops (reaper, heartbeat) on its first request:
    Daphne has no lifespan events. Every request awaits the start, so nothing is served
    by a process whose runtime is not running."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.started = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if not self.started and scope["type"] in ("http", "websocket"):
            await get_runtime().ensure_started()
            self.started = True
        return await self.inner(scope, receive, send)


class Bounded:
    """At most ``settings.REQUEST_CONCURRENCY`` requests inside ``inner`` at once; the rest
    wait as coroutines, in arrival order."""

    def __init__(self, inner: Any, limit: int) -> None:
        self.inner = inner
        self.limit = limit
        # event loop -> its semaphore (tests run several loops)
        self.gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        loop = asyncio.get_running_loop()
        gate = self.gates.get(loop)
        if gate is None:
            gate = self.gates[loop] = asyncio.Semaphore(self.limit)
        async with gate:
            return await self.inner(scope, receive, send)


django_app = Bounded(django_asgi_app, settings.REQUEST_CONCURRENCY)

application = StartRuntime(
    ProtocolTypeRouter(
        {
            # An exception after a response started must not reach Daphne (failsafe).
            "http": EndsStartedResponses(
                URLRouter(
                    [
                        *http_urlpatterns,
                        *message_post_urlpatterns(OneStepAnswers(django_app, lean=True)),
                        re_path(r"", OneStepAnswers(django_app)),
                    ]
                )
            ),
            "websocket": WebSocketAuthMiddleware(URLRouter(websocket_urlpatterns)),
        }
    )
)

# Everything alive now lives as long as the process: out of the collector's way.
collector.tune(settings.GC_THRESHOLD)
