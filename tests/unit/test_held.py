"""Open HTTP streams and their credentials: a stream runs to its end unless a revocation
of its user finds its credentials gone; any other cancellation goes on as it came."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from streaming.transports import held

pytestmark = pytest.mark.asyncio


class User:
    def __init__(self, pk: int | None) -> None:
        self.pk = pk
        self.is_authenticated = pk is not None


@pytest.fixture
def who(monkeypatch: pytest.MonkeyPatch) -> dict[str, int | None]:
    """Whom each scope's credentials resolve to now (``scope["name"]`` -> pk)."""
    now: dict[str, int | None] = {}

    async def authenticate(scope: dict[str, Any]) -> User:
        return User(now.get(scope["name"]))

    monkeypatch.setattr(held, "authenticate", authenticate)
    return now


async def forever(started: asyncio.Event) -> None:
    started.set()
    await asyncio.Event().wait()


async def until_checked(streams: held.OpenStreams) -> None:
    while streams.checks:
        await asyncio.gather(*streams.checks)


async def test_a_stream_that_ends_says_so() -> None:
    streams = held.OpenStreams()
    assert await streams.run({"name": "a"}, 1, asyncio.sleep(0)) is True
    assert not streams.held


async def test_a_revocation_ends_only_the_streams_it_took_the_credentials_of(who) -> None:
    streams = held.OpenStreams()
    who.update(mine=1, other=2, switched=1)
    started = {name: asyncio.Event() for name in who}
    runs = {
        name: asyncio.create_task(streams.run({"name": name}, who[name], forever(started[name])))
        for name in who
    }
    for event in started.values():
        await event.wait()

    streams.revoked(1)  # the user's credentials still stand: nothing ends
    await until_checked(streams)
    assert not any(run.done() for run in runs.values())

    # Now they are gone, or resolve to another user (a session signed in again as them).
    who.update(mine=None, switched=2)
    streams.revoked(1)
    await until_checked(streams)
    assert await runs["mine"] is False
    assert await runs["switched"] is False
    assert not runs["other"].done()
    runs["other"].cancel()
    with pytest.raises(asyncio.CancelledError):
        await runs["other"]  # any other cancellation goes on
    assert not streams.held


async def test_a_sessions_stream_is_checked_again_until_its_session_is_gone(
    who, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check that could not tell (the database away) arms the next one all the same."""
    monkeypatch.setattr(held, "session_recheck_delay", lambda: 0.001)
    checks = 0
    resolve = held.authenticate

    async def authenticate(scope: dict[str, Any]) -> User:
        nonlocal checks
        checks += 1
        if checks == 1:
            raise ConnectionError("the database is away")
        if checks == 3:
            who.clear()  # the session expired
        return await resolve(scope)

    monkeypatch.setattr(held, "authenticate", authenticate)
    who.update(mine=1)
    streams = held.OpenStreams()
    started = asyncio.Event()
    ran = await asyncio.wait_for(streams.run({"name": "mine"}, 1, forever(started)), 5)
    assert ran is False, "ended by the check after its session went"
    assert checks == 3


async def test_only_a_stream_that_sent_no_token_is_checked_again_as_a_sessions(
    who, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty ``Authorization`` header is no token: the stream was opened with its
    session, which ends by age too."""
    monkeypatch.setattr(held, "session_recheck_delay", lambda: 3600.0)
    streams = held.OpenStreams()
    sent = {
        "none": [],
        "empty": [b""],
        "blank": [b"  "],
        "token": [b"Token k"],
        "basic": [b"Basic k"],
    }
    started = {name: asyncio.Event() for name in sent}
    runs = [
        asyncio.create_task(
            streams.run(
                {"name": name, "headers": [(b"authorization", v) for v in values]},
                1,
                forever(started[name]),
            )
        )
        for name, values in sent.items()
    ]
    for event in started.values():
        await event.wait()
    rechecked = {h.scope["name"] for h in streams.held if h.recheck is not None}
    assert rechecked == {"none", "empty", "blank"}
    for run in runs:
        run.cancel()
    await asyncio.gather(*runs, return_exceptions=True)
    assert not streams.held
