"""Presence within one process: the embedded default.

One process owns the in-memory state, so its local counts are the totals, and any other
worker named by a segment is a previous run of the server: dead.
"""

from __future__ import annotations

from streaming.presence.base import Presence


class MemoryPresence(Presence):
    async def publish(self, message_id: str, change: int, *, notify: bool, crossed: bool) -> None:
        if notify and self.listener.generating(message_id):
            self.listener.readers_changed(message_id, self.local.get(message_id, 0))

    async def count(self, message_id: str) -> int:
        return self.local.get(message_id, 0)

    async def beat(self) -> None:
        return None

    async def leave(self) -> None:
        return None

    async def dead(self, workers: list[str]) -> list[str]:
        return [w for w in workers if w != self.worker_id]
