"""Channels routes: the streaming consumers. Everything else is Django's URLconf.

The SSE consumer gets the session from Channels' session middleware and resolves the user
itself (tokens first); WebSocket rules are applied in chatsite.asgi. The OpenAI-compatible
endpoint takes Bearer tokens only, so it has no session (and needs no CSRF check)."""

from typing import Any

from channels.sessions import SessionMiddlewareStack
from django.urls import URLPattern, path, re_path

from streaming.api.openai import ChatCompletionsConsumer, ModelsConsumer
from streaming.transports.sse import MessageStreamConsumer
from streaming.transports.ws import ChatConsumer, no_such_socket

http_urlpatterns = [
    path(
        "api/messages/<uuid:message_id>/stream/",
        SessionMiddlewareStack(MessageStreamConsumer.as_asgi()),
    ),
    path("v1/chat/completions", ChatCompletionsConsumer.as_asgi()),
    path("v1/models", ModelsConsumer.as_asgi()),
    path("v1/models/<path:model>", ModelsConsumer.as_asgi()),
]
# As a URLconf (``CHANNELS_URLCONF``): what a URL without its slash is checked against.
urlpatterns = http_urlpatterns


def message_post_urlpatterns(app: Any) -> list[URLPattern]:
    """The REST API's message posts (``streaming.urls``), routed to ``app`` first: a
    one-step post tries the lean path there (``streaming.transports.leanpost``)."""
    return [
        path("api/conversations/<uuid:conversation_id>/messages/", app),
        path("api/messages/", app),
    ]


websocket_urlpatterns = [
    path("ws/chat/", ChatConsumer.as_asgi()),
    re_path(r"", no_such_socket),  # type: ignore[arg-type]  # an ASGI app, as Channels routes
]
