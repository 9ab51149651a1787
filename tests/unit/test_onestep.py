"""How a one-step stream ends: with the answer, with the client's leaving, or with the
server's cancellation, in the request's own task. The subscription is a stand-in (the
stream's events are the SSE tests'); what is checked is who ends the stream and what the
client is sent last."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from streaming.reading import MessageState
from streaming.transports import onestep

END = {"type": "http.response.body", "body": b"", "more_body": False}
STATE = MessageState(id="m", status="streaming", last_seq=0, termination={})


class Stand:
    """The stream's writer (``send_events``): runs until ``answer_ended`` is set."""

    def __init__(self) -> None:
        self.answer_ended = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled = False
        self.task: asyncio.Task[Any] | None = None

    async def send_events(self, subscription: Any, send: Any) -> None:
        self.task = asyncio.current_task()
        self.started.set()
        try:
            await self.answer_ended.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


@pytest.fixture
def stand(monkeypatch: pytest.MonkeyPatch) -> Stand:
    stand = Stand()
    monkeypatch.setattr(onestep.selectors, "subscription", lambda *args: None)
    monkeypatch.setattr(onestep, "SendBuffer", lambda send: None)
    monkeypatch.setattr(onestep, "send_events", stand.send_events)
    return stand


class Client:
    """The request's ``receive``: a leftover body message, then ``http.disconnect`` once
    ``leave`` is set."""

    def __init__(self) -> None:
        self.leave = asyncio.Event()
        self.messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive(self) -> dict[str, Any]:
        if self.messages:
            return self.messages.pop()
        await self.leave.wait()
        return {"type": "http.disconnect"}


def stream(client: Client, sent: list[dict[str, Any]]) -> asyncio.Task[None]:
    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    answers = onestep.OneStepAnswers(None)
    scope = {"type": "http", "headers": []}
    return asyncio.create_task(answers._stream(STATE, 1, scope, client.receive, send))


async def test_an_answer_that_ends_ends_the_body(stand: Stand) -> None:
    sent: list[dict[str, Any]] = []
    task = stream(Client(), sent)
    await stand.started.wait()
    stand.answer_ended.set()
    await task
    assert sent == [END]
    assert not stand.cancelled
    assert stand.task is task, "written by the request's own task, not a task beside it"


async def test_a_client_that_leaves_ends_the_stream_quietly(stand: Stand) -> None:
    sent: list[dict[str, Any]] = []
    client = Client()
    task = stream(client, sent)
    await stand.started.wait()
    client.leave.set()
    await task  # returns: the stream's own cancellation does not go on
    assert stand.cancelled, "the writer was stopped"
    assert task.cancelling() == 0
    assert sent == [], "nothing is written to a client that left"


async def test_the_servers_cancellation_goes_on(stand: Stand) -> None:
    sent: list[dict[str, Any]] = []
    task = stream(Client(), sent)
    await stand.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stand.cancelled
    assert sent == []


@pytest.mark.parametrize(
    ("accept", "streams"),
    [
        ("text/event-stream", True),
        ("application/json, text/event-stream;q=0.5", True),
        ("Text/Event-Stream; charset=utf-8", True),
        ("text/event-stream;q=0", False),  # refused by the client
        ("text/event-stream; q=0.000", False),
        ("application/json", False),
        ("text/event-streams", False),
        (None, False),
    ],
)
def test_a_post_asks_for_its_stream_with_accept(accept: str | None, streams: bool) -> None:
    headers = [] if accept is None else [(b"accept", accept.encode())]
    assert onestep.wants_stream({"type": "http", "method": "POST", "headers": headers}) is streams
    assert not onestep.wants_stream({"type": "http", "method": "GET", "headers": headers})
