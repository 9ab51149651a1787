"""The server-rendered page: the chat page, the one view of the browser app (the API docs'
pages are the API's, ``streaming.api.docs``).

Everything else the chat page does goes through the REST API and the stream transports.
The page sets the CSRF cookie (the scripts read it for unsafe requests) and hands the
scripts the few server settings that change what they show, so the UI never guesses them.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from streaming import selectors
from streaming.conf import streaming_settings


@login_required
@ensure_csrf_cookie
async def chat(request: HttpRequest) -> HttpResponse:
    user = await request.auser()
    config = {
        "username": user.get_username(),
        # The empty state names the model, and says plainly when it is the simulator; the
        # settings offer the simulator's knobs (Developer) only when they are accepted.
        "model": selectors.engine_model(),
        "simulation": selectors.accepts_simulation(),
        # The model picker: every model an engine serves, the default one first.
        "models": [model.id for model in await selectors.engine_models()],
        "maxTokensCap": settings.MAX_TOKENS_CAP,
        "defaultMaxTokens": settings.DEFAULT_MAX_TOKENS,
        # "No tokens for N seconds" names the server's stall timeout.
        "stallTimeout": streaming_settings.STALL_TIMEOUT,
        # A WebSocket silent for longer than a few heartbeats is treated as lost.
        "pingInterval": streaming_settings.PING_INTERVAL,
    }
    nonce = secrets.token_urlsafe(16)
    context = {"config": config, "username": config["username"], "nonce": nonce}
    response = render(request, "chat/index.html", context)
    response["Content-Security-Policy"] = CHAT_PAGE_POLICY.format(nonce=nonce)
    return response


# The chat page runs its own scripts only (its two inline ones carry the request's
# nonce), talks to its own server only, and loads nothing from anywhere else: a second
# wall behind the sanitiser, should model output ever get markup past it. Inline styles
# stay allowed: KaTeX positions math with style attributes.
CHAT_PAGE_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self' 'nonce-{nonce}'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
