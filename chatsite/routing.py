"""Channels routes: the streaming consumers. Everything else is Django's URLconf.

The SSE consumer gets the session user from Channels' auth middleware (it also accepts
tokens itself); WebSocket rules are applied in chatsite.asgi. The OpenAI-compatible
endpoint takes Bearer tokens only, so it has no session (and needs no CSRF check)."""

from channels.auth import AuthMiddlewareStack
from django.urls import path

from streaming.api.openai import ChatCompletionsConsumer, ModelsConsumer
from streaming.transports.sse import MessageStreamConsumer
from streaming.transports.ws import ChatConsumer

http_urlpatterns = [
    path(
        "api/messages/<uuid:message_id>/stream/",
        AuthMiddlewareStack(MessageStreamConsumer.as_asgi()),
    ),
    path("v1/chat/completions", ChatCompletionsConsumer.as_asgi()),
    path("v1/models", ModelsConsumer.as_asgi()),
]

websocket_urlpatterns = [
    path("ws/chat/", ChatConsumer.as_asgi()),
]
