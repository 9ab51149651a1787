"""The chat page: the one server-rendered view of the browser app.

Everything else the page does goes through the REST API and the stream transports. The
page sets the CSRF cookie (the scripts read it for unsafe requests) and hands the scripts
the few server settings that change what they show, so the UI never guesses them.
"""

from __future__ import annotations

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
        # The generation settings panel offers simulator knobs only when they are accepted.
        "simulation": selectors.accepts_simulation(),
        "maxTokensCap": settings.MAX_TOKENS_CAP,
        "defaultMaxTokens": settings.DEFAULT_MAX_TOKENS,
        # "No tokens for N seconds" names the server's stall timeout.
        "stallTimeout": streaming_settings.STALL_TIMEOUT,
        # A WebSocket silent for longer than a few heartbeats is treated as lost.
        "pingInterval": streaming_settings.PING_INTERVAL,
    }
    return render(request, "chat/index.html", {"config": config, "username": config["username"]})
