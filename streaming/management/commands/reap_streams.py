"""Finalise answers whose generating process died (the serving processes also do this
periodically; this runs one pass on demand, e.g. from cron or after a crash)."""

from __future__ import annotations

import asyncio
from typing import Any

from django.core.management.base import BaseCommand

from streaming.reaper import reap
from streaming.runtime import get_runtime


class Command(BaseCommand):
    help = "Mark segments of dead processes as interrupted, rebuilding their text from the log."

    def handle(self, *args: Any, **options: Any) -> None:
        async def once() -> int:
            runtime = get_runtime()
            try:
                return await reap(runtime)
            finally:
                await runtime.log.close()

        count = asyncio.run(once())
        self.stdout.write(f"reaped {count} segment(s)")
