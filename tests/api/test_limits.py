"""Limits and hostile input on every POST: concurrent answers (429 + Retry-After), bodies
that are too large (413) or not UTF-8 (400), all in the one error shape."""

from __future__ import annotations

import http.client
import json
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.api.calls import assert_error, client, new_conversation, post, started

SLOW = {"ttft_ms": 0, "tokens_per_second": 5, "length": 500}
LIMIT = 2048


def test_over_the_concurrent_answer_limit_is_429_with_retry_after(daphne, account, other_account):
    server = daphne(MAX_CONCURRENT_GENERATIONS_PER_USER=1)
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        running = started(api, conversation, "first", **SLOW)
        elsewhere = new_conversation(api)

        refused = post(api, elsewhere, "second", **SLOW)
        error = assert_error(refused, 429, "too_many_generations")
        assert int(refused.headers["retry-after"]) > 0
        assert "at most one answer may stream at once" in error["message"]

        bearer = {"Authorization": f"Bearer {account.token}"}
        body = {"model": "simulated", "messages": [{"role": "user", "content": "third"}]}
        openai_refused = api.post("/v1/chat/completions", json=body, headers=bearer)
        error = assert_error(openai_refused, 429, "too_many_generations")
        assert error["type"] == "rate_limit_error"
        assert int(openai_refused.headers["retry-after"]) > 0

        # The limit is per user: someone else may still start an answer.
        with client(server, other_account.token) as other:
            other_conversation = new_conversation(other)
            assert post(other, other_conversation, "mine", wait=True, text="ok").status_code == 201

        assert api.post(f"/api/messages/{running['id']}/cancel/").json()["status"] == "cancelled"
        continued = api.post(f"/api/messages/{running['id']}/continue/")
        assert continued.status_code == 202
        api.post(f"/api/messages/{running['id']}/cancel/")
        assert post(api, elsewhere, "now it fits", wait=True, text="ok").status_code == 201
        # Refused calls left no messages and no conversations behind.
        listed = api.get(f"/api/conversations/{elsewhere}/messages/").json()["results"]
        assert [m["content"] for m in listed] == ["now it fits", "ok"]
        assert api.get("/api/conversations/").json()["count"] == 2


def test_calls_waiting_on_answers_are_bounded_per_user(daphne, account, other_account):
    """Retries of one answer (its ``Idempotency-Key``) start nothing, so the answers' limit
    does not bound them; with ``?wait=true`` each held a request slot of the process until
    the answer ended, and one user's retries held them all. A user's waits are bounded as
    their answers are, and a call refused for it has made nothing."""
    server = daphne(MAX_CONCURRENT_GENERATIONS_PER_USER=1)
    with client(server, account.token) as api, ThreadPoolExecutor(1) as waiter:
        conversation = new_conversation(api)
        url = f"/api/conversations/{conversation}/messages/?wait=true"
        body = {"content": "hold", "params": {"simulation": SLOW}}
        key = {"Idempotency-Key": str(uuid.uuid4())}
        waiting = waiter.submit(api.post, url, json=body, headers=key)
        # The wait is held before the call makes its messages: once they are there, it is.
        while not api.get(f"/api/conversations/{conversation}/messages/").json()["results"]:
            assert not waiting.done(), waiting.result().text
        refused = api.post(url, json=body, headers=key)
        assert_error(refused, 429, "too_many_waits", field="wait")
        assert int(refused.headers["retry-after"]) > 0
        elsewhere = new_conversation(api)
        other = api.post(f"/api/conversations/{elsewhere}/messages/?wait=true", json=body)
        assert_error(other, 429, "too_many_waits", field="wait")
        assert api.get(f"/api/conversations/{elsewhere}/messages/").json()["results"] == []
        with client(server, other_account.token) as someone_else:
            theirs = new_conversation(someone_else)
            assert post(someone_else, theirs, "mine", wait=True, text="ok").status_code == 201

        assert not waiting.done(), "the answer is slow: its wait is still held"
        listed = api.get(f"/api/conversations/{conversation}/messages/").json()["results"]
        api.post(f"/api/messages/{listed[-1]['id']}/cancel/")
        first = waiting.result(30)
        assert first.status_code == 201 and first.json()["message"]["status"] == "cancelled"
        again = api.post(url, json=body, headers=key)  # the wait was given back
        assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
        assert again.json()["message"]["id"] == first.json()["message"]["id"]


