"""Finalise answers whose generating process died (the serving processes also do this
periodically; this runs one pass on demand, e.g. after a crash). Unlike the periodic
reaper it does not wait a second heartbeat timeout: run it when you know the process is
gone, not right after a Redis restart."""

from __future__ import annotations

import asyncio
from typing import Any

from django.core.management.base import BaseCommand

from streaming.runtime import Runtime


class Command(BaseCommand):
    help = "Mark segments of dead processes as interrupted, rebuilding their text from the log."

    def handle(self, *args: Any, **options: Any) -> None:
        async def once() -> int:
            runtime = Runtime()
            try:
                return await runtime.reaper.reap(confirm=False)
            finally:
                await runtime.close()

        count = asyncio.run(once())
        self.stdout.write(f"reaped {count} segment(s)")
