"""A thousand concurrent streams, half SSE and half WebSocket, against one Daphne process:
zero errors, and every reader's text is exactly what the database stored (correctness
only: the benchmark measures speed). The streams run for about two minutes in all: creating
a thousand messages takes about forty seconds, and every stream must outlast that."""

from __future__ import annotations

import time

import pytest

from bench.load import StreamPlan, run
from streaming.models import Conversation, Message

pytestmark = pytest.mark.asyncio

STREAMS = 1000
RAMP_SECONDS = 20.0
# Each stream lasts about 67 s: past the ramp, and past the time creating 1,000 messages
# takes with 8 in flight (about 40 s), so all of them are open at once at the end.
SIMULATION = {"length": 100, "tokens_per_second": 1.5, "ttft_ms": 100.0}


@pytest.mark.timeout(240)
@pytest.mark.xfail(
    strict=False,
    reason="passes on an idle 2-core machine; when other heavy processes share it, some "
    "WebSocket handshakes exceed Daphne's 5 s connect timeout (docs/reliability.md)",
)
async def test_thousand_streams_lose_nothing(daphne, account):
    from asgiref.sync import sync_to_async

    server = daphne("soak", MAX_CONCURRENT_GENERATIONS_PER_USER=str(STREAMS * 2))

    def conversations() -> list[str]:
        rows = [Conversation(owner=account.user, title="soak") for _ in range(STREAMS)]
        Conversation.objects.bulk_create(rows)
        return [str(c.id) for c in rows]

    ids = await sync_to_async(conversations)()
    start = time.time() + 1.0
    plans = [
        StreamPlan(
            transport="sse" if i % 2 == 0 else "ws",
            host="127.0.0.1",
            port=server.port,
            token=account.token,
            conversation=ids[i],
            start_at=start + RAMP_SECONDS * i / STREAMS,
            simulation={**SIMULATION, "seed": i},
            deadline=start + 200.0,
        )
        for i in range(STREAMS)
    ]
    # REST POSTs are bounded in flight: each in-flight POST holds its own database
    # connection (docs/reliability.md), which the soak is not about.
    results = await run(plans, creates_in_flight=8)
    errors = [r.error for r in results if r.error is not None]
    assert errors == [], f"{len(errors)} failed, e.g. {sorted(set(errors))[:3]}; {server.log_path}"

    def stored() -> dict[str, tuple[str, str]]:
        rows = Message.objects.filter(id__in=[r.message_id for r in results])
        return {str(m.id): (m.status, m.content) for m in rows}

    messages = await sync_to_async(stored)()
    assert len(messages) == STREAMS
    wrong = [r.message_id for r in results if messages[r.message_id] != ("complete", r.text)]
    assert wrong == [], f"{len(wrong)} streams differ from the stored message"
    assert all(r.status == "complete" for r in results)
    assert sum(r.tokens for r in results) >= STREAMS * 30
    peak = max(r.sent_at for r in results)
    open_at_peak = sum(1 for r in results if r.sent_at <= peak <= r.last_at)
    assert open_at_peak == STREAMS, "every stream was open at once"
