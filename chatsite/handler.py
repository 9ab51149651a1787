"""Django's ASGI handler with its middleware stack and views built synchronously, and
request threads that are kept.

Django's ``ASGIHandler`` always builds an asynchronous stack: with every middleware
synchronous-only (``chatsite.middleware``) the stack runs in the request's thread, but its
innermost handler is the asynchronous ``_get_response_async``, so each request hops from
that thread back to the event loop (``async_to_sync``) only to hop into the thread again
for the view (``sync_to_async``). Every view here is synchronous (DRF, the admin, the
pages), so the stack is built synchronously and entered once: ``get_response_async``
runs the whole of ``get_response`` (middleware, URL resolution, view, exception
handling, error logging) in one call into the request's thread.

A request's thread-sensitive work (``request_started``'s receivers, that call, the
response's close with ``request_finished``) runs in one thread, as Django requires: the
database connection the view opens is the one ``request_finished`` closes. Django gets
that thread from asgiref's ``ThreadSensitiveContext``, which starts a new thread for
every request and, on its way out, another one to join it. Here a request takes a
single-thread executor that is kept for the next request (``RequestThreads``); it still
serves one request at a time, from start to end, so each request has the thread to
itself. Everything else (the body, the disconnect watch, the signals, sending and
closing the response) is Django's own.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import django
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponseBase


class RequestThreads:
    """Single-thread executors, one per request being served, kept for later requests.

    At most ``keep`` are kept idle (``REQUEST_CONCURRENCY`` bounds how many requests a
    process serves at once, so more are never needed); past that one is shut down. An
    executor whose request did not end normally (cancelled, or an error out of the
    handler) may still be running that request's call, so it is shut down, not kept.
    Used from the event loop's thread only.
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.idle: list[ThreadPoolExecutor] = []

    def take(self) -> ThreadPoolExecutor:
        if self.idle:
            return self.idle.pop()
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")

    def give(self, executor: ThreadPoolExecutor, *, clean: bool) -> None:
        if clean and len(self.idle) < self.keep:
            self.idle.append(executor)
        else:
            # Never waits: the thread ends once its last call returns.
            executor.shutdown(wait=False)


class SyncStackHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()
        self.threads = RequestThreads(settings.REQUEST_CONCURRENCY)

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = self.threads.take()
        clean = False
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
            clean = True
        finally:
            self.threads.give(executor, clean=clean)

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
