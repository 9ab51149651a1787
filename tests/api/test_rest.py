"""The REST API over real sockets against a real Daphne process: every endpoint, its owner
checks (another user's id answers 404), authentication (401) and the error shape."""

from __future__ import annotations

import uuid

from streaming.streamlog.redis import stream_key
from tests.api.calls import (
    assert_error,
    client,
    new_conversation,
    post,
    read_to_end,
    redis_client,
    started,
)

FAST = {"ttft_ms": 0, "tokens_per_second": 1000}
SLOW = {"ttft_ms": 0, "tokens_per_second": 5, "length": 500}


def test_conversations_list_create_patch_newest_activity_first(daphne, account):
    server = daphne()
    with client(server, account.token) as api:
        first = new_conversation(api, title="first")
        second = new_conversation(api, title="second", system_prompt="Be brief.")
        listed = api.get("/api/conversations/").json()
        assert listed["count"] == 2
        assert [c["id"] for c in listed["results"]] == [second, first]

        patched = api.patch(f"/api/conversations/{first}/", json={"title": "renamed"})
        assert patched.status_code == 200, patched.text
        assert patched.json()["title"] == "renamed"
        listed = api.get("/api/conversations/").json()
        assert [c["id"] for c in listed["results"]] == [first, second]

        detail = api.get(f"/api/conversations/{second}/").json()
        assert detail["system_prompt"] == "Be brief."
        assert detail["model"] == ""
        read_only = api.patch(f"/api/conversations/{second}/", json={"id": str(uuid.uuid4())})
        assert read_only.json()["id"] == second
        assert_error(api.put(f"/api/conversations/{second}/", json={}), 405)
        assert_error(api.get("/api/conversations/?page=9"), 404, "not_found")


def test_post_with_wait_returns_the_final_message_with_its_record(daphne, account):
    server = daphne()
    text = "Grüße 👋🏽 from the simulator"
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        response = post(api, conversation, "Hello there", wait=True, text=text, **FAST)
        assert response.status_code == 201, response.text
        body = response.json()
        assert body["user_message"]["role"] == "user"
        assert body["user_message"]["content"] == "Hello there"
        assert body["user_message"]["stream"] is None
        message = body["message"]
        assert message["role"] == "assistant"
        assert message["status"] == "complete"
        assert message["content"] == text
        assert message["termination"]["status"] == "complete"
        assert message["termination"]["completion_tokens"] > 0
        assert [s["status"] for s in message["segments"]] == ["complete"]
        assert message["segments"][0]["end_offset"] == len(text)
        assert message["stream"]["sse"] == f"{server.url}/api/messages/{message['id']}/stream/"
        assert message["stream"]["ws"] == f"{server.ws_url}/ws/chat/"

        listed = api.get(f"/api/conversations/{conversation}/messages/").json()
        assert [m["role"] for m in listed["results"]] == ["user", "assistant"]
        detail = api.get(f"/api/messages/{message['id']}/").json()
        assert detail["content"] == text
        assert detail["last_seq"] == message["last_seq"]
        title = api.get(f"/api/conversations/{conversation}/").json()["title"]
        assert title == "Hello there"


def test_a_new_conversation_is_made_with_its_first_message_or_not_at_all(daphne, account):
    server = daphne(MAX_CONCURRENT_GENERATIONS_PER_USER=1)
    with client(server, account.token) as api:
        refused = [
            {"content": "hi", "params": {"max_tokens": 0}},
            {"content": "hi", "params": {"simulation": {"nope": 1}}},
            {"content": ""},
        ]
        for body in refused:
            assert_error(api.post("/api/messages/", json=body), 400)
        assert api.get("/api/conversations/").json()["count"] == 0

        created = api.post(
            "/api/messages/", json={"content": "First line\nsecond", "params": {"simulation": SLOW}}
        )
        assert created.status_code == 201, created.text
        answer = created.json()["message"]
        assert answer["status"] == "streaming"
        listed = api.get("/api/conversations/").json()["results"]
        assert [(c["id"], c["title"]) for c in listed] == [(answer["conversation"], "First line")]
        # Over the limit: a 429, and still no second conversation.
        assert_error(api.post("/api/messages/", json={"content": "again"}), 429)
        assert api.get("/api/conversations/").json()["count"] == 1
        # The list says which conversations have an answer streaming, and searches titles.
        new_conversation(api, title="Quiet one")
        listed = api.get("/api/conversations/").json()["results"]
        assert [(c["title"], c["streaming"]) for c in listed] == [
            ("Quiet one", False),
            ("First line", True),
        ]
        found = api.get("/api/conversations/", params={"search": "first"}).json()["results"]
        assert [c["title"] for c in found] == ["First line"]
        # A search longer than any title is in none, not cut to a title's length.
        whole = new_conversation(api, title="t" * 200)
        for search, titles in (("t" * 200, [whole]), ("t" * 201, []), ("t" * 200 + "x", [])):
            found = api.get("/api/conversations/", params={"search": search}).json()["results"]
            assert [c["id"] for c in found] == titles, len(search)
        api.post(f"/api/messages/{answer['id']}/cancel/")
        detail = api.get(f"/api/conversations/{answer['conversation']}/").json()
        assert detail["streaming"] is False


