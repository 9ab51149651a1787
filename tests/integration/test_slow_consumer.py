"""A client that stops reading: the server stops writing to it, closes it after the lag
budget, and the client resumes losslessly from its cursor."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from streaming.feed import FEED_QUEUE
from tests.support.clients import auth, create_conversation, post_message, read_sse, text_of
from tests.support.rawsocket import masked_text_frame, server_frames, upgraded

pytestmark = pytest.mark.asyncio


# A server that gives up on a client soon, and answers far larger than what the kernel's
# buffers hold, framing aside (the log coalesces a fast engine's tokens, so frames carry
# many tokens each).
UNREAD = {
    "send_buffer": 4096,
    "STREAM_SEND_BUFFER_LIMIT": "2048",
    "STREAM_SLOW_CONSUMER_TIMEOUT": "1",
    "STREAM_MIN_WRITE_INTERVAL": "0",
    "MAX_TOKENS_CAP": "40000",
}


def slow_closes(metrics_text: str) -> float:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "chat_slow_consumer_closes":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return 0.0


async def unread_until_closed(server, client: httpx.AsyncClient, request: bytes) -> bytes:
    """Send ``request`` on a connection with a tiny receive window that reads nothing
    until the server gives up on it (observable from outside, via /metrics); then all
    the connection got."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(request)
    async with asyncio.timeout(60):
        while slow_closes((await client.get("/metrics")).text) < 1:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    raw = b""
    while chunk := await loop.sock_recv(sock, 65536):
        raw += chunk
    sock.close()
    return raw


def parse_sse_bytes(raw: bytes) -> list[dict]:
    body = raw.split(b"\r\n\r\n", 1)[1].decode()
    return [
        json.loads(line[6:])
        for block in body.split("\n\n")
        for line in block.split("\n")
        if line.startswith("data: ")
    ]


async def test_unread_stream_is_bounded_and_resumes_exactly(daphne, account):
    server = daphne(**UNREAD)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, "flood",
            max_tokens=40000, simulation={"length": 40000, "tokens_per_second": 40000},
        )  # fmt: skip
        # A raw connection with a tiny receive window that reads nothing for now.
        request = (
            f"GET /api/messages/{message['id']}/stream/ HTTP/1.0\r\n"
            f"Host: 127.0.0.1\r\nAuthorization: Token {account.token}\r\n\r\n"
        )
        raw = await unread_until_closed(server, client, request.encode())
        stalled_events = parse_sse_bytes(raw)
        assert stalled_events and stalled_events[-1]["type"] != "done"
        cursor = stalled_events[-1]["seq"]
        rest = await read_sse(client, account.token, message["id"], last_event_id=cursor)
        rest_events = [e.data for e in rest.events]
        persisted = (
            await client.get(f"/api/messages/{message['id']}/", headers=auth(account.token))
        ).json()
    # The generation finished long before the client read anything, yet the server had not
    # queued the rest of the stream for it (no `done` reached the stalled connection): it
    # stopped writing at the buffer limit instead of buffering the whole answer.
    assert persisted["status"] == "complete"
    assert text_of(rest_events)
    assert len(raw) < 64 * 1024
    assert text_of(stalled_events) + text_of(rest_events) == persisted["content"]
    assert rest_events[-1]["type"] == "done"


async def test_an_unread_openai_stream_is_closed_with_an_error_not_a_clean_end(daphne, account):
    """A /v1 stream cannot be resumed: one the server gives up on says so in the stream
    (an SDK raises it), never a bare [DONE] that would read as the answer's end."""
    server = daphne(**UNREAD)
    body = json.dumps(
        {
            "model": "simulated",
            "stream": True,
            "messages": [{"role": "user", "content": "flood"}],
            "max_completion_tokens": 40000,
            "simulation": {"length": 40000, "tokens_per_second": 40000},
        }
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.0\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {account.token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        raw = await unread_until_closed(server, client, head.encode() + body)
    lines = [
        line[6:]
        for line in raw.split(b"\r\n\r\n", 1)[1].decode().split("\n")
        if line.startswith("data: ")
    ]
    assert lines[-1] == "[DONE]"
    last = json.loads(lines[-2])
    assert last["error"]["code"] == "slow_consumer", last
    chunks = [json.loads(line) for line in lines[:-2]]
    assert chunks, "it read some of the answer before it stalled"
    finishes = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
    assert not any(finishes), "nothing says the answer ended"


async def test_a_socket_that_reads_no_replies_is_not_read_further(daphne):
    """A WebSocket client without an account sends frames whose error replies are as
    large (an unknown type is quoted back) and reads none: once what waits for it is
    over the send buffer's limit, the server reads no more of it, and TCP holds the
    client's sends back. It sent as much as it liked before (hundreds of MB held)."""
    server = daphne(send_buffer=4096, STREAM_SEND_BUFFER_LIMIT="2048")
    sock = upgraded(server.port, receive_buffer=4096)
    frame = masked_text_frame(json.dumps({"type": "x" * 30_000}).encode())
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    accepted, budget = 0, 64 * 1024 * 1024
    try:
        while accepted < budget:
            try:
                # Held back means no room for a frame for a while; the bound stops the
                # test either way.
                async with asyncio.timeout(5):
                    await loop.sock_sendall(sock, frame)
            except TimeoutError:
                break
            accepted += len(frame)
    finally:
        sock.close()
    assert accepted < 16 * 1024 * 1024, f"the server read {accepted} bytes it could not answer"


async def test_a_socket_that_reads_not_its_feed_is_sent_no_more_of_it(daphne, account):
    """A socket following its user's feed that stops reading is written no more once
    what waits for it is over the send buffer's limit: the feed's events then wait in its
    bounded queue, and those past it are dropped and told (``feed_lagging``) once it
    reads again. Every event was written at once, so the process held all of them for a
    socket that read none."""
    server = daphne(send_buffer=4096, STREAM_SEND_BUFFER_LIMIT="2048")
    sock = upgraded(server.port, account.token, receive_buffer=4096)
    sock.sendall(masked_text_frame(json.dumps({"type": "subscribe", "topic": "user"}).encode()))
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    received = b""

    async def frames() -> list[dict]:
        nonlocal received
        received += await loop.sock_recv(sock, 65536)
        whole, received = server_frames(received)
        return [json.loads(payload) for opcode, payload in whole if opcode == 1]

    async with asyncio.timeout(30):
        while {"type": "subscribed", "topic": "user"} not in await frames():
            pass
    renames = 2 * FEED_QUEUE
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        conversation = await create_conversation(api, account.token)
        for n in range(renames):
            title = "last" if n == renames - 1 else f"title {n} " + "x" * 100
            renamed = await api.patch(
                f"/api/conversations/{conversation}/", json={"title": title},
                headers=auth(account.token),
            )  # fmt: skip
            assert renamed.status_code == 200, renamed.text
    feed: list[dict] = []
    try:
        async with asyncio.timeout(30):
            while not (
                feed and (feed[-1].get("code") == "feed_lagging" or feed[-1].get("title") == "last")
            ):
                feed += [f for f in await frames() if f["type"] in ("feed", "error")]
    finally:
        sock.close()
    updates = [f for f in feed if f.get("event") == "conversation.updated"]
    assert feed[-1].get("code") == "feed_lagging", f"all {len(updates)} renames were written"
    assert len(updates) < renames