def test_a_full_conversation_takes_nothing_more(daphne, account):
    """Every post, edit, regenerate and Continue reads the whole conversation: what one
    may hold is bounded, by its messages and by its text, and a request past either is
    a 409 that makes nothing."""
    server = daphne(MAX_CONVERSATION_MESSAGES=6, MAX_CONVERSATION_CHARS=1000)
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        post(api, conversation, "one", wait=True, text="ok")
        post(api, conversation, "two", wait=True, text="ok")
        cut = post(api, conversation, "three", wait=True, params={"max_tokens": 2}, length=50)
        question, answer = cut.json()["user_message"], cut.json()["message"]
        assert answer["status"] == "truncated"
        url = f"/api/conversations/{conversation}/messages/"

        def refused(response: httpx.Response, held: str) -> None:
            error = assert_error(response, 409, "conversation_full")
            assert f"({held})" in error["message"], error
            assert len(api.get(url, params={"tree": "true"}).json()["results"]) == 6

        refused(post(api, conversation, "four", text="ok"), "6 messages")
        refused(
            api.post(f"/api/messages/{question['id']}/edit/", json={"content": "2"}), "6 messages"
        )
        refused(api.post(f"/api/messages/{answer['id']}/regenerate/"), "6 messages")
        refused(api.post(f"/api/messages/{answer['id']}/continue/"), "6 messages")

        # By its text: a request may take it past the bound, the next is refused.
        wordy = new_conversation(api)
        post(api, wordy, "x" * 997, wait=True, text="ok")  # 999 characters
        assert post(api, wordy, "more", wait=True, text="ok").status_code == 201  # 1005
        error = assert_error(post(api, wordy, "again", text="ok"), 409, "conversation_full")
        assert "(1000 characters)" in error["message"]
        # Another conversation is not full.
        assert post(api, new_conversation(api), "fresh", wait=True, text="ok").status_code == 201


def test_a_stop_first_in_a_full_conversation_stops_nothing(daphne, account):
    """A regenerate or an edit that says ``"stop": true`` in a full conversation is
    refused as it would be without it, and the answer streaming in its branch goes on:
    a request refused for anything but what streams stops nothing."""
    server = daphne(MAX_CONVERSATION_MESSAGES=2)
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        made = post(api, conversation, "one", **SLOW).json()
        question, answer = made["user_message"]["id"], made["message"]["id"]

        regenerated = api.post(f"/api/messages/{answer}/regenerate/", json={"stop": True})
        assert_error(regenerated, 409, "conversation_full")
        edited = api.post(f"/api/messages/{question}/edit/", json={"content": "1", "stop": True})
        assert_error(edited, 409, "conversation_full")
        assert api.get(f"/api/messages/{answer}/").json()["status"] == "streaming"
        api.post(f"/api/messages/{answer}/cancel/")


def _unsafe_calls(api: httpx.Client) -> list[tuple[str, str]]:
    conversation = new_conversation(api)
    message = post(api, conversation, "hi", wait=True, text="ok").json()["message"]["id"]
    return [
        ("POST", "/api/conversations/"),
        ("PATCH", f"/api/conversations/{conversation}/"),
        ("POST", f"/api/conversations/{conversation}/messages/"),
        ("POST", f"/api/messages/{message}/cancel/"),
        ("POST", f"/api/messages/{message}/continue/"),
        ("POST", "/v1/chat/completions"),
    ]


def test_oversized_and_invalid_utf8_bodies_on_every_post(daphne, account):
    server = daphne(MAX_REQUEST_BYTES=LIMIT)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {account.token}"}
    too_large = b'{"content": "' + b"x" * LIMIT + b'"}'
    not_utf8 = b'{"content": "caf\xe9 \xff\xfe"}'
    with client(server, account.token) as api:
        calls = _unsafe_calls(api)
        count = api.get("/api/conversations/").json()["count"]
        for method, url in calls:
            response = api.request(method, url, content=too_large, headers=headers)
            error = assert_error(response, 413, "too_large")
            assert str(LIMIT) in error["message"], (url, error)

            response = api.request(method, url, content=not_utf8, headers=headers)
            error = assert_error(response, 400, "invalid_body")
            assert "UTF-8" in error["message"], (url, error)

            response = api.request(method, url, content=b'{"content": ', headers=headers)
            assert_error(response, 400, "invalid_body")
        assert api.get("/api/conversations/").json()["count"] == count


def test_unknown_api_urls_and_methods_answer_the_error_shape(daphne, account):
    server = daphne()
    with client(server, account.token) as api:
        assert_error(api.get(f"/api/conversations/{uuid.uuid4()}/nothing/"), 404, "not_found")
        assert_error(api.get("/v1/nothing"), 404, "not_found")
        assert_error(api.delete("/api/conversations/"), 405, "method_not_allowed")
        assert_error(api.post("/v1/models"), 405, "method_not_allowed")


