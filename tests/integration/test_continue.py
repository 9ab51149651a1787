"""Continue: a new segment on the same message, the engine picking up mid-sentence."""

from __future__ import annotations

import asyncio
import itertools

import httpx
import pytest

from tests.emulator.server import wait_for_request_end
from tests.support.clients import (
    auth,
    create_conversation,
    iter_sse,
    post_message,
    read_sse,
    text_of,
    wait_for_status,
)
from tests.support.records import segment_workers
from tests.support.wsclient import ChatSocket

pytestmark = pytest.mark.asyncio

PROMPT = '[[emu {"tokens": 40, "tokens_per_second": 200}]]'


async def continue_and_read(client, token, message_id: str) -> tuple[dict, list[dict]]:
    response = await client.post(f"/api/messages/{message_id}/continue/", headers=auth(token))
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["id"] == message_id and body["status"] == "streaming"
    result = await read_sse(client, token, message_id, after=body["after"])
    return body, [e.data for e in result.events]


def assert_segments_tile_the_content(message: dict) -> None:
    content = message["content"]
    segments = message["segments"]
    assert segments[0]["start_offset"] == 0
    for before, after in itertools.pairwise(segments):
        assert before["end_offset"] == after["start_offset"]
    assert segments[-1]["end_offset"] == len(content)


async def test_continue_after_truncation(daphne, account, emulator):
    server = daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(client, account.token, conversation, PROMPT, max_tokens=8)
        first = [e.data for e in (await read_sse(client, account.token, message["id"])).events]
        assert first[-1]["status"] == "truncated"
        partial = text_of(first)

        body, second = await continue_and_read(client, account.token, message["id"])
        assert body["after"] == first[-1]["seq"]
        assert second[0]["type"] == "start" and second[0]["segment"] == 1
        assert second[0]["seq"] == first[-1]["seq"] + 1, "seq continues on the same stream"
        assert second[-1]["type"] == "done"

        record = await asyncio.to_thread(wait_for_request_end, emulator, f"{message['id']}.1", 10)
        sent = record["body"]
        assert sent["continue_final_message"] is True
        assert sent["add_generation_prompt"] is False
        assert sent["messages"][-1] == {"role": "assistant", "content": partial}

        final = await wait_for_status(client, account.token, message["id"])
    assert final["content"] == partial + text_of(second)
    assert [s["index"] for s in final["segments"]] == [0, 1]
    assert final["segments"][0]["status"] == "truncated"
    assert_segments_tile_the_content(final)
    assert final["segments"][1]["start_offset"] == len(partial)


