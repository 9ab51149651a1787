"""A post, regenerate or edit that did not answer can be sent again: with the same
``Idempotency-Key``, a retry gets the messages the first request made
(``Idempotent-Replayed: true``) and starts nothing, on REST, the one-step stream and the
WebSocket alike; a key sent with another request is refused naming it (docs/api.md)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.api.calls import assert_error, client, new_conversation
from tests.badinput.test_ws_frames import connect, next_reply

KEY = "Idempotency-Key"
REPLAYED = "idempotent-replayed"
QUICK = {"simulation": {"length": 12, "tokens_per_second": 500, "ttft_ms": 0}}
# Long enough to be streaming still when it is retried.
SLOW = {"simulation": {"length": 400, "tokens_per_second": 20, "ttft_ms": 0}}


def send(
    api: httpx.Client, url: str, key: str | None, content: str = "hello", params: Any = QUICK
) -> httpx.Response:
    headers = {KEY: key} if key is not None else {}
    return api.post(url, json={"content": content, "params": params}, headers=headers)


def ids(response: httpx.Response) -> tuple[str, str, str]:
    assert response.status_code == 201, response.text
    body = response.json()
    return body["message"]["conversation"], body["user_message"]["id"], body["message"]["id"]


def made(response: httpx.Response) -> str:
    """The answer a post, regenerate or edit made."""
    assert response.status_code == 201, response.text
    return str(response.json()["message"]["id"])


def messages_in(api: httpx.Client, conversation: str) -> int:
    listed = api.get(f"/api/conversations/{conversation}/messages/?tree=true")
    assert listed.status_code == 200, listed.text
    return listed.json()["count"]


def test_a_retry_gets_what_the_first_post_made(daphne, account) -> None:
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        url = f"/api/conversations/{conversation}/messages/"
        first = send(api, url, "k-1", params=SLOW)
        assert REPLAYED not in first.headers
        # While its answer streams (a post would be refused 409 then), and after it ended.
        again = send(api, url, "k-1", params=SLOW)
        assert again.headers[REPLAYED] == "true"
        assert ids(again) == ids(first)
        assert again.json()["message"]["status"] == "streaming"
        api.post(f"/api/messages/{ids(first)[2]}/cancel/")
        ended = send(api, url, "k-1", params=SLOW)
        assert ids(ended) == ids(first) and ended.json()["message"]["status"] == "cancelled"
        assert messages_in(api, conversation) == 2
        # Another key is another message.
        other = send(api, url, "k-2")
        assert REPLAYED not in other.headers and ids(other)[1] != ids(first)[1]
        assert messages_in(api, conversation) == 4


def test_a_retry_of_a_new_conversations_first_message_makes_one_conversation(
    daphne, account
) -> None:
    server = daphne()
    with client(server, account.token) as api:
        first = send(api, "/api/messages/", "new-1")
        again = send(api, "/api/messages/", "new-1")
        assert again.headers[REPLAYED] == "true"
        assert ids(again) == ids(first)
        assert api.get("/api/conversations/").json()["count"] == 1
        # Sent to the conversation it made, the same post is still the same one.
        to_it = send(api, f"/api/conversations/{ids(first)[0]}/messages/", "new-1")
        assert ids(to_it) == ids(first)


def test_a_key_sent_with_another_message_is_refused_naming_it(daphne, account) -> None:
    server = daphne()
    with client(server, account.token) as api:
        one, two = new_conversation(api), new_conversation(api)
        # Answered to its end, so the post below it later finds nothing streaming above.
        ids(send(api, f"/api/conversations/{one}/messages/?wait=true", "used"))
        slower = {"simulation": {**QUICK["simulation"], "tokens_per_second": 100}}
        for url, content, params in (
            (f"/api/conversations/{one}/messages/", "something else", QUICK),
            (f"/api/conversations/{two}/messages/", "hello", QUICK),
            (f"/api/conversations/{one}/messages/", "hello", slower),
        ):
            refused = send(api, url, "used", content, params)
            assert_error(refused, 422, "idempotency_key_reused", KEY)
        # A post's key below messages of a conversation, sent to make a new one.
        ids(send(api, f"/api/conversations/{one}/messages/", "below"))
        assert_error(send(api, "/api/messages/", "below"), 422, "idempotency_key_reused", KEY)
        assert messages_in(api, one) == 4 and messages_in(api, two) == 0
        assert api.get("/api/conversations/").json()["count"] == 2


def test_a_posts_key_and_an_edits_are_not_each_others(daphne, account) -> None:
    """Sent with an edit of the question a post made (or a post of the text an edit
    made), a key is another request's: refused, not answered with what that one made."""
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        url = f"/api/conversations/{conversation}/messages/"
        _, question, _ = ids(send(api, url, "posted"))
        edit = f"/api/messages/{question}/edit/"
        body = {"content": "hello", "params": QUICK, "stop": True}
        assert_error(api.post(edit, json=body, headers={KEY: "posted"}), 422, field=KEY)
        ids(api.post(edit, json={**body, "content": "edited"}, headers={KEY: "edited"}))
        assert_error(send(api, url, "edited", "edited"), 422, field=KEY)
        assert messages_in(api, conversation) == 4