def test_stream_cancel_and_continue(daphne, account):
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        message = started(api, conversation, "Tell me a long story", **SLOW)
        assert message["status"] == "streaming"
        # The stream URL of the answer works with the same token.
        with api.stream("GET", f"/api/messages/{message['id']}/stream/") as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")

        # Both take nothing: a key sent is refused by name, not ignored; {} is nothing.
        for action in ("cancel", "continue"):
            url = f"/api/messages/{message['id']}/{action}/"
            assert_error(api.post(url, json={"reason": "x"}), 400, "invalid", "reason")
            assert_error(api.post(url, json=[1]), 400, "invalid", "body")
        assert api.get(f"/api/messages/{message['id']}/").json()["status"] == "streaming"
        cancelled = api.post(f"/api/messages/{message['id']}/cancel/", json={})
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        assert cancelled.json()["termination"]["status"] == "cancelled"
        again = api.post(f"/api/messages/{message['id']}/cancel/")
        assert again.json()["status"] == "cancelled"

        continued = api.post(f"/api/messages/{message['id']}/continue/")
        assert continued.status_code == 202, continued.text
        assert continued.json()["status"] == "streaming"
        after = continued.json()["after"]
        assert after >= cancelled.json()["last_seq"]
        conflict = api.post(f"/api/messages/{message['id']}/continue/")
        assert_error(conflict, 409, "conflict")
        api.post(f"/api/messages/{message['id']}/cancel/")
        events = read_to_end(api, message["id"])
        assert events[-1]["type"] == "done"
        detail = api.get(f"/api/messages/{message['id']}/").json()
        assert [s["index"] for s in detail["segments"]] == [0, 1]
        assert detail["segments"][1]["first_seq"] == after + 1

        done = post(api, conversation, "short", wait=True, text="ok", **FAST).json()["message"]
        finished = api.post(f"/api/messages/{done['id']}/continue/?wait=true")
        assert_error(finished, 409, "conflict")
        user_message = api.get(f"/api/conversations/{conversation}/messages/").json()["results"][0]
        question = api.post(f"/api/messages/{user_message['id']}/continue/")
        assert_error(question, 400, "wrong_role")


INVALID_BODIES = [
    ({"params": {}}, "content"),
    ({"content": "   "}, "content"),
    ({"content": 42}, "content"),
    ({"content": "x" * 2001}, "content"),
    ({"content": "hi", "params": []}, "params"),
    ({"content": "hi", "params": {"max_tokens": 0}}, "params.max_tokens"),
    ({"content": "hi", "params": {"max_tokens": 10_000}}, "params.max_tokens"),
    ({"content": "hi", "params": {"temperature": "hot"}}, "params.temperature"),
    ({"content": "hi", "params": {"top_p": 2}}, "params.top_p"),
    ({"content": "hi", "params": {"stop": ["a"] * 9}}, "params.stop"),
    ({"content": "hi", "params": {"stop": [""]}}, "params.stop"),
    ({"content": "hi", "params": {"best_of": 2}}, "params.best_of"),
    ({"content": "hi", "params": {"simulation": {"length": 0}}}, "params.simulation.length"),
    # A key no field takes is refused, not ignored (the answer would not be what was asked).
    ({"content": "hi", "max_tokens": 2}, "max_tokens"),
    ({"content": "hi", "parms": {"max_tokens": 2}}, "parms"),
]


def test_invalid_params_are_400_naming_the_field(daphne, account):
    server = daphne(MAX_MESSAGE_CHARS=2000)
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        for body, field in INVALID_BODIES:
            response = api.post(f"/api/conversations/{conversation}/messages/", json=body)
            assert_error(response, 400, field=field)
        assert api.get(f"/api/conversations/{conversation}/messages/").json()["count"] == 0
        misplaced = api.post("/api/messages/", json={"content": "hi", "max_tokens": 2})
        error = assert_error(misplaced, 400, field="max_tokens")
        assert "params.max_tokens" in error["message"], error


