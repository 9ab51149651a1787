"""Lean stream clients on raw asyncio streams: SSE over HTTP/1.1 and WebSocket.

The load generator shares two cores with the servers it measures, so its clients do the
least work that still reads every byte: no HTTP library, no per-frame objects beyond the
decoded event, one clock reading per socket read (every event in that read was received
at that moment). Both speak just enough of their protocol for our servers: HTTP/1.1 with
``Content-Length`` or chunked bodies; unfragmented, uncompressed WebSocket text frames.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

READ_SIZE = 65536


class ProtocolError(Exception):
    pass


class HttpError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status = status
        self.body = body


class Http:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str):
        self.reader = reader
        self.writer = writer
        self.host = host

    @classmethod
    async def open(cls, host: str, port: int, rcvbuf: int | None = None) -> Http:
        if rcvbuf is None:
            reader, writer = await asyncio.open_connection(host, port, limit=1 << 22)
        else:
            import socket

            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
            reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 22)
        return cls(reader, writer, f"{host}:{port}")

    def close(self) -> None:
        self.writer.transport.abort()

    def send(self, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> None:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body or method == "POST":
            lines.append(f"Content-Length: {len(body)}")
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    async def head(self) -> tuple[int, dict[str, str]]:
        raw = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = raw.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        headers = {}
        for line in header_lines:
            if line:
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip()
        return status, headers

    async def json(self, method: str, path: str, token: str, payload: Any = None) -> Any:
        body = b"" if payload is None else json.dumps(payload).encode()
        headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
        self.send(method, path, headers, body)
        status, head = await self.head()
        length = int(head.get("content-length", "0"))
        data = await self.reader.readexactly(length) if length else b""
        if status >= 300:
            raise HttpError(status, data)
        return json.loads(data) if data else None

    async def body(self, head: dict[str, str]) -> AsyncIterator[tuple[bytes, float]]:
        """The body as it arrives, with the wall-clock time each piece was read."""
        reader = self.reader
        if head.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    return
                data = await reader.readexactly(size + 2)
                yield data[:-2], time.time()
        elif "content-length" in head:
            left = int(head["content-length"])
            while left > 0:
                data = await reader.read(min(left, READ_SIZE))
                if not data:
                    raise ProtocolError("connection closed inside the body")
                left -= len(data)
                yield data, time.time()
        else:
            while data := await reader.read(READ_SIZE):
                yield data, time.time()


def sse_events(buffer: bytearray, data: bytes) -> list[dict[str, Any]]:
    """Append ``data`` and pop every complete SSE event's JSON payload (comments skipped)."""
    buffer += data
    end = buffer.rfind(b"\n\n")
    if end < 0:
        return []
    complete = bytes(buffer[: end + 2])
    del buffer[: end + 2]
    out = []
    for block in complete.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data:"):
                out.append(json.loads(line[5:]))
    return out


class WebSocket:
    """A client WebSocket: masked text frames out, unmasked frames in."""

    def __init__(self, http: Http) -> None:
        self.http = http
        self.buffer = bytearray()
        # Frames decoded but not consumed by the last reader (read after its last frame).
        self.pending: list[dict[str, Any]] = []
        self.closed_code: int | None = None

    @classmethod
    async def open(cls, host: str, port: int, path: str, token: str) -> WebSocket:
        http = await Http.open(host, port)
        key = base64.b64encode(os.urandom(16)).decode()
        http.send(
            "GET",
            path,
            {
                "Upgrade": "websocket",
                "Connection": "Upgrade",
                "Sec-WebSocket-Key": key,
                "Sec-WebSocket-Version": "13",
                "Authorization": f"Token {token}",
            },
        )
        status, _ = await http.head()
        if status != 101:
            raise HttpError(status, b"websocket handshake refused")
        return cls(http)

    def send_json(self, payload: Any) -> None:
        data = json.dumps(payload).encode()
        mask = os.urandom(4)
        size = len(data)
        if size < 126:
            header = struct.pack("!BB", 0x81, 0x80 | size)
        elif size < 65536:
            header = struct.pack("!BBH", 0x81, 0x80 | 126, size)
        else:
            header = struct.pack("!BBQ", 0x81, 0x80 | 127, size)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.http.writer.write(header + mask + masked)

    async def frames(self) -> AsyncIterator[tuple[list[dict[str, Any]], float]]:
        """Batches of decoded text frames, with the time their bytes were read."""
        reader = self.http.reader
        buf = self.buffer
        if self.pending:
            pending, self.pending = self.pending, []
            yield pending, time.time()
        while True:
            data = await reader.read(READ_SIZE)
            if not data:
                return
            now = time.time()
            buf += data
            out = []
            while len(buf) >= 2:
                opcode = buf[0] & 0x0F
                size = buf[1] & 0x7F
                offset = 2
                if size == 126:
                    if len(buf) < 4:
                        break
                    size = struct.unpack_from("!H", buf, 2)[0]
                    offset = 4
                elif size == 127:
                    if len(buf) < 10:
                        break
                    size = struct.unpack_from("!Q", buf, 2)[0]
                    offset = 10
                if len(buf) < offset + size:
                    break
                payload = bytes(buf[offset : offset + size])
                del buf[: offset + size]
                if opcode == 0x1:
                    out.append(json.loads(payload))
                elif opcode == 0x8:
                    self.closed_code = struct.unpack("!H", payload[:2])[0] if payload else 1005
                    if out:
                        yield out, now
                    return
                elif opcode == 0x9:
                    self._pong(payload)
            if out:
                yield out, now

    def _pong(self, payload: bytes) -> None:
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.http.writer.write(struct.pack("!BB", 0x8A, 0x80 | len(payload)) + mask + masked)

    def close(self) -> None:
        self.http.close()
