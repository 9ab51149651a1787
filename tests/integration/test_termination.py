"""Every way a response can end, through a real transport, with its persisted record."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from tests.emulator.server import wait_for_request_end
from tests.support.clients import (
    auth,
    create_conversation,
    post_message,
    read_sse,
    text_of,
    wait_for_status,
)
from tests.support.wsclient import ChatSocket

pytestmark = pytest.mark.asyncio


async def run_one(server, account, content: str, **params) -> tuple[list[dict], dict]:
    """Post a message, read its SSE stream to the end, return (events, persisted message)."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(client, account.token, conversation, content, **params)
        result = await read_sse(client, account.token, message["id"])
        events = [e.data for e in result.events]
        persisted = (
            await client.get(f"/api/messages/{message['id']}/", headers=auth(account.token))
        ).json()
    assert events[-1]["type"] == "done"
    assert events[-1]["status"] == persisted["status"] == persisted["segments"][-1]["status"]
    assert text_of(events) == persisted["content"]
    for key in ("finish_reason", "stop_reason", "completion_tokens", "error_type"):
        assert events[-1][key] == persisted["termination"][key]
    return events, persisted


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_complete(daphne, account):
    _events, message = await run_one(daphne(), account, "hi", simulation={"length": 12})
    assert message["status"] == "complete"
    assert message["termination"]["finish_reason"] == "stop"
    assert message["termination"]["ttft_ms"] > 0
    assert "worker" not in message["termination"], "host and pid are not the user's to see"
    assert all("worker" not in s for s in message["segments"])


async def test_truncated_by_max_tokens(daphne, account):
    _, message = await run_one(daphne(), account, "hi", max_tokens=7, simulation={"length": 50})
    assert message["status"] == "truncated"
    assert message["termination"]["finish_reason"] == "length"
    assert message["termination"]["completion_tokens"] == 7


async def test_stopped_by_a_stop_string(daphne, account):
    _, message = await run_one(
        daphne(), account, "hi", stop=["<END>", "<EN"],
        simulation={"text": "first part <END> never shown", "tokens_per_second": 200},
    )  # fmt: skip
    assert message["status"] == "stopped"
    assert message["termination"]["stop_reason"] == "<END>"  # same position: the longest
    assert message["content"] == "first part "


async def test_stopped_by_the_engine_stop_string(daphne, account, emulator):
    server = daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model")
    _, message = await run_one(
        server, account, '[[emu {"text": "alpha beta STOP gamma"}]]', stop=["STOP"]
    )
    assert message["status"] == "stopped"
    assert message["termination"]["stop_reason"] == "STOP"
    assert message["content"] == "alpha beta "


async def test_error_before_the_first_token(daphne, account):
    events, message = await run_one(daphne(), account, "hi", simulation={"error_after_tokens": 0})
    assert message["status"] == "error"
    assert message["content"] == ""
    assert [e["type"] for e in events] == ["start", "error", "done"]
    assert events[1]["error"]["message"] == message["termination"]["error_message"]


async def test_engine_http_error_before_the_stream(daphne, account, emulator):
    server = daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model")
    events, message = await run_one(server, account, '[[emu {"error_before": 400}]]')
    assert message["status"] == "error"
    assert message["termination"]["error_type"] == "BadRequestError"
    assert any(e["type"] == "error" for e in events)


async def test_error_mid_stream_keeps_the_partial_text(daphne, account, emulator):
    server = daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model")
    events, message = await run_one(
        server, account, '[[emu {"tokens": 50, "error_after_tokens": 6}]]'
    )
    assert message["status"] == "error"
    assert message["content"], "the text before the error is kept"
    error = next(e for e in events if e["type"] == "error")
    assert error["error"]["type"] == message["termination"]["error_type"]


