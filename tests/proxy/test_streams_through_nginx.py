"""Streams through the shipped nginx config in front of real Daphne processes.

What the seeds' users saw go wrong lives here: a proxy that buffers the stream until the
end, and an idle timeout shorter than the wait for the first token.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx
import pytest
import websockets

from tests.proxy.nginx import NginxServer
from tests.proxy.reads import Recording, record_sse
from tests.support.clients import auth, create_conversation, post_message, seqs, text_of
from tests.support.records import segment_workers
from tests.support.wsclient import ChatSocket

pytestmark = [
    pytest.mark.proxy,
    pytest.mark.redis,
    pytest.mark.asyncio,
    pytest.mark.skipif(
        not os.environ.get("REDIS_URL"),
        reason="needs REDIS_URL: the Daphne processes behind nginx share the log in Redis",
    ),
]

# Long enough in time for many reads, short enough in bytes (< 4 KiB) to fit the one
# buffer a buffering nginx would hold it in.
PACED = {"length": 16, "tokens_per_second": 20}
# The seed's bug: nginx's defaults for a proxied location (buffering on, HTTP/1.0 to the
# upstream, so the response is close-delimited and nginx holds it until a buffer fills or
# the upstream closes), with the app's `X-Accel-Buffering: no` ignored.
NGINX_DEFAULTS = {"proxy_buffering": "on", "proxy_http_version": "1.0"}
BUFFERING_BUG = {"stream": {**NGINX_DEFAULTS, "proxy_ignore_headers": "X-Accel-Buffering"}}


def stream_path(message_id: str) -> str:
    return f"/api/messages/{message_id}/stream/"


async def start_message(proxy: NginxServer, token: str, **simulation: Any) -> str:
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        conversation = await create_conversation(client, token)
        message = await post_message(client, token, conversation, "hi", simulation=simulation)
    return message["id"]


async def persisted(proxy: NginxServer, token: str, message_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        response = await client.get(f"/api/messages/{message_id}/", headers=auth(token))
    assert response.status_code == 200, response.text
    return response.json()


async def ws_until_done_or_closed(
    proxy: NginxServer, token: str, **simulation: Any
) -> tuple[list[dict[str, Any]], bool]:
    """Create a message over WebSocket and read its frames; (frames, whether done came)."""
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        conversation = await create_conversation(client, token)
    ws = await ChatSocket.connect(proxy.ws_url, token)
    frames: list[dict[str, Any]] = []
    try:
        await ws.send(
            {
                "type": "message.create",
                "conversation": conversation,
                "content": "hi",
                "params": {"simulation": simulation},
            }
        )
        while True:
            frame = await ws.recv()
            frames.append(frame)
            if frame.get("type") == "done":
                return frames, True
    except websockets.exceptions.ConnectionClosed:
        return frames, False
    finally:
        await ws.close()


def assert_whole_answer(recording: Recording, content: str) -> None:
    kinds = [a.event for a in recording.events]
    assert recording.status == 200
    assert recording.complete
    assert kinds[0] == "start" and kinds[-1] == "done" and kinds.count("done") == 1
    assert recording.events[-1].data["status"] == "complete"
    assert text_of(recording.datas) == content


async def test_sse_arrives_incrementally_through_the_shipped_config(daphne, nginx, account):
    proxy = nginx([daphne("a"), daphne("b")])
    message_id = await start_message(proxy, account.token, **PACED)
    recording = await record_sse(proxy.port, stream_path(message_id), auth(account.token))

    assert_whole_answer(recording, (await persisted(proxy, account.token, message_id))["content"])
    assert recording.headers["content-type"].startswith("text/event-stream")
    # Asked for gzip like a browser does; an event stream must never be compressed.
    assert "gzip" not in recording.headers.get("content-encoding", "")
    # Deltas came in several network reads before the one that brought `done`.
    assert len(recording.delta_reads_before_done()) >= 3


async def test_websocket_arrives_incrementally_through_the_shipped_config(daphne, nginx, account):
    proxy = nginx([daphne("a"), daphne("b")])
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
    ws = await ChatSocket.connect(proxy.ws_url, account.token)
    await ws.send(
        {
            "type": "message.create",
            "conversation": conversation,
            "content": "hi",
            "params": {"simulation": {"length": 20, "tokens_per_second": 10}},
        }
    )
    message_id = (await ws.recv_until("message.created"))[-1]["message_id"]
    events: list[dict[str, Any]] = []
    status_when_third_delta_arrived = None
    while not events or events[-1]["type"] != "done":
        frame = await ws.recv()
        if frame.get("message_id") != message_id or frame["type"] not in ("start", "delta", "done"):
            continue
        events.append(frame)
        if [e["type"] for e in events].count("delta") == 3:
            state = await persisted(proxy, account.token, message_id)
            status_when_third_delta_arrived = state["status"]
    await ws.close()

    # The third delta reached us while the answer was still being generated.
    assert status_when_third_delta_arrived == "streaming"
    assert events[-1]["status"] == "complete"
    assert text_of(events) == (await persisted(proxy, account.token, message_id))["content"]


async def test_resume_on_the_other_process_gets_exactly_the_remainder(daphne, nginx, account):
    first_process, other_process = daphne("a"), daphne("b")
    via_first, via_other = nginx([first_process]), nginx([other_process])
    message_id = await start_message(via_first, account.token, length=40, tokens_per_second=40)
    path = stream_path(message_id)

    head = await record_sse(via_first.port, path, auth(account.token), stop_after=5)
    cursor = int(head.events[-1].id or 0)
    rest = await record_sse(
        via_other.port, path, {**auth(account.token), "Last-Event-ID": str(cursor)}
    )
    combined = head.datas + rest.datas

    assert rest.status == 200 and rest.complete
    # Merge-on-read may fold a run of deltas into one carrying the last seq: seqs rise
    # strictly from the cursor on, and the text has no gap and no repeat.
    assert cursor < rest.datas[0]["seq"]
    assert seqs(combined) == sorted(set(seqs(combined)))
    assert [e["type"] for e in combined].count("done") == 1
    content = (await persisted(via_other, account.token, message_id))["content"]
    assert text_of(combined) == content
    # Generated by the first process, resumed through the other one.
    assert "worker" not in rest.datas[-1], "host and pid are for operators only"
    [worker] = await segment_workers(message_id)
    assert f":{first_process.proc.pid}:" in worker
    assert any(
        path in line and f"upstream=127.0.0.1:{other_process.port}" in line
        for line in via_other.access_lines()
    )

    ws = await ChatSocket.connect(via_other.ws_url, account.token)
    await ws.send({"type": "subscribe", "message_id": message_id, "after": cursor})
    replayed = await ws.events_until_done(message_id)
    await ws.close()
    assert cursor < replayed[0]["seq"]
    assert seqs(replayed) == sorted(set(seqs(replayed)))
    assert replayed[-1]["seq"] == rest.datas[-1]["seq"]
    assert text_of(head.datas) + text_of(replayed) == content


async def test_buffering_proxy_delivers_everything_at_the_end(daphne, nginx, account):
    """The seed's bug, reproduced to prove the incremental test can tell: the same stream
    through a buffering config arrives in the one read that brings `done`. The app's
    `X-Accel-Buffering: no` rescues a buffering config unless the proxy ignores it."""
    server = daphne()
    buggy = nginx([server], changes=BUFFERING_BUG)
    rescued = nginx([server], changes={"stream": NGINX_DEFAULTS})

    message_id = await start_message(buggy, account.token, **PACED)
    held = await record_sse(buggy.port, stream_path(message_id), auth(account.token))
    assert_whole_answer(held, (await persisted(buggy, account.token, message_id))["content"])
    assert {a.read for a in held.events} == {held.done_read()}

    message_id = await start_message(rescued, account.token, **PACED)
    flowing = await record_sse(rescued.port, stream_path(message_id), auth(account.token))
    assert_whole_answer(flowing, (await persisted(rescued, account.token, message_id))["content"])
    assert len(flowing.delta_reads_before_done()) >= 3


async def test_keepalive_pings_outlast_a_short_proxy_read_timeout(daphne, nginx, account):
    """nginx's read timeout at 3 s, the first token after 5 s: the stream survives on
    keep-alive pings, and is cut without them."""
    short = {"stream": {"proxy_read_timeout": "3s"}, "ws": {"proxy_read_timeout": "3s"}}
    via_pinging = nginx([daphne("pinging", STREAM_PING_INTERVAL=1)], changes=short)
    via_silent = nginx([daphne("silent", STREAM_PING_INTERVAL=60)], changes=short)
    slow_start = {"ttft_ms": 5000, "length": 5, "tokens_per_second": 50}

    async def sse(proxy: NginxServer) -> Recording:
        message_id = await start_message(proxy, account.token, **slow_start)
        return await record_sse(proxy.port, stream_path(message_id), auth(account.token))

    sse_kept, sse_cut, (ws_kept, ws_kept_done), (ws_cut, ws_cut_done) = await asyncio.gather(
        sse(via_pinging),
        sse(via_silent),
        ws_until_done_or_closed(via_pinging, account.token, **slow_start),
        ws_until_done_or_closed(via_silent, account.token, **slow_start),
    )

    assert sse_kept.complete and sse_kept.events[-1].event == "done"
    assert sse_kept.events[-1].data["status"] == "complete"
    assert sse_kept.events[-1].data["ttft_ms"] > 3000  # the first token came after the timeout
    assert sse_kept.comments.count(": ping") >= 2
    assert ws_kept_done and ws_kept[-1]["status"] == "complete"
    assert [f["type"] for f in ws_kept].count("heartbeat") >= 2

    assert not sse_cut.complete and "done" not in [a.event for a in sse_cut.events]
    assert not ws_cut_done and "done" not in [f["type"] for f in ws_cut]
    assert "upstream timed out" in via_silent.errors()
