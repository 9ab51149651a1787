"""The API's description: the OpenAPI document and the two pages that show it (Swagger UI
and ReDoc, from drf-spectacular-sidecar's static files).

Their answers are a YAML or JSON document and HTML pages, but everything else they answer
(an error, ``OPTIONS``' description of the view) is the API's JSON, as every answer under
``/api/`` is (``JSONAsides``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView


class JSONAsides(APIView):
    """A view whose answer is a document or a page, rendered as the client asked for it,
    and whose other answers (its errors, ``OPTIONS``) are JSON: rendered as the page is,
    an error became a page of its own (``text/html`` or YAML), and the Swagger UI view,
    which has no template for anything but its page, answered ``OPTIONS`` with a 500."""

    def handle_exception(self, exc: Exception) -> Response:
        return self._as_json(super().handle_exception(exc))

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        if request.method == "OPTIONS":
            return JSONRenderer(), JSONRenderer.media_type
        return super().perform_content_negotiation(request, force)

    def _as_json(self, response: Response) -> Response:
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = JSONRenderer.media_type
        return response


class SchemaView(JSONAsides, SpectacularAPIView):
    """The OpenAPI document, in the format asked for (YAML by default, JSON with
    ``?format=json``); its errors (a format it does not have, a POST) in the API's JSON
    shape."""


class SwaggerView(JSONAsides, SpectacularSwaggerView):
    """Swagger UI of the document at ``url_name``."""


class RedocView(JSONAsides, SpectacularRedocView):
    """ReDoc of the document at ``url_name``."""


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


schema = SchemaView.as_view()
swagger = own_origin_only(SwaggerView.as_view(url_name="schema"))
# drf-spectacular's ReDoc page without its Google Fonts link.
redoc = own_origin_only(RedocView.as_view(url_name="schema", template_name="api/redoc.html"))
