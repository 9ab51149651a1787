"""Liveness and readiness for load balancers and orchestrators.

``/healthz``: the process answers (restart it if not). ``/readyz``: the database, Redis
(when configured) and the engine answer within ``CHECK_TIMEOUT`` and the process is not
draining after SIGTERM (send it no new streams if not). A 503 names what is down in
``down`` and says why in ``checks``, so an operator knows where to look. Both are cheap,
unauthenticated and never cached; they reveal no data, only which dependency failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse

from streaming import selectors

CHECK_TIMEOUT = 2.0
OK = "ok"

# While the database is away a check can block for the connection pool's whole timeout.
# So it runs in a daemon thread of its own, one at a time: probes every few seconds never
# tie up the threads that serve requests, and a blocked check never delays shutdown. A
# probe that comes while a check runs waits for that check's answer (``_database``).
_database_check: asyncio.Future[None] | None = None


def _answer(body: dict[str, object], status: int) -> JsonResponse:
    response = JsonResponse(body, status=status)
    response["Cache-Control"] = "no-store"
    return response


async def healthz(request: HttpRequest) -> JsonResponse:
    return _answer({"status": OK}, 200)


def _select_one() -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        connection.close()  # back to the pool; never keep a connection that may break


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _start_database_check(loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
    answered: asyncio.Future[None] = loop.create_future()
    # Its error is read even when every probe waiting for it gave up first.
    answered.add_done_callback(lambda done: done.cancelled() or done.exception())

    def probe() -> None:
        error: BaseException | None = None
        try:
            _select_one()
        except Exception as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown)
            loop.call_soon_threadsafe(_settle, answered, error)

    threading.Thread(target=probe, name="readyz-database", daemon=True).start()
    return answered


async def _database() -> None:
    """The database's answer to ``SELECT 1``: the check running now, else a new one.
    Probes overlap (the load balancer's, every open chat page's), and one that came while
    a check ran was told the database was down; each probe waits for the answer within
    its own timeout, which leaves the check running for the next probe (``shield``)."""
    global _database_check
    loop = asyncio.get_running_loop()
    check = _database_check
    if check is None or check.done() or check.get_loop() is not loop:
        check = _database_check = _start_database_check(loop)
    await asyncio.shield(check)


async def _engine() -> None:
    if not await selectors.engine_healthy():
        raise ConnectionError("the engine's health check did not answer 200")


async def _check(check: Awaitable[object]) -> str:
    """``ok``, or why not: the exception's class and message, short."""
    try:
        async with asyncio.timeout(CHECK_TIMEOUT):
            await check
    except TimeoutError:
        return f"no answer within {CHECK_TIMEOUT:g} s"
    except Exception as exc:
        return f"{exc.__class__.__name__}: {exc}"[:200]
    return OK


async def readyz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, Awaitable[object]] = {
        "database": _database(),
        "engine": _engine(),
    }
    if settings.REDIS_URL:
        checks["redis"] = selectors.ping_backends()
    results = dict(zip(checks, await asyncio.gather(*map(_check, checks.values())), strict=True))
    if not selectors.accepting():
        results["process"] = "draining after SIGTERM"
    down = sorted(name for name, result in results.items() if result != OK)
    body: dict[str, object] = {"status": "unavailable" if down else OK, "checks": results}
    if down:
        body["down"] = down
    return _answer(body, 503 if down else 200)
