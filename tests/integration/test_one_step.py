"""One round trip per answer: POST with ``Accept: text/event-stream`` answers with the
stream, against a real Daphne process (token and session callers), on the lean path and
through Django."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from rest_framework.authtoken.models import Token

from tests.observability.scrape import Scrape, scrape
from tests.support.clients import (
    SSEEvent,
    auth,
    create_conversation,
    iter_sse,
    read_sse,
    text_of,
    wait_for_status,
)
from tests.support.leaving import (
    Caller,
    ended_status,
    held_owner,
    leave,
    seen_gone,
    send_request,
)

pytestmark = pytest.mark.asyncio

STREAM = {"Accept": "text/event-stream"}
QUICK = {"simulation": {"length": 30, "tokens_per_second": 300, "ttft_ms": 0}}


async def post_streaming(
    api: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    stop_after: int | None = None,
) -> tuple[httpx.Response, list[SSEEvent]]:
    events: list[SSEEvent] = []
    async with api.stream("POST", url, json=body, headers={**STREAM, **headers}) as response:
        if response.status_code != 200:
            await response.aread()
            return response, events
        async for item in iter_sse(response):
            if isinstance(item, SSEEvent):
                events.append(item)
                if stop_after is not None and len(events) >= stop_after:
                    break
    return response, events


async def test_a_post_that_asks_for_the_stream_gets_it_with_the_created_ids(
    daphne, account
) -> None:
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        conversation = await create_conversation(api, account.token)
        url = f"/api/conversations/{conversation}/messages/"
        response, events = await post_streaming(
            api, url, {"content": "hello", "params": QUICK}, auth(account.token)
        )
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        created = events[0]
        assert (created.event, created.id) == ("created", None)
        message = created.data["message"]
        assert created.data["user_message"]["content"] == "hello"
        assert message["status"] == "streaming" and message["stream"]["message_id"]
        stream = [e.data for e in events[1:]]
        assert stream[0]["type"] == "start" and stream[-1]["type"] == "done"
        assert [int(e.id or 0) for e in events[1:]] == [e["seq"] for e in stream]
        stored = await wait_for_status(api, account.token, message["id"])
        assert text_of(stream) == stored["content"] and stored["status"] == "complete"

        # Without the Accept header: the same POST answers its JSON 201, as before.
        plain = await api.post(
            url, json={"content": "again", "params": QUICK}, headers=auth(account.token)
        )
        assert plain.status_code == 201 and set(plain.json()) == set(created.data)


async def test_a_new_conversations_first_message_streams_in_one_step_too(daphne, account) -> None:
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        body = {"content": "first of all", "params": QUICK}
        response, events = await post_streaming(api, "/api/messages/", body, auth(account.token))
        assert response.status_code == 200
        created = events[0]
        assert created.event == "created"
        message = created.data["message"]
        assert events[-1].data["type"] == "done"
        stored = await wait_for_status(api, account.token, message["id"])
        assert text_of([e.data for e in events[1:]]) == stored["content"]
        listed = await api.get("/api/conversations/", headers=auth(account.token))
        assert [c["id"] for c in listed.json()["results"]] == [message["conversation"]]
        # Refused: the JSON error, and still only that one conversation.
        refused, _ = await post_streaming(
            api, "/api/messages/", {"content": "x", "params": {"top_p": 7}}, auth(account.token)
        )
        assert refused.status_code == 400 and refused.json()["error"]["field"] == "params.top_p"
        listed = await api.get("/api/conversations/", headers=auth(account.token))
        assert listed.json()["count"] == 1


def lean_and_django(reading: Scrape, before: Scrape) -> tuple[float, float]:
    """How many one-step posts each path created since ``before``."""
    name = "chat_one_step_posts_total"
    return tuple(  # type: ignore[return-value]
        reading.value(name, path=path) - before.value(name, path=path)
        for path in ("lean", "django")
    )


def shape(data: Any) -> Any:
    """``data`` with its ids and times replaced by what they are, in order of first
    appearance (two creations compare equal when they differ only in those)."""
    names: dict[str, str] = {}

    def name(match: re.Match[str]) -> str:
        return names.setdefault(match[0], f"<id{len(names)}>")

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, str):
            value = re.sub(
                r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", name, value
            )
            return re.sub(r"^\d{4}-\d\d-\d\dT[\d:.]+Z$", "<time>", value)
        return value

    return walk(data)


async def test_the_lean_path_answers_a_post_as_django_does(daphne, account) -> None:
    """A token caller's post is created without Django; the same post with a query string
    goes through Django. Both answer the same head and the same ``created`` event."""
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        before = await scrape(api)
        answers = []
        for query in ("", "?wait=false"):
            conversation = await create_conversation(api, account.token)
            url = f"/api/conversations/{conversation}/messages/{query}"
            body = {"content": "same question", "params": QUICK, "model": ""}
            response, events = await post_streaming(api, url, body, auth(account.token))
            assert response.status_code == 200 and events[-1].data["type"] == "done"
            answers.append((response.headers, events[0]))
        assert lean_and_django(await scrape(api), before) == (1, 1)

        (lean_headers, lean), (django_headers, django) = answers
        assert lean.event == django.event == "created"
        assert shape(lean.data) == shape(django.data)
        assert lean.data["message"]["stream"]["sse"].startswith(server.url)
        assert {k: v for k, v in lean_headers.items() if k != "date"} == {
            k: v for k, v in django_headers.items() if k != "date"
        }
        assert lean_headers["x-frame-options"] == "DENY"
        assert lean_headers["x-content-type-options"] == "nosniff"
        assert "allow" not in lean_headers


async def test_a_post_after_a_named_answer_is_lean_too(daphne, account) -> None:
    """``parent_id`` is taken on the lean path, and answered as Django answers it."""
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        answers = []
        before = await scrape(api)
        for query in ("", "?wait=false"):
            conversation = await create_conversation(api, account.token)
            url = f"/api/conversations/{conversation}/messages/{query}"
            _, first = await post_streaming(api, url, {"content": "one", "params": QUICK},
                                            auth(account.token))  # fmt: skip
            parent = first[0].data["message"]["id"]
            await post_streaming(api, url, {"content": "two", "params": QUICK}, auth(account.token))
            body = {"content": "instead", "params": QUICK, "parent_id": parent}
            response, events = await post_streaming(api, url, body, auth(account.token))
            assert response.status_code == 200 and events[-1].data["type"] == "done"
            assert events[0].data["user_message"]["parent_id"] == parent
            answers.append(events[0].data)
        assert lean_and_django(await scrape(api), before) == (3, 3)
        assert shape(answers[0]) == shape(answers[1])


async def test_refusals_are_the_rest_apis_own(daphne, account, other_account) -> None:
    """Whatever the lean path cannot answer as Django would goes to Django: every refusal
    is the REST API's own, and leaves nothing behind."""
    server = daphne(MAX_CONCURRENT_GENERATIONS_PER_USER="1", MAX_REQUEST_BYTES="2000")
    endless = {"simulation": {"length": 5000, "tokens_per_second": 20, "ttft_ms": 0}}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        conversation = await create_conversation(api, account.token)
        url = f"/api/conversations/{conversation}/messages/"
        refusals: list[tuple[Any, dict[str, str], int]] = [
            ({"content": "x", "params": {"top_p": 7}}, auth(account.token), 400),
            ({"content": ""}, auth(account.token), 400),
            ({"content": "   "}, auth(account.token), 400),
            ({"content": 42}, auth(account.token), 400),
            ({"content": "x\u0000y"}, auth(account.token), 400),
            ({"content": "x", "params": [1]}, auth(account.token), 400),
            ({"content": "x", "model": None}, auth(account.token), 400),
            ({"content": "x", "model": "no-such-model"}, auth(account.token), 400),
            (["content"], auth(account.token), 400),
            ({"content": "x" * 3000}, auth(account.token), 413),
            ({"content": "x"}, {}, 401),
            ({"content": "x"}, {"Authorization": "Token not-a-key"}, 401),
            ({"content": "x"}, auth(other_account.token), 404),
        ]
        before = await scrape(api)
        for body, headers, status in refusals:
            streamed, _ = await post_streaming(api, url, body, headers)
            plain = await api.post(url, json=body, headers=headers)
            assert streamed.status_code == plain.status_code == status, body
            assert streamed.headers["content-type"] == "application/json"
            assert streamed.json() == plain.json()
        for raw in (b'{"content": "x",}', b'{"content": "\xff"}'):
            headers = {**auth(account.token), **STREAM, "Content-Type": "application/json"}
            streamed = await api.post(url, content=raw, headers=headers)
            assert (
                streamed.status_code == 400 and streamed.json()["error"]["code"] == "invalid_body"
            )
        missing = "/api/conversations/00000000-0000-4000-8000-000000000000/messages/"
        streamed, _ = await post_streaming(api, missing, {"content": "x"}, auth(account.token))
        assert streamed.status_code == 404

        # The user's one answer streams; a second is refused (429) by either path.
        _, head = await post_streaming(
            api, url, {"content": "go on", "params": endless}, auth(account.token), stop_after=2
        )
        streamed, _ = await post_streaming(api, url, {"content": "x"}, auth(account.token))
        plain = await api.post(url, json={"content": "x"}, headers=auth(account.token))
        assert streamed.status_code == plain.status_code == 429
        assert streamed.json() == plain.json()
        # A body over the limit is refused by the server before either path sees it.
        reached = [r for r in refusals if r[2] != 413]
        assert lean_and_django(await scrape(api), before) == (1, len(reached) + 4)

        listing = await api.get(url, headers=auth(account.token))
        assert [m["content"] for m in listing.json()["results"]][::2] == ["go on"]
        await api.post(f"/api/messages/{head[0].data['message']['id']}/cancel/",
                       headers=auth(account.token))  # fmt: skip


