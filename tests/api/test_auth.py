"""Authentication of the REST API: the browser's session (CSRF enforced on every unsafe
method), API tokens (``Token``/``Bearer``, no CSRF) and the command that makes tokens."""

from __future__ import annotations

import subprocess
import sys

import httpx
from django.test import Client
from django.utils.crypto import get_random_string

from tests.api.calls import assert_error, client, new_conversation, post
from tests.support.servers import ROOT, server_env


def _session_cookie(account) -> str:
    login = Client()
    assert login.login(username=account.username, password=account.password)
    return login.cookies["sessionid"].value


def test_session_requests_need_the_csrf_token_on_unsafe_methods(daphne, account):
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        message = post(api, conversation, "hi", wait=True, text="ok").json()["message"]["id"]
    csrf = get_random_string(32)
    cookies = {"sessionid": _session_cookie(account), "csrftoken": csrf}
    with httpx.Client(base_url=server.url, cookies=cookies, timeout=30) as browser:
        listed = browser.get("/api/conversations/")
        assert listed.status_code == 200
        assert [c["id"] for c in listed.json()["results"]] == [conversation]
        unsafe = [
            ("POST", "/api/conversations/"),
            ("PATCH", f"/api/conversations/{conversation}/"),
            ("DELETE", f"/api/conversations/{conversation}/"),
            ("POST", f"/api/conversations/{conversation}/messages/"),
            ("POST", f"/api/messages/{message}/cancel/"),
            ("POST", f"/api/messages/{message}/continue/"),
        ]
        for method, url in unsafe:
            response = browser.request(method, url, json={"title": "x", "content": "x"})
            error = assert_error(response, 403, "forbidden")
            assert "CSRF" in error["message"]
            wrong = browser.request(method, url, json={}, headers={"X-CSRFToken": "a" * 32})
            assert_error(wrong, 403, "forbidden")

        created = browser.post(
            "/api/conversations/", json={"title": "t"}, headers={"X-CSRFToken": csrf}
        )
        assert created.status_code == 201, created.text
        renamed = browser.patch(
            f"/api/conversations/{conversation}/",
            json={"title": "new"},
            headers={"X-CSRFToken": csrf},
        )
        assert renamed.json()["title"] == "new"


def test_django_test_client_with_csrf_checks(transactional_db, make_account):
    account = make_account("carol")
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(account.user)
    refused = browser.post("/api/conversations/", {"title": "x"}, content_type="application/json")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "forbidden"
    token = Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Token {account.token}")
    accepted = token.post("/api/conversations/", {"title": "x"}, content_type="application/json")
    assert accepted.status_code == 201


def test_an_empty_authorization_header_is_none(transactional_db, make_account):
    """Nothing but whitespace in it (DRF's token classes find no scheme): the session
    decides, as on the streams, which then hold the stream with that session."""
    account = make_account("erin")
    for blank in ("", " ", "\x0b"):
        browser = Client(HTTP_AUTHORIZATION=blank)
        browser.force_login(account.user)
        assert browser.get("/api/conversations/").status_code == 200, repr(blank)
        assert Client(HTTP_AUTHORIZATION=blank).get("/api/conversations/").status_code == 401


def test_drf_create_token_command_makes_a_working_token(transactional_db):
    from django.contrib.auth.models import User

    User.objects.create_user("dave", password="test-pass-123")
    result = subprocess.run(
        [sys.executable, "manage.py", "drf_create_token", "dave"],
        cwd=ROOT,
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    key = words[words.index("token") + 1]
    assert len(key) == 40
    api = Client(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.get("/api/conversations/").status_code == 200
    bearer = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert bearer.get("/api/conversations/").status_code == 200
    assert (
        Client(HTTP_AUTHORIZATION=f"Token {key[::-1]}").get("/api/conversations/").status_code
        == 401
    )


def test_one_authorization_header_means_the_same_everywhere(daphne, account):
    """The REST API (DRF) splits the header on any ASCII whitespace: the streams, the
    OpenAI endpoint and the WebSocket handshake read it the same way."""
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        message = post(api, conversation, "hi", wait=True, text="ok").json()["message"]["id"]
    taken, refused = 200, 401
    for header, expected in (
        (f"Token\t{account.token}", taken),
        (f"Bearer  {account.token}", taken),
        (f"Token {account.token} x", refused),
        (f"Token\xa0{account.token}", refused),
    ):
        with httpx.Client(
            base_url=server.url, headers={"Authorization": header.encode("latin-1")}
        ) as caller:
            for path in ("/api/conversations/", f"/api/messages/{message}/stream/", "/v1/models"):
                assert caller.get(path).status_code == expected, (header, path)
    # Two headers are one, their values joined by a comma (as Django reads them): no token.
    twice = [("Authorization", f"Token {account.token}")] * 2
    with httpx.Client(base_url=server.url) as caller:
        for path in ("/api/conversations/", f"/api/messages/{message}/stream/", "/v1/models"):
            assert caller.get(path, headers=twice).status_code == refused, path


def test_a_header_of_another_scheme_is_never_taken_for_the_session(daphne, account):
    """With the session cookie and an ``Authorization`` header that is no token (Basic,
    Digest, anything), every entry point answers 401 as for a wrong token: the REST API
    served the cookie's user, and a one-step post made an answer whose stream then found
    no user and ended at once, leaving the answer to be abandoned."""
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
    csrf = get_random_string(32)
    cookies = {"sessionid": _session_cookie(account), "csrftoken": csrf}
    other = {"Authorization": "Basic YWxpY2U6c2VjcmV0", "X-CSRFToken": csrf}
    url = f"/api/conversations/{conversation}/messages/"
    with httpx.Client(base_url=server.url, cookies=cookies, timeout=30) as browser:
        assert browser.get("/api/conversations/").status_code == 200, "the cookie alone works"
        for response in (
            browser.get("/api/conversations/", headers=other),
            browser.post("/api/conversations/", json={}, headers=other),
            browser.post(url, json={"content": "hi"}, headers=other),
            browser.post(
                url, json={"content": "hi"}, headers={**other, "Accept": "text/event-stream"}
            ),
        ):
            assert_error(response, 401, "not_authenticated")
        listed = browser.get(url)
        assert listed.json()["count"] == 0, "nothing was made"
