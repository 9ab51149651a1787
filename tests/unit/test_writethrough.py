"""Write-through on Twisted's TCP server connections, over a real socket pair.

The reactor here only records which sockets the connection asks to watch: that request
is exactly what write-through avoids, and what must still happen for bytes the socket
did not take.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from twisted.internet import tcp
from twisted.internet.protocol import Protocol

from streaming.transports import writethrough


class RecordingReactor:
    def __init__(self) -> None:
        self.writers: set[object] = set()

    def addReader(self, fd: object) -> None: ...  # Twisted names these

    def removeReader(self, fd: object) -> None: ...

    def addWriter(self, fd: object) -> None:
        self.writers.add(fd)

    def removeWriter(self, fd: object) -> None:
        self.writers.discard(fd)

    def callLater(self, *args: object) -> None: ...


@pytest.fixture
def pair() -> Iterator[tuple[tcp.Server, socket.socket, RecordingReactor]]:
    assert writethrough.install()
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reactor = RecordingReactor()
    protocol = Protocol()
    connection = tcp.Server(ours, protocol, ("127.0.0.1", 1), None, 1, reactor)
    protocol.makeConnection(connection)
    yield connection, peer, reactor
    ours.close()
    peer.close()


def receive(peer: socket.socket, size: int) -> bytes:
    got = b""
    while len(got) < size:
        chunk = peer.recv(size - len(got))
        assert chunk, "peer closed"
        got += chunk
    return got


def test_a_frame_is_sent_at_once_without_watching_the_socket(pair) -> None:
    connection, peer, reactor = pair
    frame = b"id: 1\nevent: delta\ndata: {}\n\n"
    connection.write(frame)
    connection.writeSequence([b"5\r\n", b"hello", b"\r\n"])
    assert reactor.writers == set()
    expected = frame + b"5\r\nhello\r\n"
    assert receive(peer, len(expected)) == expected


def test_what_the_socket_does_not_take_is_queued_in_order(pair) -> None:
    connection, peer, reactor = pair
    frames = [bytes([65 + i % 26]) * 50_000 for i in range(8)]
    for frame in frames:
        connection.write(frame)
    # The socket took part of the first frame; the rest waits for writability, in order.
    assert reactor.writers == {connection}
    unsent = len(connection.dataBuffer) - connection.offset + connection._tempDataLen
    assert 0 < unsent < sum(map(len, frames))
    expected = b"".join(frames)
    got = b""
    while len(got) < len(expected):
        got += peer.recv(65536)
        connection.doWrite()
    assert got == expected
    assert reactor.writers == set()
    # Drained: the next frame goes straight out again.
    connection.write(b"tail")
    assert reactor.writers == set()
    assert receive(peer, 4) == b"tail"
