"""A WebSocket spoken by hand over a plain socket, for what a client library will not do:
frames sent in one write (handled back to back by the server), or a client that never
reads."""

from __future__ import annotations

import socket


def masked_text_frame(payload: bytes) -> bytes:
    """A client's WebSocket text frame (clients mask every frame: RFC 6455 5.3)."""
    mask = b"\x01\x02\x03\x04"
    head = b"\x81"
    size = len(payload)
    if size < 126:
        head += bytes([0x80 | size])
    elif size < 65536:
        head += bytes([0x80 | 126]) + size.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + size.to_bytes(8, "big")
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def upgraded(
    port: int, token: str | None = None, receive_buffer: int | None = None
) -> socket.socket:
    """A socket to the chat WebSocket on 127.0.0.1:``port``, its handshake answered 101
    (with ``token``: as that user; ``receive_buffer``: set before it connects)."""
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(("127.0.0.1", port))
    credentials = f"Authorization: Token {token}\r\n" if token else ""
    sock.sendall(
        b"GET /ws/chat/ HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n" + f"{credentials}\r\n".encode()
    )
    assert sock.recv(4096).startswith(b"HTTP/1.1 101")
    return sock


def server_frames(data: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """The whole frames a server sent at the start of ``data`` (unmasked: RFC 6455 5.1),
    as ``(opcode, payload)``, and the bytes of a frame not whole yet."""
    frames = []
    while len(data) >= 2:
        size, start = data[1] & 0x7F, 2
        if size == 126:
            size, start = int.from_bytes(data[2:4], "big"), 4
        elif size == 127:
            size, start = int.from_bytes(data[2:10], "big"), 10
        if len(data) < start + size:
            break
        frames.append((data[0] & 0x0F, data[start : start + size]))
        data = data[start + size :]
    return frames, data
