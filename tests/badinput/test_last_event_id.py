"""Bad resume cursors on the SSE endpoint: ``Last-Event-ID`` and ``?after=``.

Documented answers (docs/reliability.md): anything but a non-negative integer of at most
18 digits is ``400 invalid_cursor`` in the standard error shape; a cursor at or beyond the
end of a finished message is ``204`` (EventSource stops reconnecting); a cursor beyond the
end of a live message waits for events after it and ends with the message.
"""

from __future__ import annotations

import httpx
import pytest

from tests.support.clients import auth, create_conversation, post_message, read_sse

pytestmark = pytest.mark.asyncio

BAD_CURSORS = [
    "-1",
    "-0",
    "abc",
    "1e3",
    "0x10",
    "1.5",
    "+5",
    "5 6",
    "9" * 19,
    "9" * 4096,
    "\u00b2",  # a superscript two: str.isdigit() says yes, int() says no
    "\u00bd",
    "1\u00b9",
]


async def finished_message(client: httpx.AsyncClient, token: str) -> dict:
    conversation = await create_conversation(client, token)
    message = await post_message(
        client, token, conversation, "hi", simulation={"text": "short answer", "ttft_ms": 0}
    )
    result = await read_sse(client, token, message["id"])
    assert result.events[-1].data["type"] == "done"
    return {**message, "last_seq": result.events[-1].data["seq"]}


def latin1(value: str) -> bytes:
    return value.encode("latin-1")


async def test_malformed_cursors_answer_400_in_the_error_shape(daphne, account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        message = await finished_message(client, account.token)
        url = f"/api/messages/{message['id']}/stream/"
        for raw in BAD_CURSORS:
            by_header = await client.get(
                url, headers={**auth(account.token), "Last-Event-ID": latin1(raw)}
            )
            assert by_header.status_code == 400, (raw, by_header.status_code)
            error = by_header.json()["error"]
            assert error["code"] == "invalid_cursor"
            assert error["status"] == 400
            assert error["field"] == "Last-Event-ID"
            assert error["message"] == "Last-Event-ID: must be a non-negative integer event id"
            by_query = await client.get(url, params={"after": raw}, headers=auth(account.token))
            assert by_query.status_code == 400, (raw, by_query.status_code)
            assert by_query.json()["error"]["code"] == "invalid_cursor"
            assert by_query.json()["error"]["message"].count("after:") == 1
        assert (await client.get("/healthz")).status_code == 200


async def test_header_wins_over_query_and_blank_header_falls_back(daphne, account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        message = await finished_message(client, account.token)
        url = f"/api/messages/{message['id']}/stream/"
        end = message["last_seq"]
        # A valid header beats a bad query, and a bad header beats a valid query.
        ok = await client.get(
            url, params={"after": "bad"}, headers={**auth(account.token), "Last-Event-ID": str(end)}
        )
        assert ok.status_code == 204
        bad = await client.get(
            url, params={"after": "0"}, headers={**auth(account.token), "Last-Event-ID": "x"}
        )
        assert bad.status_code == 400
        blank = await read_sse(client, account.token, message["id"], after=end - 1)
        assert [e.data["type"] for e in blank.events] == ["done"]
        empty = await client.get(
            url, params={"after": str(end)}, headers={**auth(account.token), "Last-Event-ID": ""}
        )
        assert empty.status_code == 204, "an empty header falls back to ?after="


async def test_an_after_parameter_names_one_cursor(daphne, account):
    """An empty ``after=``, or ``after`` given twice, names no one cursor: ``400``, as a
    ``Last-Event-ID`` sent twice is. The empty one replayed the answer from its start,
    and of two the last was taken, a bad one before it unheard."""
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        message = await finished_message(client, account.token)
        url = f"/api/messages/{message['id']}/stream/"
        end = message["last_seq"]
        for query in ("after=", f"after=x&after={end}", f"after={end}&after={end}", "after"):
            refused = await client.get(f"{url}?{query}", headers=auth(account.token))
            assert refused.status_code == 400, (query, refused.status_code)
            assert refused.json()["error"]["code"] == "invalid_cursor"
            assert refused.json()["error"]["field"] == "after"
        twice = await client.get(
            url,
            headers=[*auth(account.token).items(), ("Last-Event-ID", "1"), ("Last-Event-ID", "2")],
        )
        assert twice.status_code == 400
        assert twice.json()["error"]["field"] == "Last-Event-ID"
        one = await client.get(f"{url}?after={end}&other=1", headers=auth(account.token))
        assert one.status_code == 204


async def test_cursors_at_or_beyond_the_end_of_a_finished_message_answer_204(daphne, account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        message = await finished_message(client, account.token)
        end = message["last_seq"]
        for cursor in (end, end + 1, 10**6, 10**18 - 1):
            result = await read_sse(client, account.token, message["id"], last_event_id=cursor)
            assert result.status == 204, cursor
            assert result.events == []
        replay = await read_sse(client, account.token, message["id"], last_event_id=0)
        assert replay.status == 200
        assert replay.events[-1].data["seq"] == end


async def test_a_cursor_beyond_the_end_of_a_live_message_ends_with_the_message(daphne, account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, "hi",
            simulation={"length": 30, "tokens_per_second": 200},
        )  # fmt: skip
        ahead = await read_sse(client, account.token, message["id"], last_event_id=10**9)
        assert ahead.status == 200
        assert ahead.events == [], "nothing exists after that cursor"
        final = await client.get(f"/api/messages/{message['id']}/", headers=auth(account.token))
        assert final.json()["status"] == "complete"
        again = await read_sse(client, account.token, message["id"], last_event_id=10**9)
        assert again.status == 204
