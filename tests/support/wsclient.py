"""A WebSocket test client speaking the chat protocol (``websockets`` over a real socket)."""

from __future__ import annotations

import json
from typing import Any

import websockets


class ChatSocket:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    @classmethod
    async def connect(
        cls,
        ws_url: str,
        token: str | None = None,
        origin: str | None = None,
        headers: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> ChatSocket:
        headers = {**(headers or {}), **({"Authorization": f"Token {token}"} if token else {})}
        conn = await websockets.connect(
            f"{ws_url}/ws/chat/", additional_headers=headers, origin=origin, **kwargs
        )
        return cls(conn)

    async def send(self, frame: dict[str, Any]) -> None:
        await self.conn.send(json.dumps(frame))

    async def recv(self) -> dict[str, Any]:
        return json.loads(await self.conn.recv())

    async def create(
        self, conversation: str, content: str, params: dict[str, Any], **extra: Any
    ) -> list[dict[str, Any]]:
        """Send ``message.create``; the frames up to ``message.created`` (its id is last)."""
        await self.send(
            {
                "type": "message.create",
                "conversation": conversation,
                "content": content,
                "params": params,
                **extra,
            }
        )
        return await self.recv_until("message.created")

    async def recv_until(self, kind: str, message_id: str | None = None) -> list[dict[str, Any]]:
        """Frames up to and including the first of ``kind`` (for ``message_id``)."""
        frames = []
        while True:
            frame = await self.recv()
            frames.append(frame)
            if frame.get("type") == kind and (
                message_id is None or frame.get("message_id") == message_id
            ):
                return frames

    async def events_until_done(self, message_id: str) -> list[dict[str, Any]]:
        frames = await self.recv_until("done", message_id)
        kinds = ("start", "delta", "reasoning", "error", "done")
        return [f for f in frames if f.get("message_id") == message_id and f["type"] in kinds]

    async def close(self) -> None:
        await self.conn.close()