async def test_a_session_caller_needs_the_csrf_token_as_on_rest(daphne, account) -> None:
    """A signed-in page's post is created on the lean path too, answered as Django
    answers it; one without the CSRF token, or from another origin, is Django's 403."""
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as browser:
        login = await browser.get("/accounts/login/")
        token = login.cookies.get("csrftoken") or browser.cookies.get("csrftoken")
        signed_in = await browser.post(
            "/accounts/login/",
            data={"username": account.username, "password": account.password,
                  "csrfmiddlewaretoken": token},
            headers={"Referer": f"{server.url}/accounts/login/"},
        )  # fmt: skip
        assert signed_in.status_code in (200, 302), signed_in.text
        csrf = browser.cookies.get("csrftoken")
        page = {"X-CSRFToken": csrf, "Referer": server.url + "/", "Origin": server.url}
        before = await scrape(browser)
        answers = []
        for query in ("", "?wait=false"):
            conversation = (await browser.post("/api/conversations/", json={}, headers=page)).json()
            url = f"/api/conversations/{conversation['id']}/messages/"
            for refused_headers in ({}, {**page, "Origin": "http://evil.example"}):
                refused, _ = await post_streaming(browser, url + query, {"content": "x"},
                                                  refused_headers)  # fmt: skip
                plain = await browser.post(url, json={"content": "x"}, headers=refused_headers)
                assert refused.status_code == plain.status_code == 403
                assert refused.json() == plain.json()
            response, events = await post_streaming(
                browser, url + query, {"content": "x", "params": QUICK}, page
            )
            assert response.status_code == 200 and events[-1].data["type"] == "done"
            answers.append((response.headers, events[0]))
        assert lean_and_django(await scrape(browser), before) == (1, 5)
        (lean_headers, lean), (django_headers, django) = answers
        assert shape(lean.data) == shape(django.data)
        assert {k: v for k, v in lean_headers.items() if k != "date"} == {
            k: v for k, v in django_headers.items() if k != "date"
        }

        # An empty Authorization header is no token: the session decides, and the stream
        # is held with it (through Django too, where the scope has no session of its own).
        for query in ("", "?wait=false"):
            response, events = await post_streaming(
                browser, url + query, {"content": "x", "params": QUICK},
                {**page, "Authorization": ""},
            )  # fmt: skip
            assert response.status_code == 200 and events[-1].data.get("type") == "done", query

        # A session that is not one (signed out elsewhere, made up) is Django's 401/403.
        browser.cookies.set("sessionid", "not-a-session")
        refused, _ = await post_streaming(browser, url, {"content": "x"}, page)
        plain = await browser.post(url, json={"content": "x"}, headers=page)
        assert refused.status_code == plain.status_code and refused.status_code in (401, 403)
        assert refused.json() == plain.json()