async def test_continue_after_cancel_over_websocket(daphne, account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        ws = await ChatSocket.connect(server.ws_url, account.token)
        created = await ws.create(
            conversation, "long", {"simulation": {"length": 400, "tokens_per_second": 60}}
        )
        message_id = created[-1]["message_id"]
        first = await ws.recv_until("delta", message_id)
        await ws.send({"type": "cancel", "message_id": message_id})
        first += await ws.recv_until("done", message_id)
        assert first[-1]["status"] == "cancelled"
        await ws.send({"type": "continue", "message_id": message_id})
        second = await ws.events_until_done(message_id)
        await ws.close()
        assert second[0]["type"] == "start" and second[0]["seq"] == first[-1]["seq"] + 1
        final = await wait_for_status(client, account.token, message_id)
    assert final["segments"][0]["status"] == "cancelled"
    assert final["status"] == second[-1]["status"]
    first_text = text_of([f for f in first if f.get("message_id") == message_id])
    assert final["content"] == first_text + text_of(second)
    assert_segments_tile_the_content(final)


async def test_continue_refuses_streaming_and_complete_messages(daphne, account, other_account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, "hi",
            simulation={"length": 400, "tokens_per_second": 20},
        )  # fmt: skip
        url = f"/api/messages/{message['id']}/continue/"
        busy = await client.post(url, headers=auth(account.token))
        assert busy.status_code == 409
        assert "streaming" in busy.json()["error"]["message"]
        foreign = await client.post(url, headers=auth(other_account.token))
        assert foreign.status_code == 404
        await client.post(f"/api/messages/{message['id']}/cancel/", headers=auth(account.token))
        done = await post_message(
            client, account.token, conversation, "x", simulation={"length": 3}
        )
        await wait_for_status(client, account.token, done["id"])
        finished = await client.post(
            f"/api/messages/{done['id']}/continue/", headers=auth(account.token)
        )
        assert finished.status_code == 409
        assert finished.json()["error"]["code"] == "conflict"


@pytest.mark.usefixtures("needs_redis")
async def test_continue_after_interruption(two_processes, account, emulator):
    env = {
        "ENGINE_URL": emulator,
        "ENGINE_MODEL": "test-model",
        "STREAM_HEARTBEAT_INTERVAL": "0.3",
        "STREAM_HEARTBEAT_TIMEOUT": "1.5",
    }
    async with two_processes(**env) as (a, _, ca, cb):
        assert (await cb.get("/healthz")).status_code == 200
        conversation = await create_conversation(ca, account.token)
        message = await post_message(
            ca, account.token, conversation, '[[emu {"tokens": 300, "tokens_per_second": 60}]]'
        )
        seen: list[dict] = []
        url = f"/api/messages/{message['id']}/stream/"
        async with cb.stream("GET", url, headers=auth(account.token)) as response:
            async for item in iter_sse(response):
                if isinstance(item, str):
                    continue
                seen.append(item.data)
                if len(seen) == 6:
                    a.kill()
                if item.data["type"] == "done":
                    break
        assert seen[-1]["status"] == "interrupted"
        partial = text_of(seen)
        _body, second = await continue_and_read(cb, account.token, message["id"])
        assert second[0]["seq"] == seen[-1]["seq"] + 1
        record = await asyncio.to_thread(wait_for_request_end, emulator, f"{message['id']}.1", 10)
        assert record["body"]["continue_final_message"] is True
        assert record["body"]["messages"][-1]["content"] == partial
        final = await wait_for_status(cb, account.token, message["id"])
    assert final["content"] == partial + text_of(second)
    assert next(s["status"] for s in final["segments"]) == "interrupted"
    assert_segments_tile_the_content(final)


@pytest.mark.usefixtures("needs_redis")
async def test_interrupted_answers_continue_automatically_when_enabled(two_processes, account):
    env = {
        "STREAM_HEARTBEAT_INTERVAL": "0.3",
        "STREAM_HEARTBEAT_TIMEOUT": "1.5",
        "STREAM_AUTO_CONTINUE_INTERRUPTED": "1",
    }
    async with two_processes(**env) as (a, _, ca, cb):
        assert (await cb.get("/healthz")).status_code == 200
        conversation = await create_conversation(ca, account.token)
        message = await post_message(
            ca, account.token, conversation, "story",
            simulation={"length": 200, "tokens_per_second": 40},
        )  # fmt: skip
        first = await read_sse(cb, account.token, message["id"], stop_after=6)
        a.kill()
        rest = await read_sse(
            cb, account.token, message["id"], last_event_id=int(first.events[-1].id)
        )
        assert rest.events[-1].data["status"] == "interrupted"
        interrupted_at = rest.events[-1].data["seq"]
        # The surviving process continues the same message on its own (its new segment is
        # created right after the reap; wait for it to exist before reading it).
        async with asyncio.timeout(30):
            while True:  # the state of another process: poll it
                url = f"/api/messages/{message['id']}/"
                if len((await cb.get(url, headers=auth(account.token))).json()["segments"]) == 2:
                    break
                await asyncio.sleep(0.05)
        tail = await read_sse(cb, account.token, message["id"], after=interrupted_at)
        final = await wait_for_status(cb, account.token, message["id"])
    assert tail.events[0].data["type"] == "start" and tail.events[0].data["segment"] == 1
    assert final["segments"][0]["status"] == "interrupted"
    assert len(final["segments"]) == 2
    workers = await segment_workers(message["id"])
    assert len(workers) == 2 and workers[0] != workers[1], "continued by the other process"
    text = text_of([e.data for e in first.events + rest.events + tail.events])
    assert final["content"] == text


@pytest.mark.parametrize("max_tokens", [3, 4, 5, 6])
async def test_a_cut_mid_character_keeps_whole_characters_and_continue_completes_it(
    daphne, account, max_tokens
):
    """Byte tokens split the characters; a max_tokens cut between them stores no U+FFFD of
    ours, and Continue goes on from the last whole character without losing one."""
    text = "こんにちは、世界！"
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        response = await client.post(
            f"/api/conversations/{conversation}/messages/?wait=true",
            json={
                "content": "hi",
                "params": {
                    "max_tokens": max_tokens,
                    "simulation": {"text": text, "ttft_ms": 0, "tokens_per_second": 1000},
                },
            },
            headers=auth(account.token),
        )
        cut = response.json()["message"]
        assert cut["status"] == "truncated"
        assert "\ufffd" not in cut["content"]
        assert text.startswith(cut["content"])
        continued = await client.post(
            f"/api/messages/{cut['id']}/continue/?wait=true", headers=auth(account.token)
        )
        assert continued.status_code == 200
        whole = continued.json()
        assert "\ufffd" not in whole["content"]
        assert text.startswith(whole["content"]) or whole["content"].startswith(text)
        assert len(whole["content"]) > len(cut["content"])


async def _whole_answer_over_ws(server, token, message_id: str) -> list[dict]:
    """Both segments' events on one subscription from seq 0."""
    ws = await ChatSocket.connect(server.ws_url, token)
    await ws.send({"type": "subscribe", "message_id": message_id, "after": 0})
    try:
        async with asyncio.timeout(30):
            return await ws.events_until_done(message_id) + await ws.events_until_done(message_id)
    finally:
        await ws.close()


@pytest.mark.parametrize("reader", ["sse", "ws", "sse-elsewhere"])
async def test_a_reader_from_the_start_of_a_continued_answer_follows_it_to_its_new_end(
    request, daphne, account, reader
):
    """While a Continue streams, a reader from seq 0 (a page opened or reloaded then) gets
    the first segment, its `done`, and the new segment up to its own `done`: the earlier
    segment's end does not end the stream."""
    if reader == "sse-elsewhere":
        request.getfixturevalue("needs_redis")
    server = daphne("a")
    elsewhere = daphne("b") if reader == "sse-elsewhere" else server
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
        httpx.AsyncClient(base_url=elsewhere.url, timeout=30) as other,
    ):
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, "story",
            simulation={"length": 120, "tokens_per_second": 40},
        )  # fmt: skip
        message_id = message["id"]
        await read_sse(client, account.token, message_id, stop_after=3)
        stop = await client.post(f"/api/messages/{message_id}/cancel/", headers=auth(account.token))
        assert stop.json()["status"] == "cancelled"
        continued = await client.post(
            f"/api/messages/{message_id}/continue/", headers=auth(account.token)
        )
        assert continued.status_code == 202
        if reader == "ws":
            events = await _whole_answer_over_ws(server, account.token, message_id)
        else:
            read = await read_sse(other, account.token, message_id, after=0)
            events = [e.data for e in read.events]
        final = await wait_for_status(client, account.token, message_id)
    assert final["segments"][0]["status"] == "cancelled"
    ends = [e for e in events if e["type"] == "done"]
    assert [(e["segment"], e["status"]) for e in ends] == [(0, "cancelled"), (1, final["status"])]
    assert events[-1] is ends[-1], "the stream ends with the new segment's end"
    assert [e["seq"] for e in events] == sorted({e["seq"] for e in events})
    assert text_of(events) == final["content"]
