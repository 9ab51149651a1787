"""Who is on the other end of a stream: a token the process holds is resolved on the
event loop, anything else in one database trip."""

from __future__ import annotations

from typing import Any

import pytest
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
        ("", None),
    ],
)
def test_a_header_names_the_key_the_rest_api_reads(header: str | None, key: str | None) -> None:
    assert auth.token_from_header(header) == key
