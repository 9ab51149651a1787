"""A thousand concurrent users, each streaming an answer, half over SSE and half over
WebSocket, against one Daphne process: zero errors, and every reader's text is exactly
what the database stored (correctness only: the benchmark measures speed). Every user
posts at once when its turn in the ramp comes (nothing bounds the creations in flight),
and every stream outlasts the ramp, so all thousand are open together at the end."""

from __future__ import annotations

import time

import pytest

from bench.database import accounts
from bench.load import StreamPlan, run
from streaming.models import Message

pytestmark = pytest.mark.asyncio

STREAMS = 1000
RAMP_SECONDS = 20.0
# Each stream lasts about 45 s, well past the ramp.
SIMULATION = {"length": 60, "tokens_per_second": 1.5, "ttft_ms": 100.0}


@pytest.mark.timeout(240)
async def test_thousand_streams_lose_nothing(daphne):
    from asgiref.sync import sync_to_async

    server = daphne("soak")
    users = await sync_to_async(accounts)(STREAMS)
    start = time.time() + 1.0
    plans = [
        StreamPlan(
            transport="sse" if i % 2 == 0 else "ws",
            host="127.0.0.1",
            port=server.port,
            token=users[i][0],
            conversation=users[i][1],
            start_at=start + RAMP_SECONDS * i / STREAMS,
            simulation={**SIMULATION, "seed": i},
            deadline=start + 200.0,
        )
        for i in range(STREAMS)
    ]
    results = await run(plans)
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
    assert sum(r.tokens for r in results) >= STREAMS * 20
    peak = max(r.sent_at for r in results)
    open_at_peak = sum(1 for r in results if r.sent_at <= peak <= r.last_at)
    assert open_at_peak == STREAMS, "every stream was open at once"
