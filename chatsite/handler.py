"""Django's ASGI handler with its middleware stack and views built synchronously.

Django's ``ASGIHandler`` always builds an asynchronous stack: with every middleware
synchronous-only (``chatsite.middleware``) the stack runs in the request's thread, but its
innermost handler is the asynchronous ``_get_response_async``, so each request hops from
that thread back to the event loop (``async_to_sync``) only to hop into the thread again
for the view (``sync_to_async``). Every view here is synchronous (DRF, the admin, the
pages), so the stack is built synchronously and entered once: ``get_response_async``
runs the whole of ``get_response`` (middleware, URL resolution, view, exception
handling, error logging) in one call into the request's thread. Everything else (the
request's thread-sensitive context, its body, the disconnect watch, the signals, sending
and closing the response) is Django's own.
"""

from __future__ import annotations

from typing import Any

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponseBase


class SyncStackHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        # Thread-sensitive: the thread of this request's context, where its database
        # connection is opened and (by ``request_finished``) closed.
        response: HttpResponseBase = await sync_to_async(self.get_response, thread_sensitive=True)(
            request
        )
        return response


def get_application() -> Any:
    """``django.core.asgi.get_asgi_application`` with this handler."""
    django.setup(set_prefix=False)
    return SyncStackHandler()