async def test_engine_unreachable(daphne, account):
    port = closed_port()
    server = daphne(ENGINE_URL=f"http://127.0.0.1:{port}", ENGINE_MODEL="m")
    events, message = await run_one(server, account, "hi")
    assert message["status"] == "error"
    assert message["termination"]["error_type"] == "EngineUnavailable"
    # The people whose answer failed are told so plainly; the address is for the log.
    shown = [message["termination"]["error_message"]]
    shown += [e["error"]["message"] for e in events if e["type"] == "error"]
    assert all(str(port) not in text and "127.0.0.1" not in text for text in shown), shown
    assert f"127.0.0.1:{port}" in server.log_text()


async def test_stalled(daphne, account):
    server = daphne(STREAM_STALL_TIMEOUT="0.5")
    _, message = await run_one(
        server, account, "hi", simulation={"length": 40, "stall_after_tokens": 4}
    )
    assert message["status"] == "stalled"
    assert message["content"], "tokens before the stall are kept"


async def test_cancelled_over_websocket(daphne, account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
    ws = await ChatSocket.connect(server.ws_url, account.token)
    created = await ws.create(
        conversation, "long", {"simulation": {"length": 2000, "tokens_per_second": 50}}
    )
    message_id = created[-1]["message_id"]
    await ws.recv_until("delta", message_id)
    await ws.send({"type": "cancel", "message_id": message_id})
    frames = await ws.recv_until("done", message_id)
    assert frames[-1]["status"] == "cancelled"
    await ws.close()


async def test_abandoned_at_once_with_grace_zero(daphne, account, emulator):
    server = daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model", STREAM_ABANDON_GRACE="0")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, '[[emu {"tokens": 3000, "tokens_per_second": 50}]]'
        )
        await read_sse(client, account.token, message["id"], stop_after=4)  # then drop
        record = await asyncio.to_thread(wait_for_request_end, emulator, f"{message['id']}.0", 10)
        assert record["outcome"] == "aborted"
        persisted = await wait_for_status(client, account.token, message["id"])
    assert persisted["status"] == "abandoned"
    assert persisted["content"]


async def test_abandoned_only_after_the_grace_period(daphne, account, emulator):
    server = daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model", STREAM_ABANDON_GRACE="1.5")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, '[[emu {"tokens": 3000, "tokens_per_second": 50}]]'
        )
        await read_sse(client, account.token, message["id"], stop_after=4)
        dropped = asyncio.get_running_loop().time()
        record = await asyncio.to_thread(wait_for_request_end, emulator, f"{message['id']}.0", 15)
        waited = asyncio.get_running_loop().time() - dropped
        persisted = await wait_for_status(client, account.token, message["id"])
    assert record["outcome"] == "aborted"
    assert waited >= 1.5, "the engine must not be aborted before the grace period ends"
    assert persisted["status"] == "abandoned"


async def test_reconnect_within_grace_loses_nothing(daphne, account):
    server = daphne(STREAM_ABANDON_GRACE="30")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, "hi",
            simulation={"length": 60, "tokens_per_second": 60},
        )  # fmt: skip
        first = await read_sse(client, account.token, message["id"], stop_after=5)
        rest = await read_sse(
            client, account.token, message["id"], last_event_id=int(first.events[-1].id)
        )
        events = [e.data for e in first.events + rest.events]
        persisted = await wait_for_status(client, account.token, message["id"])
    assert persisted["status"] == "complete"
    assert text_of(events) == persisted["content"]


async def test_interrupted_by_graceful_shutdown(daphne, account):
    server = daphne(STREAM_SHUTDOWN_DEADLINE="0.5")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, "hi",
            simulation={"length": 3000, "tokens_per_second": 30},
        )  # fmt: skip
        first = await read_sse(client, account.token, message["id"], stop_after=3)
        reader = asyncio.create_task(
            read_sse(client, account.token, message["id"], last_event_id=int(first.events[-1].id))
        )
        import signal

        server.signal(signal.SIGTERM)
        rest = await reader
    events = [e.data for e in first.events + rest.events]
    assert events[-1]["type"] == "done"
    assert events[-1]["status"] == "interrupted"
    # In the words the reaper uses for a process that died.
    assert (events[-1]["error_type"], events[-1]["error_message"]) == (
        "Interrupted",
        "the server process generating this answer stopped",
    )
    assert server.proc.wait(timeout=15) is not None
    from asgiref.sync import sync_to_async

    from streaming.models import Message

    stored = await sync_to_async(Message.objects.get)(id=message["id"])
    assert stored.status == "interrupted"
    assert stored.content == text_of(events)


