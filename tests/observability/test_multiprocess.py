"""Several Daphne processes sharing one ``PROMETHEUS_MULTIPROC_DIR``: ``/metrics`` of any
of them is the sum over all of them, and a dead process's open streams stop counting."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.observability.scrape import Scrape, scrape, scrape_until
from tests.observability.test_stream_metrics import FAST, SLOW, deltas, diff, start_message
from tests.support.clients import SSEEvent, auth, iter_sse, read_sse

pytestmark = pytest.mark.asyncio

# No reaper pass during these tests unless a test asks for one: without Redis every other
# process looks dead to a reaper (the embedded defaults are single-process).
QUIET_REAPER = {"STREAM_HEARTBEAT_TIMEOUT": "600"}


def live_gauge_files(shared: str, pid: int) -> list[Path]:
    return list(Path(shared).glob(f"gauge_live*_{pid}.db"))


def open_streams(s: Scrape) -> float:
    return s.total("chat_streams_active")


async def complete_one(url: str, token: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        message_id = await start_message(client, token, **FAST)
        result = await read_sse(client, token, message_id)
    assert result.events[-1].data["status"] == "complete"


async def read_deltas(stream: Any, events: list[dict[str, Any]], count: int) -> None:
    async for item in stream:
        if isinstance(item, SSEEvent):
            events.append(item.data)
        if len(deltas(events)) >= count:
            return


async def test_metrics_of_either_process_show_both(two_processes, account, tmp_path: Path):
    shared = str(tmp_path / "prometheus")
    async with two_processes(
        "metrics-a", "metrics-b", PROMETHEUS_MULTIPROC_DIR=shared, **QUIET_REAPER
    ) as (a, b, ca, cb):
        before = await scrape(ca)
        await complete_one(a.url, account.token)
        await complete_one(b.url, account.token)
        for client in (ca, cb):
            reading = await scrape(client)
            assert (
                diff(reading, before, "chat_stream_ends_total", transport="sse", status="complete")
                == 2
            )
            assert diff(reading, before, "chat_stream_ttft_seconds_count", transport="sse") == 2
            assert diff(reading, before, "chat_generations_ended_total", status="complete") == 2
            # django-prometheus is summed too: two conversations and two messages posted.
            assert (
                diff(reading, before, "django_http_requests_total_by_method_total", method="POST")
                == 4
            )

        # A stream open on B is counted by A.
        message_id = await start_message(cb, account.token, **SLOW)
        events: list[dict[str, Any]] = []
        url = f"/api/messages/{message_id}/stream/"
        async with cb.stream("GET", url, headers=auth(account.token)) as response:
            stream = iter_sse(response)
            await read_deltas(stream, events, 2)
            during = await scrape(ca)
            assert diff(during, before, "chat_streams_active", transport="sse") == 1
            assert diff(during, before, "chat_generations_active") == 1
            cancel = await cb.post(
                f"/api/messages/{message_id}/cancel/", headers=auth(account.token)
            )
            assert cancel.json()["status"] == "cancelled"
            await read_deltas(stream, events, 10**9)
        assert events[-1]["status"] == "cancelled"
        after = await scrape(ca)
        assert diff(after, before, "chat_streams_active", transport="sse") == 0
        assert diff(after, before, "chat_generations_active") == 0
        assert diff(after, before, "chat_cancels_total") == 1


async def open_slow_stream_then_kill(server: Any, token: str) -> Scrape:
    """Open a slow stream on ``server``, check it counts, SIGKILL the server mid-stream."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        message_id = await start_message(client, token, **SLOW)
        url = f"/api/messages/{message_id}/stream/"
        events: list[dict[str, Any]] = []
        async with client.stream("GET", url, headers=auth(token)) as response:
            stream = iter_sse(response)  # held: dropping the parser would close the response
            await read_deltas(stream, events, 2)
            reading = await scrape(client)
            assert open_streams(reading) == 1
            assert reading.value("chat_generations_active") == 1
            server.kill()
    return reading


async def test_a_new_process_drops_dead_processes_open_streams(daphne, account, tmp_path: Path):
    shared = str(tmp_path / "prometheus")
    doomed = daphne("metrics-doomed", PROMETHEUS_MULTIPROC_DIR=shared, **QUIET_REAPER)
    await complete_one(doomed.url, account.token)
    last = await open_slow_stream_then_kill(doomed, account.token)
    assert live_gauge_files(shared, doomed.proc.pid)

    successor = daphne("metrics-successor", PROMETHEUS_MULTIPROC_DIR=shared, **QUIET_REAPER)
    async with httpx.AsyncClient(base_url=successor.url, timeout=30) as client:
        reading = await scrape(client)
    assert open_streams(reading) == 0
    assert reading.value("chat_generations_active") == 0
    assert not live_gauge_files(shared, doomed.proc.pid)
    # Counters keep the dead process's totals: they never go backwards.
    for reading_ in (reading, last):
        assert reading_.value("chat_stream_ends_total", transport="sse", status="complete") == 1


@pytest.mark.redis
async def test_a_running_process_drops_dead_processes_open_streams(daphne, account, tmp_path):
    if not os.environ.get("REDIS_URL"):
        pytest.skip("needs REDIS_URL: several processes share state through Redis")
    shared = str(tmp_path / "prometheus")
    beats = {"STREAM_HEARTBEAT_INTERVAL": "0.2", "STREAM_HEARTBEAT_TIMEOUT": "1"}
    survivor = daphne("metrics-survivor", PROMETHEUS_MULTIPROC_DIR=shared, **beats)
    doomed = daphne("metrics-doomed", PROMETHEUS_MULTIPROC_DIR=shared, **beats)
    async with httpx.AsyncClient(base_url=survivor.url, timeout=30) as client:
        await scrape(client)  # starts the survivor's background loops
        await open_slow_stream_then_kill(doomed, account.token)
        await scrape_until(
            client, lambda s: open_streams(s) == 0 and s.value("chat_generations_active") == 0
        )
        assert not live_gauge_files(shared, doomed.proc.pid)
        # The survivor's reaper also finalises the dead process's segment, once its
        # heartbeat key has expired.
        reading = await scrape_until(client, lambda s: s.value("chat_reaped_segments_total") == 1)
    assert reading.value("chat_generations_ended_total", status="interrupted") == 1