def refusal(server, sent: bytes) -> tuple[bytes, dict]:
    """The head and error object a server answers ``sent`` with, on a raw connection it
    then closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(sent)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, json.loads(body)["error"]


def test_a_body_declared_too_large_is_refused_before_it_is_sent(daphne):
    """No credentials, a Content-Length of 400 MB and no byte of the body: the answer
    comes at once (the whole body was written to disk twice before the refusal)."""
    head, error = refusal(
        daphne(),
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 400000000\r\n\r\n",
    )
    assert head.startswith(b"HTTP/1.1 413 ") and error["code"] == "too_large", head


def test_a_request_trickled_in_is_refused_once_its_time_is_up(daphne):
    """Headers sent a byte at a time (each byte put Twisted's idle clock back, so the
    connection was held for ever): a 408 once ``HTTP_REQUEST_TIMEOUT`` has passed."""
    head, error = refusal(
        daphne(HTTP_REQUEST_TIMEOUT="1"),
        b"GET /api/conversations/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a",
    )
    assert head.startswith(b"HTTP/1.1 408 ") and error["code"] == "request_timeout", head


def test_a_request_line_trickled_in_is_refused_once_its_time_is_up(daphne):
    """The clock started at the request's first whole line, so a client trickling the
    line itself (no line end yet, a byte at a time) held its connection for as long as
    the line stayed under Twisted's 16 KiB: a 408 once ``HTTP_REQUEST_TIMEOUT`` has
    passed since its first byte, as for the rest of the request."""
    head, error = refusal(daphne(HTTP_REQUEST_TIMEOUT="1"), b"GET /api/conversations/?q=")
    assert head.startswith(b"HTTP/1.1 408 ") and error["code"] == "request_timeout", head


def test_every_refusal_before_the_application_is_the_error_object_in_openais_shape_on_v1(
    daphne,
):
    """What the server refuses before the application sees the request (a body over the
    limit, headers over 16 KiB, a request that does not arrive in time, a CR or another
    control character in a header value) is the error object and the connection closed,
    on ``/v1`` with OpenAI's ``type`` and ``param`` as every other ``/v1`` error. They
    had neither, and Daphne answered a vertical tab with an HTML page."""
    server = daphne(HTTP_REQUEST_TIMEOUT="1")
    host = b"Host: 127.0.0.1\r\n"
    for path, openai in (
        (b"/v1/chat/completions", True),
        (b"http://127.0.0.1/v1/chat/completions", True),  # the target in absolute form
        (b"/api/conversations/", False),
    ):
        for rest, status, code in (
            (host + b"Content-Length: 400000000\r\n\r\n", 413, "too_large"),
            (host + b"X-Big: " + b"a" * 20_000 + b"\r\n\r\n", 431, "headers_too_large"),
            (host + b"X-Slow: a", 408, "request_timeout"),
            (host + b"X-A: a\rb\r\n\r\n", 400, "bad_request"),
            (host + b"X-A: a\x0bb\r\n\r\n", 400, "bad_request"),
        ):
            head, error = refusal(server, b"POST " + path + b" HTTP/1.1\r\n" + rest)
            assert head.startswith(b"HTTP/1.1 %d " % status), (path, rest[-40:], head)
            assert b"\r\nContent-Type: application/json\r\n" in head, head
            assert b"\r\nConnection: close\r\n" in head, head
            assert (error["status"], error["code"]) == (status, code), error
            if openai:
                assert (error["type"], error["param"]) == ("invalid_request_error", None), error
            else:
                assert "type" not in error and "param" not in error, error


def exchange(server, sent: bytes) -> tuple[int, bytes]:
    """The status and body a server answers ``sent`` with, on a raw connection."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(sent)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, response.read()


def test_an_absolute_form_target_is_served_by_its_path_for_the_host_it_names(daphne, account):
    """RFC 9112 section 3.2.2: ``GET http://host/path`` is a request for ``/path`` whose
    host is the target's, whatever its ``Host`` header says (Django answered an HTML 404:
    the whole URL was taken for the path). A host ``ALLOWED_HOSTS`` refuses there is
    refused as in a ``Host`` header, on REST and on ``/v1`` alike."""
    server = daphne()
    token = f"Authorization: Bearer {account.token}\r\n".encode()
    with client(server, account.token) as api:
        new_conversation(api)

    def get(target: bytes, host: bytes) -> tuple[int, bytes]:
        return exchange(
            server,
            b"GET " + target + b" HTTP/1.1\r\nHost: " + host + b"\r\n" + token
            + b"Connection: close\r\n\r\n",
        )  # fmt: skip

    here = b"127.0.0.1:%d" % server.port
    status, body = get(b"http://" + here + b"/api/conversations/?page=1", b"elsewhere.test")
    assert status == 200, body
    assert json.loads(body)["count"] == 1
    status, body = get(b"HTTP://" + here + b"/v1/models", b"elsewhere.test")
    assert status == 200 and json.loads(body)["object"] == "list", body

    for path in (b"/api/conversations/", b"/v1/models"):
        named = get(b"http://elsewhere.test" + path, here)
        assert named == get(path, b"elsewhere.test"), "refused as in a Host header"
        status, body = named
        assert status == 400 and "ALLOWED_HOSTS" in json.loads(body)["error"]["message"], body