def test_keys_are_each_users_own(daphne, account, other_account) -> None:
    server = daphne()
    with client(server, account.token) as mine, client(server, other_account.token) as theirs:
        first = send(mine, "/api/messages/", "shared")
        second = send(theirs, "/api/messages/", "shared")
        assert REPLAYED not in second.headers
        assert set(ids(first)).isdisjoint(ids(second))


@pytest.mark.parametrize("stop", [False, True])
def test_a_retried_regenerate_or_edit_makes_one_version(daphne, account, stop: bool) -> None:
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        _, question, answer = ids(send(api, f"/api/conversations/{conversation}/messages/", None))
        api.post(f"/api/messages/{answer}/cancel/")
        regenerate = f"/api/messages/{answer}/regenerate/"
        body = {"params": SLOW, "stop": stop}
        made = [api.post(regenerate, json=body, headers={KEY: "again"}) for _ in range(2)]
        assert [m.status_code for m in made] == [201, 201], [m.text for m in made]
        assert REPLAYED not in made[0].headers and made[1].headers[REPLAYED] == "true"
        regenerated = made[0].json()["message"]["id"]
        assert made[1].json()["message"]["id"] == regenerated
        assert made[1].json()["message"]["siblings"] == [answer, regenerated]
        api.post(f"/api/messages/{regenerated}/cancel/")

        edit = f"/api/messages/{question}/edit/"
        body = {"content": "hello again", "params": SLOW, "stop": stop}
        edited = [api.post(edit, json=body, headers={KEY: "edited"}) for _ in range(2)]
        assert [ids(e) for e in edited[1:]] == [ids(edited[0])]
        assert edited[1].headers[REPLAYED] == "true"
        assert messages_in(api, conversation) == 5  # 2 + a regenerated answer + 2
        # The keys name those requests: another target or other content is refused.
        for url, other, key in (
            (f"/api/messages/{ids(edited[0])[2]}/regenerate/", {"stop": True}, "again"),
            (edit, {"content": "something else", "stop": True}, "edited"),
            (edit, {"content": "hello again", "stop": True}, "again"),  # a regenerate's
            (regenerate, {"params": QUICK, "stop": True}, "again"),  # other parameters
        ):
            assert_error(api.post(url, json=other, headers={KEY: key}), 422, field=KEY)
        assert messages_in(api, conversation) == 5


def test_a_retry_that_says_stop_stops_nothing(daphne, account) -> None:
    """A regenerate or edit sent again with ``"stop": true`` makes nothing, so it stops
    nothing: an answer streaming since on the branch it came from goes on, and one
    streaming above is no reason to refuse the retry (the same retry without ``stop``
    is answered)."""
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        _, question, answer = ids(send(api, f"/api/conversations/{conversation}/messages/", None))
        api.post(f"/api/messages/{answer}/cancel/")
        regenerate = (f"/api/messages/{answer}/regenerate/", {"params": QUICK, "stop": True})
        edit = (f"/api/messages/{question}/edit/", {"content": "hi", "params": QUICK, "stop": True})
        first = {
            url: made(api.post(url, json=body, headers={KEY: url}))
            for url, body in (regenerate, edit)
        }
        # Back on the first answer, a question below it whose answer streams.
        switched = api.patch(f"/api/conversations/{conversation}/", json={"current_leaf": answer})
        assert switched.status_code == 200, switched.text
        *_, streaming = ids(
            send(api, f"/api/conversations/{conversation}/messages/", None, params=SLOW)
        )
        for url, body in (regenerate, edit):
            again = api.post(url, json=body, headers={KEY: url})
            assert again.status_code == 201 and again.headers[REPLAYED] == "true", again.text
            assert made(again) == first[url]
        assert api.get(f"/api/messages/{streaming}/").json()["status"] == "streaming"
        api.post(f"/api/messages/{streaming}/cancel/")


