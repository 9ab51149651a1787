"""Liveness and readiness for load balancers and orchestrators.

``/healthz``: the process answers. ``/readyz``: the database, Redis (when configured) and
the engine answer; 503 names what is down, so an operator knows where to look.
"""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse

from streaming.runtime import get_runtime

CHECK_TIMEOUT = 2.0


async def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


async def _check(name: str, check: object) -> tuple[str, str | None]:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT):
            result = await check  # type: ignore[misc]
        if result is False:
            return name, "unhealthy"
        return name, None
    except Exception as exc:
        return name, f"{exc.__class__.__name__}: {exc}"[:200] or "unreachable"


async def readyz(request: HttpRequest) -> JsonResponse:
    runtime = get_runtime()
    checks = [_check("database", sync_to_async(_database)())]
    if settings.REDIS_URL:
        checks.append(_check("redis", runtime.log.ping()))
    checks.append(_check("engine", runtime.engine.health()))
    results = await asyncio.gather(*checks)
    down = {name: error for name, error in results if error is not None}
    body = {
        "status": "ok" if not down else "unavailable",
        "checks": {name: ("ok" if error is None else error) for name, error in results},
        "accepting": runtime.accepting,
    }
    if down:
        body["down"] = sorted(down)
    status = 200 if not down and runtime.accepting else 503
    return JsonResponse(body, status=status)
