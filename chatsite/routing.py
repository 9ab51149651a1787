"""Channels routes: the streaming consumers. Everything else is Django's URLconf.

The SSE consumer gets the session from Channels' session middleware and resolves the user
itself (tokens first); WebSocket rules are applied in chatsite.asgi. The OpenAI-compatible
endpoint takes Bearer tokens only, so it has no session (and needs no CSRF check)."""

from channels.sessions import SessionMiddlewareStack
from django.urls import path

from streaming.api.openai import ChatCompletionsConsumer, ModelsConsumer
from streaming.transports.sse import MessageStreamConsumer
from streaming.transports.ws import ChatConsumer

http_urlpatterns = [
    path(
        "api/messages/<uuid:message_id>/stream/",
        SessionMiddlewareStack(MessageStreamConsumer.as_asgi()),
    ),
    path("v1/chat/completions", ChatCompletionsConsumer.as_asgi()),
    path("v1/models", ModelsConsumer.as_asgi()),
    path("v1/models/<path:model>", ModelsConsumer.as_asgi()),
]

websocket_urlpatterns = [
    path("ws/chat/", ChatConsumer.as_asgi()),
]