async def test_shape_of_cut_off_code_and_json(daphne, account):
    server = daphne()
    code = "Here:\n```python\ndef f():\n    return 1\n```\nand more text after the block"
    _, message = await run_one(server, account, "code", max_tokens=8, simulation={"text": code})
    assert message["status"] == "truncated"
    assert message["termination"]["has_unclosed_code_block"] is True
    _, message = await run_one(
        server, account, "json", max_tokens=6, simulation={"text": '{"items": [1, 2, 3, 4]}'}
    )
    assert message["termination"]["is_valid_json"] is False
    _, message = await run_one(server, account, "json", simulation={"text": '{"ok": true}'})
    assert message["termination"]["is_valid_json"] is True
    assert message["termination"]["has_unclosed_code_block"] is False


async def test_a_non_streaming_v1_answer_cut_by_a_shutdown_is_a_503_to_retry(daphne, account):
    """The process drained while it answered: not the engine's failure (a 502), but the
    server's going away, which a retry (the OpenAI SDKs retry a 503) gets past."""
    import signal

    server = daphne(STREAM_SHUTDOWN_DEADLINE="0.5")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        body = {
            "model": "simulated",
            "messages": [{"role": "user", "content": "hi"}],
            "simulation": {"length": 3000, "tokens_per_second": 30},
        }
        bearer = {"Authorization": f"Bearer {account.token}"}
        asked = asyncio.create_task(client.post("/v1/chat/completions", json=body, headers=bearer))
        async with asyncio.timeout(30):
            while True:  # until its answer streams
                listed = await client.get("/api/conversations/", headers=auth(account.token))
                if any(c["streaming"] for c in listed.json()["results"]):
                    break
                await asyncio.sleep(0.05)
        server.signal(signal.SIGTERM)
        answered = await asked
    assert answered.status_code == 503, answered.text
    assert answered.json()["error"]["code"] == "shutting_down"
    assert int(answered.headers["retry-after"]) > 0


async def test_a_stop_first_sent_to_a_draining_process_stops_nothing(daphne, account):
    """A regenerate or an edit that says ``"stop": true``, sent to a process draining
    after SIGTERM, is a 503 to retry elsewhere and stops nothing: the answer it would
    have stopped goes on to its end within the drain, as it would without the request
    (which a retry, served by another process, then stops)."""
    import signal

    server = daphne(STREAM_SHUTDOWN_DEADLINE="30")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        answer = await post_message(
            client, account.token, conversation, "hi",
            simulation={"length": 150, "tokens_per_second": 30, "ttft_ms": 0},
        )  # fmt: skip
        reading = asyncio.create_task(read_sse(client, account.token, answer["id"]))
        server.signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            while True:  # until the process says it drains
                if "process" in (await client.get("/readyz")).json()["checks"]:
                    break
                await asyncio.sleep(0.05)
        regenerated = await client.post(
            f"/api/messages/{answer['id']}/regenerate/",
            json={"stop": True},
            headers=auth(account.token),
        )
        edited = await client.post(
            f"/api/messages/{answer['parent_id']}/edit/",
            json={"content": "again", "stop": True},
            headers=auth(account.token),
        )
        events = [e.data for e in (await reading).events]
    for refused in (regenerated, edited):
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "shutting_down"
    assert events[-1]["type"] == "done" and events[-1]["status"] == "complete", events[-1]
