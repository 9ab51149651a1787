"""Who is on the other end of a stream: a token the process holds is resolved on the
event loop, anything else in one database trip."""

from __future__ import annotations

from importlib import import_module
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from streaming import auth, tokens

pytestmark = pytest.mark.django_db(transaction=True)


def _scope(authorization: str) -> dict[str, Any]:
    return {"type": "websocket", "headers": [(b"authorization", authorization.encode())]}


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> Token:
    """A token, and the process's token cache emptied and keeping what it looks up
    whatever the suite's settings say (the embedded defaults keep nothing)."""
    tokens.cache().clear()
    monkeypatch.setattr(tokens.cache(), "seconds", 30.0)
    return Token.objects.create(user=User.objects.create_user("caller", password="pw-123456"))


async def test_a_held_token_needs_no_database_thread(token: Token, trips: list[str]) -> None:
    first = await auth.authenticate(_scope(f"Bearer {token.key}"))
    assert first.pk == token.user_id and trips == ["resolve_user"]
    again = await auth.authenticate(_scope(f"Token {token.key}"))
    assert again.pk == token.user_id and trips == ["resolve_user"]
    assert (await auth.user_for_token(token.key)).pk == token.user_id
    assert trips == ["resolve_user"]


async def test_an_unknown_or_malformed_token_is_anonymous(token: Token, trips: list[str]) -> None:
    assert not (await auth.authenticate(_scope("Token " + "0" * 40))).is_authenticated
    assert not (await auth.authenticate(_scope("Token"))).is_authenticated
    assert not (await auth.user_for_token("0" * 40)).is_authenticated
    assert trips == ["resolve_user", "_user_for_token"], "a malformed header is not looked up"


async def test_a_refusal_says_why_as_the_rest_api_does(token: Token) -> None:
    """Unknown key, inactive user, no token in the header, nothing sent: each 401 in the
    REST API's words, told from what resolving the caller gave (no query of its own)."""
    await sync_to_async(User.objects.filter(pk=token.user_id).update)(is_active=False)
    cases = {
        f"Token {token.key}": auth.INACTIVE,
        "Token " + "0" * 40: auth.INVALID_TOKEN,
        "Basic abc": auth.INVALID_HEADER,
        "": auth.NOT_PROVIDED,
    }
    for header, words in cases.items():
        scope = _scope(header)
        user = await auth.authenticate(scope)
        assert not user.is_authenticated
        assert auth.refusal(scope, user) == words, header


@pytest.mark.parametrize(
    ("header", "key"),
    [
        ("Token abc", "abc"),
        ("bearer abc", "abc"),
        ("Token\tabc", "abc"),
        ("  Token   abc  ", "abc"),
        ("Token a b", ""),
        ("Token", ""),
        ("Basic abc", ""),
        ("Token\xa0abc", ""),  # not ASCII whitespace: one part, as DRF reads it
        (None, None),
        ("", None),  # nothing in it: no header, as DRF's token classes read it
        (" \t\x0b", None),
    ],
)
def test_a_header_names_the_key_the_rest_api_reads(header: str | None, key: str | None) -> None:
    assert auth.token_from_header(header) == key


async def test_a_scope_outside_the_session_middleware_gets_its_cookies_session() -> None:
    """A one-step post's scope: its session is the one its cookie names, read afresh by
    every check, so a session that ends (a logout) ends what it authenticated."""
    user = await User.objects.acreate(username="browser")
    store = import_module(settings.SESSION_ENGINE).SessionStore()
    await sync_to_async(_sign_in)(store, user)
    cookie = f"csrftoken=x; {settings.SESSION_COOKIE_NAME}={store.session_key}; theme=dark"
    scope = {"type": "http", "headers": [(b"cookie", cookie.encode())]}

    held = auth.with_session(scope)
    assert (await auth.authenticate(held)).pk == user.pk
    assert not (await auth.authenticate(scope)).is_authenticated  # no session: nobody
    # An empty header is no header: the request was accepted with its session.
    for blank in (b"", b"  "):
        empty = {"type": "http", "headers": [*scope["headers"], (b"authorization", blank)]}
        assert auth.by_session(empty)
        assert (await auth.authenticate(auth.with_session(empty))).pk == user.pk
    await sync_to_async(store.flush)()
    assert not (await auth.authenticate(held)).is_authenticated

    with_token = {"type": "http", "headers": [*scope["headers"], (b"authorization", b"Token k")]}
    assert auth.with_session(with_token) is with_token  # a token never falls back
    assert auth.with_session(held) is held
    assert not (await auth.authenticate(auth.with_session({"type": "http"}))).is_authenticated


def _sign_in(store: Any, user: User) -> None:
    """What ``django.contrib.auth.login`` stores in a session."""
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.save()