async def test_a_dropped_one_step_stream_resumes_with_the_get(daphne, account) -> None:
    server = daphne()
    slow = {"simulation": {"length": 40, "tokens_per_second": 40, "ttft_ms": 0}}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        conversation = await create_conversation(api, account.token)
        url = f"/api/conversations/{conversation}/messages/"
        _, head = await post_streaming(
            api, url, {"content": "long", "params": slow}, auth(account.token), stop_after=5
        )
        message_id = head[0].data["message"]["id"]
        cursor = int(head[-1].id or 0)
        rest = await read_sse(api, account.token, message_id, last_event_id=cursor)
        combined = [e.data for e in head[1:] + rest.events]
        stored = await wait_for_status(api, account.token, message_id)
        assert text_of(combined) == stored["content"]
        assert rest.events[-1].data["type"] == "done"


async def test_regenerate_and_edit_stream_in_one_step_too(daphne, account) -> None:
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        conversation = await create_conversation(api, account.token)
        first = await api.post(
            f"/api/conversations/{conversation}/messages/?wait=true",
            json={"content": "hi", "params": QUICK},
            headers=auth(account.token),
        )
        answer, question = first.json()["message"]["id"], first.json()["user_message"]["id"]
        for url, body in (
            (f"/api/messages/{answer}/regenerate/", {"params": QUICK}),
            (f"/api/messages/{question}/edit/", {"content": "hi there", "params": QUICK}),
        ):
            response, events = await post_streaming(api, url, body, auth(account.token))
            assert response.status_code == 200, url
            assert events[0].event == "created" and events[-1].data["status"] == "complete"