def test_invalid_fields_elsewhere_name_the_field(daphne, account):
    server = daphne()
    with client(server, account.token) as api:
        assert_error(api.post("/api/conversations/", json={"title": "t" * 201}), 400, field="title")
        conversation = new_conversation(api)
        url = f"/api/conversations/{conversation}/"
        assert_error(api.patch(url, json={"title": ["x"]}), 400, field="title")
        assert_error(api.patch(url, json={"titel": "x"}), 400, field="titel")
        assert_error(api.post("/api/conversations/", json={"titel": "x"}), 400, field="titel")
        for page in ("0", "-1", "abc", "1.5", "0" * 40, "١"):
            bad = api.get(f"/api/conversations/?page={page}")
            assert_error(bad, 400, "invalid", field="page")
        for page in ("1", "0" * 40 + "1"):
            assert api.get(f"/api/conversations/?page={page}").status_code == 200
        # Past the last page, however many digits it has.
        for page in ("99", "9999999999", "9" * 40):
            assert_error(api.get(f"/api/conversations/?page={page}"), 404)
        # Strings only, as a message's content: 5 is not "5".
        for field, value in (("title", 5), ("system_prompt", 5), ("model", True)):
            assert_error(api.patch(url, json={field: value}), 400, field=field)
            assert_error(api.post("/api/conversations/", json={field: value}), 400, field=field)
        assert api.get(url).json()["title"] == ""
        wait = api.post(f"/api/conversations/{conversation}/messages/?wait=maybe", json={})
        assert_error(wait, 400, field="wait")
        form = api.post("/api/conversations/", data={"title": "form"})
        assert_error(form, 415, "unsupported_media_type")
        # What a client was given may be sent back: read-only fields are fields (all but
        # the branch shown, null before the first message, which names none to switch to).
        shown = {k: v for k, v in api.get(url).json().items() if k != "current_leaf"}
        sent_back = api.patch(url, json={**shown, "title": "kept"})
        assert sent_back.json().get("title") == "kept", sent_back.text


def test_the_api_answers_json_whatever_the_client_asks(daphne, account):
    """No Accept header or ?format= turns an answer or an error into HTML; a URL without
    its trailing slash is a JSON 404 naming the right one, never a redirect that would
    turn a POST into a GET; a body that is not an object names the body."""
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        url = f"/api/conversations/{conversation}/"
        for headers, query in (
            ({"Accept": "text/html"}, ""),
            ({"Accept": "application/xml"}, ""),
            ({}, "?format=api"),
            ({}, "?format=xml"),
        ):
            found = api.get(url + query, headers=headers)
            assert found.status_code == 200, (headers, query, found.text)
            assert found.json()["id"] == conversation
            refused = api.patch(url + query, json={"title": 5}, headers=headers)
            assert_error(refused, 400, field="title")
        for method, path in (
            ("POST", "/api/conversations"),
            ("PATCH", url.rstrip("/")),
            ("GET", f"/api/conversations/{conversation}/messages"),
        ):
            missing = api.request(method, path, json={"title": "x"})
            error = assert_error(missing, 404, "not_found")
            assert error["message"].endswith(f"{path}/"), error
        for body in ([{"content": "hi"}], "hi", 5):
            posted = api.post(f"{url}messages/", json=body)
            assert_error(posted, 400, field="body")
        assert api.get(url).json()["title"] == ""


def test_another_users_objects_answer_404(daphne, account, other_account):
    server = daphne()
    with client(server, account.token) as owner, client(server, other_account.token) as other:
        conversation = new_conversation(owner, title="private")
        message = post(owner, conversation, "secret", wait=True, text="hidden", **FAST).json()
        answer = message["message"]["id"]
        question = message["user_message"]["id"]
        for response in [
            other.get(f"/api/conversations/{conversation}/"),
            other.patch(f"/api/conversations/{conversation}/", json={"title": "mine"}),
            other.delete(f"/api/conversations/{conversation}/"),
            other.get(f"/api/conversations/{conversation}/messages/"),
            post(other, conversation, "let me in", **FAST),
            other.get(f"/api/messages/{answer}/"),
            other.get(f"/api/messages/{question}/"),
            other.post(f"/api/messages/{answer}/cancel/"),
            other.post(f"/api/messages/{answer}/continue/"),
            other.get(f"/api/messages/{answer}/stream/"),
            other.get(f"/api/messages/{uuid.uuid4()}/"),
            other.get("/api/messages/not-a-uuid/"),
            other.get("/api/no-such-endpoint/"),
        ]:
            assert_error(response, 404, "not_found")
        assert other.get("/api/conversations/").json()["count"] == 0
        assert owner.get(f"/api/conversations/{conversation}/").json()["title"] == "private"
        assert owner.get(f"/api/messages/{answer}/").json()["content"] == "hidden"


