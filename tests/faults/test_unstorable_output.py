"""Model output PostgreSQL cannot store (U+0000) is made storable where it enters: the
reader sees exactly what is persisted, the answer ends, and another user's answer that
streams meanwhile in the same process is flushed and finalised untouched."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.support.clients import auth, create_conversation, post_message, read_sse, text_of

pytestmark = pytest.mark.asyncio

NUL_TEXT = "before\u0000after and \u0000 again"


def directive(**keys: object) -> str:
    return f"[[emu {json.dumps(keys)}]]"  # json.dumps writes the NUL as \\u0000: storable


async def test_nul_in_output_is_replaced_everywhere_and_blocks_no_one(
    daphne, account, other_account, emulator
):
    server = daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model", STREAM_FLUSH_INTERVAL="0.05")
    slow_other = directive(text="the other user's long answer " * 6, tokens_per_second=80)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        mine = await create_conversation(client, account.token)
        theirs = await create_conversation(client, other_account.token)
        other = await post_message(client, other_account.token, theirs, slow_other)
        poisoned = await post_message(
            client, account.token, mine, directive(text=NUL_TEXT, tokens_per_second=200)
        )
        seen, other_seen = await asyncio.gather(
            read_sse(client, account.token, poisoned["id"]),
            read_sse(client, other_account.token, other["id"]),
        )
        events = [e.data for e in seen.events]
        assert events[-1]["type"] == "done" and events[-1]["status"] == "complete"
        shown = text_of(events)
        assert "\u0000" not in shown
        assert shown == NUL_TEXT.replace("\u0000", "\ufffd")
        stored = (
            await client.get(f"/api/messages/{poisoned['id']}/", headers=auth(account.token))
        ).json()
        assert stored["status"] == "complete"
        assert stored["content"] == shown

        other_events = [e.data for e in other_seen.events]
        assert other_events[-1]["status"] == "complete"
        other_stored = (
            await client.get(f"/api/messages/{other['id']}/", headers=auth(other_account.token))
        ).json()
        assert other_stored["status"] == "complete"
        assert other_stored["content"] == text_of(other_events)
