"""Write-through for the server's TCP connections (Daphne runs on Twisted).

Twisted never sends in ``write``: it queues the bytes, registers the socket for
writability and sends when the reactor next sees it writable, then unregisters it. On
the asyncio reactor that is two ``epoll_ctl`` calls, a selector-map update and a reactor
callback for every frame of every stream - measured at about a tenth of the server's CPU
per delivered token. asyncio's own transports (and so the servers the benchmark's
baseline runs on) try the socket first and queue only what it did not take; ``install``
makes Twisted's plain TCP connections do the same.

Nothing else changes: bytes the socket did not take are queued and sent the usual way,
a failed send is left to the queued path to report (the connection is lost there), TLS
connections and connections with bytes already queued keep Twisted's behaviour, so order
is kept and ``streaming.transports.flow.SendBuffer`` still sees what is unsent.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def install() -> bool:
    """Patch Twisted's TCP server connections; False when Twisted is not the server."""
    try:
        from twisted.internet import tcp
    except ImportError:
        return False
    server: Any = tcp.Server
    if getattr(server, "write_through", False):
        return True
    queued_write = server.write

    def write(self: Any, data: bytes) -> None:
        if (
            data
            and self.connected
            and not self.disconnecting
            and not self._writeDisconnected
            and not self.TLS
            and self.offset == len(self.dataBuffer)
            and not self._tempDataLen
        ):
            sent = self.writeSomeData(data)
            if isinstance(sent, int) and sent > 0:
                if sent == len(data):
                    return
                data = data[sent:]
        queued_write(self, data)

    def write_sequence(self: Any, iovec: Iterable[bytes]) -> None:
        write(self, b"".join(iovec))

    server.write = write
    server.writeSequence = write_sequence
    server.write_through = True
    return True