@pytest.mark.parametrize(
    "key", [b"", b"x" * 256, b"tab\there", "caf\u00e9".encode("latin-1"), "caf\u00e9".encode()]
)
def test_a_key_that_is_not_printable_ascii_is_refused(daphne, account, key: bytes) -> None:
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        refused = api.post(
            f"/api/conversations/{conversation}/messages/",
            json={"content": "hello", "params": QUICK},
            headers={KEY: key},
        )
        assert_error(refused, 400, "invalid_params", KEY)
        assert messages_in(api, conversation) == 0


def test_retries_racing_each_other_make_one_message(daphne, account) -> None:
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        urls = [f"/api/conversations/{conversation}/messages/", "/api/messages/"]
        for url in urls:
            key = f"race {url}"
            with ThreadPoolExecutor(6) as pool:
                answers = list(pool.map(send, [api] * 6, [url] * 6, [key] * 6))
            made = {ids(answer) for answer in answers}
            assert len(made) == 1, made
            assert sum(REPLAYED not in a.headers for a in answers) == 1
        assert messages_in(api, conversation) == 2
        assert api.get("/api/conversations/").json()["count"] == 2


def test_a_one_step_retry_streams_the_first_posts_answer_from_the_start(daphne, account) -> None:
    """A one-step post whose stream broke, sent again: the same ``created`` ids, then the
    whole answer, which equals what was stored."""
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        url = f"/api/conversations/{conversation}/messages/"
        headers = {KEY: "one-step", "Accept": "text/event-stream"}
        body = {"content": "hello", "params": QUICK}
        with api.stream("POST", url, json=body, headers=headers) as first:
            assert first.status_code == 200
            created, _ = _read(first, until="created")  # then the stream breaks
        with api.stream("POST", url, json=body, headers=headers) as again:
            assert again.status_code == 200 and again.headers[REPLAYED] == "true"
            replayed, events = _read(again, until="done")
        assert replayed == created
        text = "".join(event["text"] for event in events if event["type"] == "delta")
        answer = api.get(f"/api/messages/{created['message']}/").json()
        assert answer["status"] == "complete" and text == answer["content"] != ""
        assert messages_in(api, conversation) == 2


async def test_a_retry_naming_no_model_is_answered_by_its_first_answers_model(
    daphne, account, emulator
) -> None:
    """A post (or edit) that named no model was answered by the conversation's, here the
    default engine's; sent again once the conversation's model has changed, it is still
    that request: the first one's messages, on REST, the one-step stream and the
    WebSocket alike. Naming the model that answer was made with fits too; naming
    another is another request."""
    # The simulated engine answers by default; the emulator serves "test-model".
    server = daphne(ENGINE_MODELS=f'{{"test-model": "{emulator}"}}')
    body = {"content": "hello", "params": {"max_tokens": 3}}  # taken by both engines
    one_step = {"Accept": "text/event-stream"}
    with client(server, account.token) as api:
        plain, streamed, socket, edited = (new_conversation(api) for _ in range(4))
        url = f"/api/conversations/{plain}/messages/"
        first = api.post(url, json=body, headers={KEY: "plain"})
        assert first.json()["message"]["model"] == "simulated", first.text
        stream_url = f"/api/conversations/{streamed}/messages/"
        with api.stream("POST", stream_url, json=body, headers={KEY: "one-step", **one_step}) as r:
            assert r.status_code == 200
            streamed_first, _ = _read(r, until="created")
        question = api.post(f"/api/conversations/{edited}/messages/?wait=true", json=body)
        edit = f"/api/messages/{ids(question)[1]}/edit/"
        edit_first = api.post(edit, json=body, headers={KEY: "edit"})
        assert edit_first.status_code == 201, edit_first.text
    frame = {
        "type": "message.create",
        "conversation": socket,
        **body,
        "subscribe": False,
        "idempotency_key": "ws",
    }
    async with connect(server, account.token) as ws:
        await ws.send(json.dumps(frame))
        socket_first = await next_reply(ws)
        assert socket_first["type"] == "message.created", socket_first
        with client(server, account.token) as api:
            for conversation in (plain, streamed, socket, edited):
                patched = api.patch(
                    f"/api/conversations/{conversation}/", json={"model": "test-model"}
                )
                assert patched.status_code == 200, patched.text
            for model in ({}, {"model": "simulated"}):
                again = api.post(url, json={**body, **model}, headers={KEY: "plain"})
                assert again.headers[REPLAYED] == "true" and ids(again) == ids(first), model
            named = api.post(url, json={**body, "model": "test-model"}, headers={KEY: "plain"})
            assert_error(named, 422, "idempotency_key_reused", KEY)
            headers = {KEY: "one-step", **one_step}
            with api.stream("POST", stream_url, json=body, headers=headers) as r:
                assert r.status_code == 200 and r.headers[REPLAYED] == "true"
                assert _read(r, until="created")[0] == streamed_first
            edit_again = api.post(edit, json=body, headers={KEY: "edit"})
            assert edit_again.headers[REPLAYED] == "true"
            assert ids(edit_again) == ids(edit_first)
        await ws.send(json.dumps(frame))
        socket_again = await next_reply(ws)
        assert socket_again["type"] == "message.created", socket_again
        assert socket_again["replayed"] is True
        assert socket_again["message_id"] == socket_first["message_id"]
        assert socket_again["user_message_id"] == socket_first["user_message_id"]
        await ws.send(json.dumps({**frame, "model": "test-model"}))
        reused = await next_reply(ws)
        assert (reused["code"], reused["field"]) == ("idempotency_key_reused", "idempotency_key")
    with client(server, account.token) as api:
        for conversation in (plain, streamed, socket):
            assert messages_in(api, conversation) == 2, conversation
        assert messages_in(api, edited) == 4


