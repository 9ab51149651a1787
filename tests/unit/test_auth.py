"""Who is on the other end of a stream: a token the process holds is resolved on the
event loop, anything else in one database trip."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from rest_framework.authtoken.models import Token

from streaming import auth, database, tokens

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


@pytest.fixture
def lookups(trips: list[str], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The database work of token lookups, in order: ``trips`` (the calls sent to a
    database thread), and "statement" for each statement sent from the event loop."""
    send = database.statement

    async def counted(*args: Any, **kwargs: Any) -> Any:
        trips.append("statement")
        return await send(*args, **kwargs)

    monkeypatch.setattr(database, "statement", counted)
    return trips


# A token's lookup: on PostgreSQL a statement from the event loop, else a database thread's.
LOOKUP = "statement" if connection.vendor == "postgresql" else "_user_for_token"


async def test_a_token_is_looked_up_once_then_held(token: Token, lookups: list[str]) -> None:
    first = await auth.authenticate(_scope(f"Bearer {token.key}"))
    assert first.pk == token.user_id and lookups == [LOOKUP]
    assert isinstance(first, User) and first.username == "caller" and first.is_active
    again = await auth.authenticate(_scope(f"Token {token.key}"))
    assert again.pk == token.user_id and lookups == [LOOKUP]
    assert again is not first, "each caller gets an instance of its own"
    assert (await auth.user_for_token(token.key)).pk == token.user_id
    assert lookups == [LOOKUP]


async def test_an_unknown_or_malformed_token_is_anonymous(token: Token, lookups: list[str]) -> None:
    assert not (await auth.authenticate(_scope("Token " + "0" * 40))).is_authenticated
    assert not (await auth.authenticate(_scope("Token"))).is_authenticated
    assert not (await auth.user_for_token("0" * 40)).is_authenticated
    assert not (await auth.user_for_token("\x00")).is_authenticated
    assert lookups == [LOOKUP, LOOKUP], "a malformed header or key is not looked up"


async def test_an_inactive_users_token_is_anonymous_and_not_held(
    token: Token, lookups: list[str]
) -> None:
    await User.objects.filter(pk=token.user_id).aupdate(is_active=False)
    assert not (await auth.user_for_token(token.key)).is_authenticated
    assert not (await auth.user_for_token(token.key)).is_authenticated
    assert lookups == [LOOKUP, LOOKUP]


async def test_a_session_is_read_in_a_database_thread(lookups: list[str]) -> None:
    scope = {"type": "websocket", "headers": [], "session": None}
    assert not (await auth.authenticate(scope)).is_authenticated
    assert lookups == ["session_user"]


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
