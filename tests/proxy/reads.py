"""An SSE stream read off a raw socket, recording which network read brought each event.

A buffering proxy and a streaming one deliver the same bytes; only *when* they arrive
differs. Counting reads tells them apart without timing anything: through a streaming
proxy the deltas come in many reads before the one that brings ``done``; through a
buffering one they all come in that last read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

READ_SIZE = 65536


@dataclass
class Arrival:
    read: int
    event: str
    data: dict[str, Any]
    id: str | None


@dataclass
class Recording:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    events: list[Arrival] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    reads: int = 0
    complete: bool = False  # the response ended properly (the final chunk arrived)

    @property
    def datas(self) -> list[dict[str, Any]]:
        return [a.data for a in self.events]

    def done_read(self) -> int | None:
        return next((a.read for a in self.events if a.event == "done"), None)

    def delta_reads_before_done(self) -> set[int]:
        """The distinct reads that brought deltas before the read that brought ``done``."""
        last = self.done_read()
        return {
            a.read for a in self.events if a.event == "delta" and (last is None or a.read < last)
        }


class Dechunker:
    """HTTP/1.1 chunked transfer decoding, fed as bytes arrive."""

    def __init__(self) -> None:
        self.buffer = b""
        self.left = 0  # bytes of the current chunk still to come
        self.trailer = False  # a chunk's closing CRLF is still to come
        self.finished = False

    def feed(self, data: bytes) -> bytes:
        self.buffer += data
        out = bytearray()
        while not self.finished:
            if self.left:
                piece = self.buffer[: self.left]
                out += piece
                self.buffer = self.buffer[len(piece) :]
                self.left -= len(piece)
                if self.left:
                    break
                self.trailer = True
            if self.trailer:
                if len(self.buffer) < 2:
                    break
                self.buffer = self.buffer[2:]
                self.trailer = False
            end = self.buffer.find(b"\r\n")
            if end < 0:
                break
            size = int(self.buffer[:end].split(b";")[0], 16)
            self.buffer = self.buffer[end + 2 :]
            if size == 0:
                self.finished = True
            self.left = size
        return bytes(out)


class EventParser:
    """SSE blocks (separated by a blank line) out of body bytes."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self.buffer = b""

    def feed(self, data: bytes, read: int) -> None:
        self.buffer += data
        while b"\n\n" in self.buffer:
            block, self.buffer = self.buffer.split(b"\n\n", 1)
            self.block(block.decode(), read)

    def block(self, block: str, read: int) -> None:
        name, event_id, data = "message", None, []
        for line in block.split("\n"):
            if line.startswith(":"):
                self.recording.comments.append(line)
                continue
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "event":
                name = value
            elif key == "id":
                event_id = value
            elif key == "data":
                data.append(value)
        if data:
            payload = json.loads("\n".join(data))
            self.recording.events.append(Arrival(read, name, payload, event_id))


async def record_sse(
    port: int, path: str, headers: dict[str, str], *, stop_after: int | None = None
) -> Recording:
    """GET ``path`` on 127.0.0.1:``port`` and read the stream to its end (or ``stop_after``
    events, then hang up), like a browser would: HTTP/1.1, gzip accepted."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Accept: text/event-stream",
        "Accept-Encoding: gzip, deflate",
        "Connection: close",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    recording = Recording()
    parser = EventParser(recording)
    try:
        head = b""
        while b"\r\n\r\n" not in head:
            data = await reader.read(READ_SIZE)
            if not data:
                return recording
            recording.reads += 1
            head += data
        head, body = head.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        recording.status = int(status_line.split()[1])
        for line in header_lines:
            name, _, value = line.partition(":")
            recording.headers[name.strip().lower()] = value.strip()
        chunked = recording.headers.get("transfer-encoding", "").lower() == "chunked"
        dechunker = Dechunker()
        while True:
            if body:
                parser.feed(dechunker.feed(body) if chunked else body, recording.reads)
            if chunked and dechunker.finished:
                recording.complete = True
                break
            if stop_after is not None and len(recording.events) >= stop_after:
                break
            body = await reader.read(READ_SIZE)
            if not body:
                recording.complete = not chunked
                break
            recording.reads += 1
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return recording