def test_an_edit_retry_is_replayed_once_its_model_would_refuse_its_params(
    daphne, account, emulator
) -> None:
    """An edit answered by the simulated engine with ``simulation`` parameters, sent again
    after the conversation's model became one whose engine refuses them: the retry is
    the first request, answered then, so it gets its messages and not that refusal. A new
    edit with those parameters is refused."""
    server = daphne(ENGINE_MODELS=f'{{"test-model": "{emulator}"}}')
    body = {"content": "hello again", "params": QUICK}
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        question = api.post(
            f"/api/conversations/{conversation}/messages/?wait=true", json={"content": "hi"}
        )
        edit = f"/api/messages/{ids(question)[1]}/edit/?wait=true"
        first = api.post(edit, json=body, headers={KEY: "edit"})
        assert first.json()["message"]["model"] == "simulated", first.text
        patched = api.patch(f"/api/conversations/{conversation}/", json={"model": "test-model"})
        assert patched.status_code == 200, patched.text
        again = api.post(edit, json=body, headers={KEY: "edit"})
        assert again.headers.get(REPLAYED) == "true", again.text
        assert ids(again) == ids(first)
        refused = api.post(edit, json=body, headers={KEY: "another edit"})
        assert_error(refused, 400, "invalid_params", "params.simulation")
        assert messages_in(api, conversation) == 4


def _read(response: httpx.Response, until: str) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The ``created`` event's ids, and the events after it up to the first ``until``."""
    created: dict[str, str] = {}
    events: list[dict[str, Any]] = []
    kind = ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            if kind == "created":
                created = {name: message["id"] for name, message in data.items()}
            else:
                events.append(data)
            if (kind or data.get("type")) == until:
                break
            kind = ""
    return created, events


async def test_a_websocket_create_takes_a_key_too(daphne, account) -> None:
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
    frame = {
        "type": "message.create",
        "conversation": conversation,
        "content": "hello",
        "params": QUICK,
        "subscribe": False,
        "idempotency_key": "ws-1",
    }
    async with connect(server, account.token) as ws:
        replies = []
        for _ in range(2):
            await ws.send(json.dumps(frame))
            replies.append(await next_reply(ws))
        first, again = replies
        assert first["type"] == again["type"] == "message.created", replies
        assert "replayed" not in first and again["replayed"] is True
        assert again["message_id"] == first["message_id"]
        assert again["user_message_id"] == first["user_message_id"]
        await ws.send(json.dumps({**frame, "idempotency_key": 7}))
        bad = await next_reply(ws)
        assert (bad["code"], bad["field"]) == ("invalid_params", "idempotency_key"), bad
        await ws.send(json.dumps({**frame, "content": "else"}))
        reused = await next_reply(ws)
        assert (reused["code"], reused["field"]) == ("idempotency_key_reused", "idempotency_key")
        again = {
            "type": "message.regenerate",
            "message_id": first["message_id"],
            "stop": True,
            "subscribe": False,
            "idempotency_key": "ws-2",
        }
        regenerated = []
        for _ in range(2):
            await ws.send(json.dumps(again))
            regenerated.append(await next_reply(ws))
        assert regenerated[0]["message_id"] == regenerated[1]["message_id"], regenerated
        assert regenerated[1]["replayed"] is True
    with client(server, account.token) as api:
        assert messages_in(api, conversation) == 3
