"""A conversation's title written by its engine after the first answer, seen by another
tab through the feed: a real Daphne process and the vLLM emulator."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.emulator.server import wait_for_request_end
from tests.support.clients import auth, create_conversation
from tests.support.wsclient import ChatSocket

pytestmark = pytest.mark.asyncio


async def test_the_first_answer_gets_the_conversation_an_engine_title(
    daphne, account, emulator
) -> None:
    server = daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model")
    tab = await ChatSocket.connect(server.ws_url, account.token)
    await tab.send({"type": "subscribe", "topic": "user"})
    await tab.recv_until("subscribed")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        conversation = await create_conversation(api, account.token)
        # The emulator answers the question, and then the title request, which quotes it.
        question = '[[emu {"text": "Paris is the capital."}]] Which city is the capital?'
        posted = await api.post(
            f"/api/conversations/{conversation}/messages/?wait=true",
            json={"content": question},
            headers=auth(account.token),
        )
        assert posted.status_code == 201, posted.text
        assert posted.json()["message"]["status"] == "complete"
        async with asyncio.timeout(30):
            while True:
                frame = await tab.recv()
                if (
                    frame.get("event") == "conversation.updated"
                    and frame["title"] != (posted.json()["user_message"]["content"][:80])
                ):
                    break
        assert frame["title"] == "Paris is the capital"
        stored = (
            await api.get(f"/api/conversations/{conversation}/", headers=auth(account.token))
        ).json()
        assert (stored["title"], stored["title_source"]) == ("Paris is the capital", "model")
        record = await asyncio.to_thread(wait_for_request_end, emulator, f"title-{conversation}")
        assert record["body"]["max_tokens"] == 16

    await tab.close()
