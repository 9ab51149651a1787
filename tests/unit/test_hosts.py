"""The Host check of the Channels routes decides as Django's ``get_host`` does."""

from __future__ import annotations

from typing import Any

import pytest

from streaming.transports.hosts import allowed_host


def scope(host: bytes | None, server: tuple[str, int] | None = ("127.0.0.1", 8000)) -> dict:
    headers = [] if host is None else [(b"host", host)]
    return {"type": "http", "headers": headers, "server": server}


@pytest.mark.parametrize(
    ("host", "server", "allowed"),
    [
        (b"127.0.0.1:8000", None, "127.0.0.1:8000"),
        (b"chat.example.com", None, "chat.example.com"),
        (b"eu.example.org:443", None, "eu.example.org:443"),
        (b"evil.example", None, None),
        (b"chat.example.com.evil.example", None, None),
        (b"", ("127.0.0.1", 8000), None),  # present but empty: Django refuses it too
        (None, ("127.0.0.1", 8000), "127.0.0.1:8000"),
        (None, ("10.0.0.9", 8000), None),
        (None, None, None),
    ],
)
def test_only_the_hosts_allowed_pass(
    settings: Any, host: bytes | None, server: Any, allowed: str | None
) -> None:
    settings.ALLOWED_HOSTS = ["127.0.0.1", "chat.example.com", ".example.org"]
    assert allowed_host(scope(host, server)) == allowed


def test_debug_with_no_hosts_allows_the_local_names_as_django_does(settings: Any) -> None:
    settings.DEBUG, settings.ALLOWED_HOSTS = True, []
    assert allowed_host(scope(b"app.localhost:8000")) == "app.localhost:8000"
    assert allowed_host(scope(b"[::1]:8000")) == "[::1]:8000"
    assert allowed_host(scope(b"example.com")) is None
