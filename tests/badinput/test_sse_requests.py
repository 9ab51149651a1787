"""What the SSE endpoint refuses before streaming: a request body (a stream takes none,
and must not hold one in memory for its whole length) and a missing credential (401 with
the challenge the REST API sends)."""

from __future__ import annotations

import httpx
import pytest

from tests.support.clients import auth, create_conversation, post_message

pytestmark = pytest.mark.asyncio


@pytest.fixture
def inactive(make_account):
    """An account whose user was deactivated: its token authenticates nobody."""
    made = make_account("inactive")
    type(made.user).objects.filter(pk=made.user.pk).update(is_active=False)
    return made


async def test_a_body_is_refused_and_a_401_names_the_scheme(daphne, account, inactive):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(client, account.token, conversation, "hi")
        url = f"/api/messages/{message['id']}/stream/"

        with_body = await client.request(
            "GET", url, headers=auth(account.token), content=b"x" * 4096
        )
        assert with_body.status_code == 400
        assert with_body.json()["error"]["code"] == "invalid_body"
        assert with_body.json()["error"]["field"] == "body"

        async def chunks():
            yield b"chunked"

        chunked = await client.request("GET", url, headers=auth(account.token), content=chunks())
        assert chunked.status_code == 400

        anonymous = await client.get(url)
        assert anonymous.status_code == 401
        assert anonymous.headers["www-authenticate"] == 'Token realm="api"'
        rest = await client.get(f"/api/messages/{message['id']}/")
        assert rest.headers["www-authenticate"] == anonymous.headers["www-authenticate"]
        assert anonymous.json()["error"]["message"] == rest.json()["error"]["message"]
        # A wrong key, an inactive user's, and a header that is no token (another scheme,
        # no key, a third part): the REST API's 401 and its words for each.
        sent_headers = (
            "Token not-a-key",
            f"Token {inactive.token}",
            "Basic abc",
            "Token",
            f"Token {account.token} x",
        )
        for sent in sent_headers:
            wrong = {"Authorization": sent}
            bad_key = await client.get(url, headers=wrong)
            rest = await client.get(f"/api/messages/{message['id']}/", headers=wrong)
            assert bad_key.status_code == rest.status_code == 401
            assert bad_key.json()["error"]["message"] == rest.json()["error"]["message"], sent

        served = await client.get(url, headers=auth(account.token))
        assert served.status_code == 200


async def test_a_host_django_refuses_is_refused_by_every_http_route(daphne, account):
    """ALLOWED_HOSTS holds for the streams and /v1 (Channels routes) as for the REST API:
    a made-up Host (a DNS-rebinding page's) answers 400 before anything else."""
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(client, account.token, conversation, "hi")
        paths = (
            f"/api/messages/{message['id']}/",
            f"/api/messages/{message['id']}/stream/",
            "/v1/models",
        )
        hosts = (("evil.example", {400}), ("", {400}), (f"localhost:{server.port}", {200, 204}))
        for host, answers in hosts:
            for path in paths:
                headers = {**auth(account.token), "Host": host, "Last-Event-ID": "999"}
                response = await client.get(path, headers=headers)
                assert response.status_code in answers, (host, path, response.text)
                if response.status_code == 400:
                    error = response.json()["error"]
                    assert error["status"] == 400, path
                    assert "Host header" in error["message"], (path, error)
    # Anyone can send a Host: each is answered, not logged as the server's error.
    assert "Traceback" not in server.log_text()
