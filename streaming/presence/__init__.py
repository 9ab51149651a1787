"""Who is reading which message, and which serving processes are alive, across processes.

One interface (``base.Presence``), two backends (``memory``: one process; ``redis``:
several), chosen by ``STREAMING["PRESENCE"]`` like the stream log.
"""

from __future__ import annotations

from streaming.conf import build_backend, streaming_settings
from streaming.presence.base import Presence, ReadersListener


def build_presence(worker_id: str, listener: ReadersListener) -> Presence:
    """A new presence client for this process; the runtime owns one."""
    presence: Presence = build_backend(
        streaming_settings.PRESENCE, worker_id=worker_id, listener=listener
    )
    return presence


__all__ = ["Presence", "ReadersListener", "build_presence"]
