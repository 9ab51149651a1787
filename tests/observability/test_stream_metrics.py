"""Stream metrics move by exactly what real streams through a real Daphne process did.

Each test reads ``/metrics`` before and after and compares the two readings, so what other
requests did to the same process never matters.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.observability.scrape import Scrape, scrape, scrape_until
from tests.support.clients import (
    SSEEvent,
    auth,
    create_conversation,
    iter_sse,
    post_message,
    read_sse,
)
from tests.support.wsclient import ChatSocket

pytestmark = pytest.mark.asyncio

FAST = {"length": 12, "tokens_per_second": 400}
# Long enough to act on mid-stream (10 s), ended by the test long before.
SLOW = {"length": 400, "tokens_per_second": 40}


def diff(after: Scrape, before: Scrape, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


def deltas(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "delta"]


async def start_message(client: httpx.AsyncClient, token: str, **simulation: Any) -> str:
    conversation = await create_conversation(client, token)
    message = await post_message(client, token, conversation, "hi", simulation=simulation)
    return message["id"]


async def test_complete_stream(daphne, account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        before = await scrape(client)
        message_id = await start_message(client, account.token, **FAST)
        result = await read_sse(client, account.token, message_id)
        after = await scrape(client)

    events = [e.data for e in result.events]
    start, done = events[0], events[-1]
    assert done["status"] == "complete"
    delta_events = done["seq"] - start["seq"] - 1  # everything in between is a delta
    # The client sees merged deltas: how many frames depends on when it subscribed
    # relative to the engine (a loaded machine can merge all 12 into one), so the frame
    # metrics below are checked against the count that happened.
    frames_with_text = len(deltas(events))
    assert frames_with_text >= 1

    assert diff(after, before, "chat_stream_ends_total", transport="sse", status="complete") == 1
    assert diff(after, before, "chat_stream_ttft_seconds_count", transport="sse") == 1
    assert diff(after, before, "chat_stream_ttft_seconds_sum", transport="sse") > 0
    assert diff(after, before, "chat_engine_ttft_seconds_count") == 1
    assert (
        diff(after, before, "chat_stream_write_gap_seconds_count", transport="sse")
        == frames_with_text - 1
    )
    assert (
        diff(after, before, "chat_stream_delta_events_delivered_total", transport="sse")
        == delta_events
    )
    written = diff(after, before, "chat_stream_frames_written_total", transport="sse")
    assert 1 <= written <= len(events)
    assert diff(after, before, "chat_generations_ended_total", status="complete") == 1
    assert diff(after, before, "chat_generated_tokens_total") == done["completion_tokens"] > 0
    assert diff(after, before, "chat_persist_seconds_count", kind="final") == 1
    assert diff(after, before, "chat_stream_resumes_total", transport="sse") == 0
    # Nothing left open.
    assert diff(after, before, "chat_streams_active", transport="sse") == 0
    assert diff(after, before, "chat_generations_active") == 0
    # django-prometheus: the two POSTs (conversation, message), and the database behind them.
    assert diff(after, before, "django_http_requests_total_by_method_total", method="POST") == 2
    assert after.total("django_db_execute_total") > before.total("django_db_execute_total")


async def test_cancelled_stream_and_live_gauges(daphne, account):
    server = daphne(STREAM_FLUSH_INTERVAL="0.05")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        before = await scrape(client)
        message_id = await start_message(client, account.token, **SLOW)
        url = f"/api/messages/{message_id}/stream/"
        events: list[dict[str, Any]] = []
        async with client.stream("GET", url, headers=auth(account.token)) as response:
            stream = iter_sse(response)
            async for item in stream:
                if isinstance(item, SSEEvent):
                    events.append(item.data)
                if len(deltas(events)) >= 3:
                    break
            # Mid-stream: one open stream, one running generation, write-behind flushing.
            during = await scrape_until(
                client,
                lambda s: diff(s, before, "chat_persist_seconds_count", kind="partial") >= 1,
            )
            assert diff(during, before, "chat_streams_active", transport="sse") == 1
            assert diff(during, before, "chat_generations_active") == 1
            cancel = await client.post(
                f"/api/messages/{message_id}/cancel/", headers=auth(account.token)
            )
            assert cancel.status_code == 200
            assert cancel.json()["status"] == "cancelled"
            async for item in stream:
                if isinstance(item, SSEEvent):
                    events.append(item.data)
        after = await scrape(client)

    assert events[-1]["type"] == "done"
    assert events[-1]["status"] == "cancelled"
    assert diff(after, before, "chat_cancels_total") == 1
    assert diff(after, before, "chat_abandons_total") == 0
    assert diff(after, before, "chat_stream_ends_total", transport="sse", status="cancelled") == 1
    assert diff(after, before, "chat_generations_ended_total", status="cancelled") == 1
    assert diff(after, before, "chat_streams_active", transport="sse") == 0
    assert diff(after, before, "chat_generations_active") == 0


async def test_abandoned_stream(daphne, account):
    server = daphne(STREAM_ABANDON_GRACE="0")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        before = await scrape(client)
        message_id = await start_message(client, account.token, **SLOW)
        first = await read_sse(client, account.token, message_id, stop_after=3)
        assert len(first.events) == 3  # then the client hangs up

        def abandoned(s: Scrape) -> bool:
            return diff(s, before, "chat_generations_ended_total", status="abandoned") == 1

        after = await scrape_until(client, abandoned)
        message = await client.get(f"/api/messages/{message_id}/", headers=auth(account.token))
        assert message.json()["status"] == "abandoned"

    assert diff(after, before, "chat_abandons_total") == 1
    assert diff(after, before, "chat_cancels_total") == 0
    assert (
        diff(after, before, "chat_stream_ends_total", transport="sse", status="disconnected") == 1
    )
    assert diff(after, before, "chat_streams_active", transport="sse") == 0
    assert diff(after, before, "chat_generations_active") == 0


async def test_engine_error(daphne, account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        before = await scrape(client)
        message_id = await start_message(
            client, account.token, length=30, tokens_per_second=400, error_after_tokens=3
        )
        result = await read_sse(client, account.token, message_id)
        after = await scrape(client)

    events = [e.data for e in result.events]
    assert [e["type"] for e in events][-2:] == ["error", "done"]
    assert events[-1]["status"] == "error"
    error_type = events[-2]["error"]["type"]
    assert diff(after, before, "chat_engine_errors_total", type=error_type) == 1
    assert after.total("chat_engine_errors_total") - before.total("chat_engine_errors_total") == 1
    assert diff(after, before, "chat_stream_ends_total", transport="sse", status="error") == 1
    assert diff(after, before, "chat_generations_ended_total", status="error") == 1


async def test_resume_of_a_finished_message_replays_exactly_the_rest(daphne, account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        message_id = await start_message(client, account.token, **FAST)
        full = await read_sse(client, account.token, message_id)
        last_seq = full.events[-1].data["seq"]
        before = await scrape(client)
        rest = await read_sse(client, account.token, message_id, last_event_id=2)
        after = await scrape(client)

    assert [e.data["seq"] for e in rest.events][-1] == last_seq
    assert diff(after, before, "chat_stream_resumes_total", transport="sse") == 1
    assert diff(after, before, "chat_stream_events_replayed_total", transport="sse") == last_seq - 2
    assert diff(after, before, "chat_stream_ends_total", transport="sse", status="complete") == 1
    # A resume is not a first token.
    assert diff(after, before, "chat_stream_ttft_seconds_count", transport="sse") == 0


async def test_resume_mid_stream(daphne, account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        before = await scrape(client)
        message_id = await start_message(client, account.token, length=40, tokens_per_second=100)
        first = await read_sse(client, account.token, message_id, stop_after=3)
        cursor = int(first.events[-1].id or 0)
        rest = await read_sse(client, account.token, message_id, last_event_id=cursor)
        after = await scrape(client)

    assert rest.events[0].data["seq"] > cursor  # merged deltas carry their last seq
    assert rest.events[-1].data["status"] == "complete"
    assert diff(after, before, "chat_stream_resumes_total", transport="sse") == 1
    assert diff(after, before, "chat_stream_events_replayed_total", transport="sse") >= 1
    assert diff(after, before, "chat_stream_ttft_seconds_count", transport="sse") == 1
    ends = after.total("chat_stream_ends_total", transport="sse") - before.total(
        "chat_stream_ends_total", transport="sse"
    )
    assert ends == 2
    assert diff(after, before, "chat_stream_ends_total", transport="sse", status="complete") == 1
    assert (
        diff(after, before, "chat_stream_ends_total", transport="sse", status="disconnected") == 1
    )


async def test_websocket_stream_is_labelled_ws(daphne, account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        before = await scrape(client)
        conversation = await create_conversation(client, account.token)
        ws = await ChatSocket.connect(server.ws_url, account.token)
        try:
            await ws.send(
                {
                    "type": "message.create",
                    "conversation": conversation,
                    "content": "hi",
                    "params": {"simulation": FAST},
                }
            )
            created = await ws.recv_until("message.created")
            events = await ws.events_until_done(created[-1]["message_id"])
        finally:
            await ws.close()
        # The socket sends `done` before the subscription's bookkeeping runs: wait for it.
        after = await scrape_until(
            client,
            lambda s: (
                diff(s, before, "chat_stream_ends_total", transport="ws", status="complete") == 1
            ),
        )

    assert events[-1]["status"] == "complete"
    assert diff(after, before, "chat_stream_ttft_seconds_count", transport="ws") == 1
    assert diff(after, before, "chat_stream_ttft_seconds_count", transport="sse") == 0
    assert (
        diff(after, before, "chat_stream_delta_events_delivered_total", transport="ws")
        == events[-1]["seq"] - events[0]["seq"] - 1
    )
    assert diff(after, before, "chat_streams_active", transport="ws") == 0
