"""The WebSocket protocol under random frames, valid and invalid, interleaved with real
subscribes: the server never closes with 1011, never leaks a reader (the active-streams
gauge returns to 0) and every valid subscribe still streams to its end.

The frames that used to crash the consumer are pinned first: JSON nested deeper than the
parser allows, an unpaired surrogate in ``ref``, NUL or a surrogate in content and stop.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.badinput.test_ws_frames import connect, error_for, next_reply, stream_to_end
from tests.observability.scrape import scrape_until
from tests.support.clients import create_conversation, post_message

KINDS = ["auth", "ping", "message.create", "subscribe", "unsubscribe", "cancel", "continue"]
# Text a WebSocket can carry (a client cannot send an unpaired surrogate as text; as a
# JSON escape it is in the frames below).
texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=20)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | texts | st.just("\ud800"),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner),
    max_leaves=12,
)
frames = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(KINDS)},
        optional={
            "ref": json_values,
            "message_id": json_values,
            "after": json_values,
            "conversation": json_values,
            "content": json_values,
            "params": json_values,
            "token": json_values,
        },
    ),
    json_values,
)
raw_frames = st.one_of(
    frames.map(json.dumps),
    st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=60),
    st.binary(max_size=40),
)


@pytest.mark.asyncio
async def test_frames_that_crashed_the_consumer_are_answered(daphne, account):
    server = daphne()
    async with connect(server, account.token) as ws:
        deep = "[" * 20_000 + "]" * 20_000  # within the frame limit, past the parser's
        assert (await error_for(ws, deep))["code"] == "invalid_json"
        surrogate_ref = '{"type": "ping", "ref": "\\ud800"}'
        assert (await error_for(ws, surrogate_ref))["code"] == "invalid_frame"
        for content in ("nul \\u0000", "lone \\udfff"):
            frame = f'{{"type": "message.create", "conversation": "x", "content": "{content}"}}'
            reply = await error_for(ws, frame)
            assert reply["code"] in ("invalid_params", "not_found"), reply
        await ws.send(json.dumps({"type": "ping", "ref": 1}))
        assert await next_reply(ws) == {"type": "pong", "ref": 1}


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches=st.lists(st.lists(raw_frames, min_size=1, max_size=6), min_size=1, max_size=3))
def test_random_frames_never_break_the_socket_or_leak_a_reader(shared_server, batches):
    server, account, conversation = shared_server
    asyncio.run(_exercise(server, account, conversation, batches))


async def _exercise(server: Any, account: Any, conversation: str, batches: list) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        async with connect(server, account.token, max_size=None) as ws:
            for batch in batches:
                message = await post_message(
                    client, account.token, conversation, "fuzz",
                    simulation={"text": "a real answer", "tokens_per_second": 400},
                )  # fmt: skip
                await ws.send(json.dumps({"type": "subscribe", "message_id": message["id"]}))
                for raw in batch:
                    await ws.send(raw)
                text = await stream_to_end(ws, message["id"])
                assert text == "a real answer"
                await ws.send(json.dumps({"type": "ping", "ref": "alive"}))
                while (reply := await next_reply(ws)) != {"type": "pong", "ref": "alive"}:
                    assert reply.get("code") != "server_error", reply
            assert ws.close_code is None
        # Every reader this socket had is gone once it closed (no leaked subscription).
        await scrape_until(client, lambda r: r.total("chat_streams_active", transport="ws") == 0)


@pytest.fixture
def shared_server(daphne, account):
    server = daphne(MAX_CONCURRENT_GENERATIONS_PER_USER=50)

    async def conversation() -> str:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            return await create_conversation(client, account.token)

    return server, account, asyncio.run(conversation())