def test_unauthenticated_requests_answer_401(daphne, account):
    server = daphne()
    with client(server, account.token) as owner:
        conversation = new_conversation(owner)
        message = post(owner, conversation, "hi", wait=True, text="ok", **FAST).json()["message"]
    ids = {"c": conversation, "m": message["id"]}
    calls = [
        ("GET", "/api/conversations/"),
        ("POST", "/api/conversations/"),
        ("GET", "/api/conversations/{c}/"),
        ("PATCH", "/api/conversations/{c}/"),
        ("DELETE", "/api/conversations/{c}/"),
        ("GET", "/api/conversations/{c}/messages/"),
        ("POST", "/api/conversations/{c}/messages/"),
        ("GET", "/api/messages/{m}/"),
        ("POST", "/api/messages/{m}/cancel/"),
        ("POST", "/api/messages/{m}/continue/"),
        ("GET", "/api/messages/{m}/stream/"),
    ]
    with client(server) as anonymous, client(server, "not-a-token") as forged:
        for method, url in calls:
            response = anonymous.request(method, url.format(**ids), json={})
            assert_error(response, 401, "not_authenticated")
            if not url.endswith("stream/"):
                assert response.headers["www-authenticate"].startswith("Token")
            assert_error(forged.request(method, url.format(**ids), json={}), 401)


def test_a_conversation_longer_than_a_statements_parameters_is_deleted(daphne, account):
    """70,000 messages (with their segments and links to each other): more ids than one
    PostgreSQL statement takes (65,535), which Django's cascade names all in one. The
    delete was a 503 "retry" that never worked."""
    from streaming.models import Conversation, Message, Segment

    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        owner = Conversation.objects.get(pk=conversation)
        parent = None
        for start in range(0, 70_000, 10_000):
            batch = [
                Message(conversation=owner, role="user", content=f"m{i}")
                for i in range(start, start + 10_000)
            ]
            batch[0].parent = parent
            Message.objects.bulk_create(batch)
            parent = batch[-1]
        Segment.objects.bulk_create(Segment(message=m, index=0, status="complete") for m in batch)
        Conversation.objects.filter(pk=conversation).update(current_leaf=parent)
        response = api.delete(f"/api/conversations/{conversation}/")
        assert response.status_code == 204, response.text
        assert not Message.objects.filter(conversation_id=conversation).exists()
        assert not Segment.objects.filter(message__conversation_id=conversation).exists()
        assert_error(api.get(f"/api/conversations/{conversation}/"), 404)


def test_delete_removes_messages_and_logs_and_stops_the_answer(daphne, account):
    from streaming.models import Message

    server = daphne()
    redis = redis_client()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        done = post(api, conversation, "one", wait=True, text="first", **FAST).json()
        running = started(api, conversation, "two", **SLOW)
        ids = [done["user_message"]["id"], done["message"]["id"], running["id"]]
        # The 201 comes as the generation starts; its first event is the one to await.
        assert read_to_end(api, running["id"], until="start")[0]["type"] == "start"
        if redis is not None:
            assert redis.exists(stream_key(done["message"]["id"]))
            assert redis.exists(stream_key(running["id"]))

        # A delete takes nothing: a key sent is refused by name and deletes nothing.
        url = f"/api/conversations/{conversation}/"
        refused = api.request("DELETE", url, json={"confirm": False})
        assert_error(refused, 400, "invalid", "confirm")
        json_type = {"content-type": "application/json"}
        for other in (b"[]", b"null", b'""', b"0", b"false"):  # as empty as `{}`: no object
            sent = api.request("DELETE", url, content=other, headers=json_type)
            assert_error(sent, 400, "invalid", "body")
        assert api.get(url).status_code == 200
        response = api.delete(url)
        assert response.status_code == 204, response.text
        assert not Message.objects.filter(id__in=ids).exists()
        assert_error(api.get(f"/api/conversations/{conversation}/"), 404)
        for message_id in ids:
            assert_error(api.get(f"/api/messages/{message_id}/"), 404)
        assert_error(api.get(f"/api/messages/{running['id']}/stream/"), 404)
        if redis is not None:
            assert not redis.exists(stream_key(done["message"]["id"]))
            assert not redis.exists(stream_key(running["id"]))
        assert api.get("/api/conversations/").json()["count"] == 0


def test_a_url_without_its_slash_is_named_with_it(daphne, account):
    """Django's routes and the ones served before Django (the stream) alike."""
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        answer = post(api, conversation, "hi", wait=True, **FAST).json()["message"]["id"]
        for path in (
            f"/api/conversations/{conversation}",
            f"/api/messages/{answer}",
            f"/api/messages/{answer}/stream",
        ):
            error = assert_error(api.get(path), 404, "not_found")
            assert error["message"] == f"not found; the URL ends with a slash: {path}/", error
        assert assert_error(api.get("/api/nothing/here"), 404)["message"] == "not found"
        # The API's prefixes spelt without their slash: the error object, not a page.
        for path in ("/api", "/v1"):
            assert assert_error(api.get(path), 404)["message"] == "not found"
