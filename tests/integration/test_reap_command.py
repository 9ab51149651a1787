"""``manage.py reap_streams`` finalises a dead process's segment from the log."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest

from tests.support.clients import auth, create_conversation, iter_sse, post_message, text_of
from tests.support.servers import ROOT, server_env

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("needs_redis")]


async def test_reap_command_finalises_a_killed_generation(daphne, account):
    server = daphne(STREAM_HEARTBEAT_INTERVAL="0.3", STREAM_HEARTBEAT_TIMEOUT="1")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, "long",
            simulation={"length": 3000, "tokens_per_second": 50},
        )  # fmt: skip
        seen = []
        url = f"/api/messages/{message['id']}/stream/"
        async with client.stream("GET", url, headers=auth(account.token)) as response:
            async for item in iter_sse(response):
                if not isinstance(item, str):
                    seen.append(item.data)
                if len(seen) == 8:
                    break
    server.kill()
    env = server_env(STREAM_HEARTBEAT_TIMEOUT="1")
    # The dead worker's heartbeat key lives out its TTL (1 s) first: the command reaps
    # nothing until then, so run it until it does (bounded).
    output = ""
    for _ in range(40):
        run = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "manage.py", "reap_streams"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        output = run.stdout
        if "reaped 1" in output:
            break
        await asyncio.sleep(0.25)
    assert "reaped 1" in output
    from asgiref.sync import sync_to_async

    from streaming.models import Message

    stored = await sync_to_async(Message.objects.get)(id=message["id"])
    assert stored.status == "interrupted"
    assert stored.content.startswith(text_of(seen))
