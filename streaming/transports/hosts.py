"""The ``Host`` check Django makes of every request it serves (``ALLOWED_HOSTS``), for the
routes it never sees: the SSE stream, the OpenAI-compatible endpoint and the WebSocket
handshake are Channels consumers, routed before Django. Without it a request naming any
host would be served there while the REST API refuses it (a DNS-rebinding page reaches
the server under a name of its own)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http.request import split_domain_port, validate_host

from streaming.auth import header

# What the refused request is told (400, as Django answers a disallowed host).
REFUSED = "the Host header names no host this server answers for (ALLOWED_HOSTS)"


def allowed_host(scope: dict[str, Any]) -> str | None:
    """The request's ``Host`` when ``ALLOWED_HOSTS`` admits it (as Django's
    ``HttpRequest.get_host`` decides, its debug defaults included), else None."""
    host = header(scope, b"host")
    if host is None:
        # No Host (HTTP/1.0): the address served, as Django takes its SERVER_NAME. An
        # empty one is refused, as Django refuses it.
        server = scope.get("server")
        if not server or server[0] is None:
            return None
        host = f"{server[0]}:{server[1]}"
    domain, _port = split_domain_port(host)
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return host if domain and validate_host(domain, allowed) else None
