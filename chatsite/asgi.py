"""ASGI entry point: HTTP to Django plus the SSE consumer, WebSocket behind auth rules.

The SSE consumer sits behind Channels' session/auth middleware (it checks tokens itself);
WebSocket additionally behind ``WebSocketAuthMiddleware`` (Origin and token rules).
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

# Before Django loads django-prometheus: with PROMETHEUS_MULTIPROC_DIR set (by the launcher),
# this creates the directory and drops dead processes' live gauges (docs/metrics.md).
import streaming.metrics  # noqa: F401, I001
from django.core.asgi import get_asgi_application

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import re_path  # noqa: E402

from chatsite.routing import http_urlpatterns, websocket_urlpatterns  # noqa: E402
from streaming.runtime import get_runtime  # noqa: E402
from streaming.transports.wsauth import WebSocketAuthMiddleware  # noqa: E402


class StartRuntime:
    """Start this process's background loops (reaper, heartbeat) on its first request:
    Daphne has no lifespan events."""

    def __init__(self, inner):
        self.inner = inner
        self.started = False

    async def __call__(self, scope, receive, send):
        if not self.started and scope["type"] in ("http", "websocket"):
            self.started = True
            await get_runtime().ensure_started()
        return await self.inner(scope, receive, send)


application = StartRuntime(
    ProtocolTypeRouter(
        {
            "http": URLRouter([*http_urlpatterns, re_path(r"", django_asgi_app)]),
            "websocket": WebSocketAuthMiddleware(
                AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
            ),
        }
    )
)
