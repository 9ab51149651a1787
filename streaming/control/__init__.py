"""Control messages between serving processes: cancel, readers changed.

One interface (``base.Control``), two backends (``memory``: one process; ``redis``:
pub/sub on a connection of its own), chosen by ``STREAMING["CONTROL"]``. Control never
shares a path with data or with other consumers: tokens never travel here, and no
consumer's receive can hold a Stop back.
"""

from __future__ import annotations

from streaming.conf import build_backend, streaming_settings
from streaming.control.base import Control, Handler


def build_control() -> Control:
    """A new control client for this process; the runtime owns one."""
    control: Control = build_backend(streaming_settings.CONTROL)
    return control


__all__ = ["Control", "Handler", "build_control"]
