"""The server-rendered pages: the chat page (the one view of the browser app) and the API
docs (Swagger UI and ReDoc, from drf-spectacular-sidecar's static files).

Everything else the chat page does goes through the REST API and the stream transports.
The page sets the CSRF cookie (the scripts read it for unsafe requests) and hands the
scripts the few server settings that change what they show, so the UI never guesses them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerView

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


# Everything from this server, nothing from anywhere else: inline scripts and styles are
# the docs pages' own, ``blob:`` is ReDoc's search worker.
OWN_ORIGIN_ONLY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self' 'unsafe-inline' blob:",
        "worker-src 'self' blob:",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self' data:",
    ]
)


def own_origin_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The view's page may load nothing from outside the server (Content-Security-Policy):
    ReDoc's bundle shows a logo from a CDN, which the browser then never asks for."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        response["Content-Security-Policy"] = OWN_ORIGIN_ONLY
        return response

    return wrapped


api_docs = own_origin_only(SpectacularSwaggerView.as_view(url_name="schema"))
# drf-spectacular's ReDoc page without its Google Fonts link.
api_redoc = own_origin_only(
    SpectacularRedocView.as_view(url_name="schema", template_name="api/redoc.html")
)
