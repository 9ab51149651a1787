"""A TCP proxy that a test can cut and restore, to make a server unreachable for a while.

It runs its own event loop in a thread. ``cut()`` closes every relayed connection and the
listening socket (new connections are refused, as with a host that went away);
``restore()`` listens again on the same port. ``freeze()`` keeps every connection open and
accepts new ones but relays nothing, as a proxy or host that stopped without closing its
sockets; ``hold_replies(after)`` relays what clients send but none of the answers, once
a client has sent ``after``, as a network that loses them from then on (``given_up`` is
set once a client closes its connection meanwhile); ``thaw()`` relays again what was held.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.connections_seen = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        # Whether what clients send, and what the target answers, is relayed now.
        self._sending = asyncio.Event()
        self._answering = asyncio.Event()
        self._sending.set()
        self._answering.set()
        self._hold_after: bytes | None = None
        self.given_up = threading.Event()

    def start(self) -> TcpProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def cut(self) -> None:
        self._call(self._cut())

    def restore(self) -> None:
        self._call(self._listen())

    def freeze(self) -> None:
        self._loop.call_soon_threadsafe(self._sending.clear)
        self._loop.call_soon_threadsafe(self._answering.clear)

    def hold_replies(self, after: bytes) -> None:
        def hold() -> None:
            self._hold_after = after

        self._loop.call_soon_threadsafe(hold)

    def thaw(self) -> None:
        def thaw() -> None:
            self._hold_after = None
            self._sending.set()
            self._answering.set()

        self._loop.call_soon_threadsafe(thaw)

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._call(self._cut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def _call(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)  # type: ignore[arg-type]

    async def _listen(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        self._server = await asyncio.start_server(self._relay, sock=sock)

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._writers.clear()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_seen += 1
        await self._sending.wait()
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer, self._sending, sent=True),
                self._pipe(up_reader, writer, self._answering),
                return_exceptions=True,
            )
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        flowing: asyncio.Event,
        *,
        sent: bool = False,
    ) -> None:
        while data := await reader.read(65536):
            await flowing.wait()
            writer.write(data)
            if sent and self._hold_after is not None and self._hold_after in data:
                self._answering.clear()
            await writer.drain()
        if sent and not self._answering.is_set():
            self.given_up.set()
        writer.transport.abort()