async def test_leaving_a_one_step_stream_abandons_the_answer(daphne, account) -> None:
    server = daphne(STREAM_ABANDON_GRACE="0")
    endless = {"simulation": {"length": 5000, "tokens_per_second": 50, "ttft_ms": 0}}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        conversation = await create_conversation(api, account.token)
        url = f"/api/conversations/{conversation}/messages/"
        _, head = await post_streaming(
            api, url, {"content": "go", "params": endless}, auth(account.token), stop_after=3
        )
        ended = await wait_for_status(api, account.token, head[0].data["message"]["id"])
        assert ended["status"] == "abandoned"


ENDLESS = {"simulation": {"length": 200, "tokens_per_second": 50, "ttft_ms": 0}}


@contextlib.asynccontextmanager
async def posted_through_django(
    server, api: httpx.AsyncClient, account, content: str
) -> AsyncIterator[tuple[str, Caller]]:
    """A one-step post through Django (a query string keeps it off the lean path) in a
    new conversation, sent and waiting on its owner's row for the block: the
    conversation's id and the caller's connection."""
    conversation = await create_conversation(api, account.token)
    url = f"/api/conversations/{conversation}/messages/?wait=false"
    headers = {**STREAM, **auth(account.token)}
    async with held_owner(account.user.pk) as held:
        caller = await send_request(
            server, "POST", url, headers, {"content": content, "params": ENDLESS}
        )
        await held.waited_on()
        yield conversation, caller


async def test_a_caller_gone_while_django_makes_its_answer_leaves_it_unread(
    daphne, account
) -> None:
    """A one-step post through Django whose caller leaves while the post is still being
    made (waiting on its owner's row, which the test holds): Django's response is still
    made, the stream opened for it and told its reader left, so the answer is abandoned
    as when the caller leaves its stream. Django used to drop the response when the client
    left, and the answer it had made ran to its end for nobody."""
    server = daphne(STREAM_ABANDON_GRACE="0")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        async with posted_through_django(server, api, account, "never read") as (
            conversation,
            caller,
        ):
            await leave(caller)
            await seen_gone(api)
        assert await ended_status(conversation) == "abandoned"


async def test_a_caller_whose_token_goes_while_django_makes_its_answer_leaves_it_unread(
    daphne, account
) -> None:
    """A one-step post through Django whose token is deleted while the post is made: the
    response ends without a stream (as a revocation ends one), and the answer, which
    nobody may read now, is left unread and abandoned rather than run for nobody."""
    server = daphne(STREAM_ABANDON_GRACE="0")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as api:
        async with posted_through_django(server, api, account, "revoked") as (
            conversation,
            caller,
        ):
            await sync_to_async(Token.objects.filter(key=account.token).delete)()
            gone = await api.get("/api/conversations/", headers=auth(account.token))
            assert gone.status_code == 401  # the server no longer takes the token
        answered = await caller.chunked_response()
        assert answered.startswith(b"HTTP/1.1 200"), answered
        assert b"event: delta" not in answered
        assert await ended_status(conversation) == "abandoned"
