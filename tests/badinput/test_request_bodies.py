"""Bodies that used to cost a 500 or unbounded work: JSON nested past the parser's depth
(REST and /v1), and a /v1 call carrying tens of thousands of earlier messages. Each is a
400 naming what is wrong, and a refused /v1 call leaves no conversation behind."""

from __future__ import annotations

from tests.api.calls import assert_error, client, new_conversation


def test_deeply_nested_json_is_400_everywhere(daphne, account):
    server = daphne()
    deep = '{"content": ' + "[" * 50_000 + "]" * 50_000 + "}"
    headers = {"content-type": "application/json"}
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        rest = api.post(
            f"/api/conversations/{conversation}/messages/", content=deep, headers=headers
        )
        error = assert_error(rest, 400, "invalid_body", "body")
        assert error["message"].startswith("body: the request body is nested deeper than"), error
        bearer = {"Authorization": f"Bearer {account.token}", **headers}
        v1 = api.post("/v1/chat/completions", content=deep, headers=bearer)
        assert v1.status_code == 400
        assert v1.json()["error"]["code"] == "invalid_body"
        assert v1.json()["error"]["message"].startswith("the request body is nested"), v1.text
        broken = api.post("/v1/chat/completions", content=b"{", headers=bearer)
        assert broken.json()["error"]["message"].startswith("the request body is not valid JSON")
        # Not JSON at all: the body as a whole is named, as for a body that is no object.
        for not_json in (b"{", b"\xff"):
            plain = api.post(
                f"/api/conversations/{conversation}/messages/", content=not_json, headers=headers
            )
            assert_error(plain, 400, "invalid_body", "body")


def test_openai_bounds_the_history_and_a_refusal_leaves_nothing(daphne, account):
    server = daphne(MAX_PRIOR_MESSAGES=50)
    bearer = {"Authorization": f"Bearer {account.token}"}
    history = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}] * 30
    with client(server, account.token) as api:
        before = api.get("/api/conversations/").json()["count"]
        too_long = {"model": "simulated", "messages": [*history, {"role": "user", "content": "q"}]}
        refused = api.post("/v1/chat/completions", json=too_long, headers=bearer)
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "messages"
        bad_params = {
            "model": "simulated",
            "messages": [{"role": "user", "content": "q"}],
            "max_tokens": 10**9,
        }
        refused = api.post("/v1/chat/completions", json=bad_params, headers=bearer)
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "max_tokens"
        assert api.get("/api/conversations/").json()["count"] == before

        fits = {"model": "simulated", "messages": [*history[:48], {"role": "user", "content": "q"}]}
        answered = api.post("/v1/chat/completions", json=fits, headers=bearer)
        assert answered.status_code == 200, answered.text
        conversation = answered.headers["x-conversation-id"]
        stored = api.get(f"/api/conversations/{conversation}/messages/").json()
        assert stored["count"] == 50  # 48 earlier turns, the question and the answer
        assert [m["role"] for m in stored["results"][:2]] == ["user", "assistant"]


def test_a_chunked_body_is_read_like_any_other(daphne, account):
    server = daphne(MAX_REQUEST_BYTES=4096)
    headers = {"content-type": "application/json"}

    def chunks(*parts: bytes):
        yield from parts

    with client(server, account.token) as api:
        conversation = new_conversation(api)
        url = f"/api/conversations/{conversation}/messages/"
        body = chunks(b'{"content": "chunked', b' hello", "params": {"simulation": {"length": 3}}}')
        created = api.post(url, content=body, headers=headers)
        assert created.status_code == 201, created.text
        assert created.json()["user_message"]["content"] == "chunked hello"
        too_big = api.post(
            url, content=chunks(b'{"content": "', b"x" * 5000, b'"}'), headers=headers
        )
        assert_error(too_big, 413, "too_large")


def test_headers_over_the_servers_limit_are_told_why(daphne, account):
    """Over 16 KiB of headers in one line or in all, on REST, /v1 and the page: a 431 with
    the error object, where the server answered a bare 400 or closed without a word; the
    server goes on serving."""
    server = daphne()
    with client(server, account.token) as api:
        for path in ("/api/conversations/", "/v1/models", "/"):
            for headers in ({"X-Big": "a" * 20_000}, {f"X-{i}": "a" * 4_000 for i in range(5)}):
                refused = api.get(path, headers=headers)
                error = assert_error(refused, 431, "headers_too_large")
                assert "16384 bytes" in error["message"], error
        assert api.get("/api/conversations/").status_code == 200


def test_an_http11_request_without_host_is_refused(daphne, account):
    """RFC 9112 asks a server to refuse an HTTP/1.1 request without ``Host``: a 400 with
    the error object, and the connection closed (it was served, its host taken from the
    listening address, past ``ALLOWED_HOSTS``). HTTP/1.0 has no ``Host`` to require."""
    import json
    import socket

    server = daphne()

    def exchange(raw: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(raw)
            answer = b""
            while chunk := sock.recv(65536):  # the server closes the connection
                answer += chunk
            return answer

    token = f"Authorization: Token {account.token}\r\n".encode()
    for raw in (
        b"GET /api/conversations/ HTTP/1.1\r\n" + token + b"\r\n",
        b"POST /api/conversations/ HTTP/1.1\r\n" + token
        + b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    ):  # fmt: skip
        head, _, body = exchange(raw).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 "), head
        error = json.loads(body)["error"]
        assert (error["code"], error["message"]) == (
            "bad_request",
            "an HTTP/1.1 request names its host: no Host header",
        )
    served = exchange(b"GET /healthz HTTP/1.0\r\n\r\n")
    assert served.startswith(b"HTTP/1.0 200 "), served[:100]
    with client(server, account.token) as api:
        assert api.get("/api/conversations/").json()["count"] == 0, "the POST made nothing"
