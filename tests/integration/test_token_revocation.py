"""A deleted API token stops working in every process, through control, long before the
token cache's lifetime: REST and streams alike, on two Daphne processes and Redis."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
from rest_framework.authtoken.models import Token

from tests.support.clients import auth
from tests.support.servers import ROOT, server_env

# The servers' cache lifetime: a refusal well inside it can only be the revocation.
CACHE_SECONDS = 300
DEADLINE = 20.0


def refused_within(client: httpx.Client, url: str, token: str, deadline: float) -> bool:
    # Polling: the revocation's arrival in another process is that process's state, which
    # nothing outside it can await.
    while time.monotonic() < deadline:
        if client.get(url, headers=auth(token)).status_code == 401:
            return True
        time.sleep(0.05)
    return False


def test_a_deleted_token_is_refused_by_every_process(daphne, account, needs_redis):
    env = {"STREAM_TOKEN_CACHE_SECONDS": str(CACHE_SECONDS)}
    servers = [daphne("a", **env), daphne("b", **env)]
    clients = [httpx.Client(base_url=server.url, timeout=30) for server in servers]
    try:
        for client in clients:
            for _ in range(2):  # the second is served from that process's cache
                listed = client.get("/api/conversations/", headers=auth(account.token))
                assert listed.status_code == 200, listed.text
        created = clients[0].post(
            "/api/conversations/", json={"title": "t"}, headers=auth(account.token)
        )
        conversation = created.json()["id"]
        stream_probe = f"/api/conversations/{conversation}/"

        # Deleted here, in the test process: its commit is sent to every process.
        Token.objects.filter(key=account.token).delete()
        deadline = time.monotonic() + DEADLINE
        for client in clients:
            assert refused_within(client, "/api/conversations/", account.token, deadline)
            assert client.get(stream_probe, headers=auth(account.token)).status_code == 401
            stream = client.get(
                f"/api/messages/{conversation}/stream/", headers=auth(account.token)
            )
            assert stream.status_code == 401, "the streams' own authentication, too"
    finally:
        for client in clients:
            client.close()


def test_without_redis_a_token_replaced_elsewhere_is_refused_at_once(daphne, account):
    """On the embedded defaults, control reaches only the server's own process: a change
    made by another one (here the test's, as `manage.py drf_create_token -r` would) is
    never told to it, so it keeps no token to go stale."""
    server = daphne(REDIS_URL=None)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for _ in range(2):  # a cache would serve the second
            assert client.get("/api/conversations/", headers=auth(account.token)).status_code == 200
        Token.objects.filter(key=account.token).delete()
        assert client.get("/api/conversations/", headers=auth(account.token)).status_code == 401


def test_a_token_deleted_by_a_command_that_exits_at_once_is_refused(daphne, account, needs_redis):
    """A process that serves nothing (`manage.py shell`, `drf_create_token -r`) exits
    right after its change commits: its revocation is sent before it does."""
    server = daphne(STREAM_TOKEN_CACHE_SECONDS=str(CACHE_SECONDS))
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for _ in range(2):  # the second is served from the server's cache
            assert client.get("/api/conversations/", headers=auth(account.token)).status_code == 200
        code = (
            "from rest_framework.authtoken.models import Token;"
            f"Token.objects.filter(key={account.token!r}).delete()"
        )
        subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", code],
            cwd=ROOT,
            env=server_env(),
            check=True,
            timeout=60,
        )
        deadline = time.monotonic() + DEADLINE
        assert refused_within(client, "/api/conversations/", account.token, deadline)
