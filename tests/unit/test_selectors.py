"""What a reader of an answer may follow: the owner's answer that streams in this process
is known without a database trip; anyone else's, one that is ending, or a caller this
process cannot name without a query, is the database's to answer, as before.

The registry is the process's own (``get_runtime().generations``) with real rows behind
it; the generations run on a scripted engine held at a gate.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from streaming import database, selectors, tokens
from streaming.errors import NotFound
from streaming.generation import Backends, Generation
from streaming.hub import Hub
from streaming.presence.memory import MemoryPresence
from streaming.reading import MessageState
from streaming.runtime import get_runtime
from streaming.streamlog.memory import MemoryStreamLog
from streaming.termination import Status
from tests.unit.scripted import Answer, Gate, ScriptedEngine, chunk, create_answer, plan_for

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "tests:selectors:1"
HANG = 10.0


@pytest.fixture(autouse=True)
def held_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's token cache, emptied and keeping what it looks up whatever the
    suite's settings say (the embedded defaults keep nothing)."""
    tokens.cache().clear()
    monkeypatch.setattr(tokens.cache(), "seconds", 30.0)


def _scope(key: str | None, scheme: str = "Token") -> dict[str, Any]:
    headers = [] if key is None else [(b"authorization", f"{scheme} {key}".encode())]
    return {"type": "http", "headers": headers}


async def _held_token(user_id: int) -> str:
    """A token of the user, held by this process (looked up once)."""
    token = await database.run(Token.objects.create, user_id=user_id)
    assert (await selectors.reader_state(_scope(token.key), "none"))[0].pk == user_id
    return str(token.key)


async def _streaming(answer: Answer, **plan: Any) -> tuple[Generation, Gate]:
    """A generation of ``answer`` in this process's registry, waiting on its engine."""
    log = MemoryStreamLog()
    registry = get_runtime().generations
    presence = MemoryPresence(worker_id=WORKER, listener=registry)
    gate = Gate()
    engine = ScriptedEngine([chunk("a"), gate, chunk("b")])
    generation = registry.launch(
        plan_for(answer, **plan), Backends(log, Hub(log), presence, engine)
    )
    await asyncio.wait_for(gate.reached.wait(), HANG)
    return generation, gate


async def _ended(generation: Generation, gate: Gate) -> None:
    gate.open()
    await asyncio.wait_for(generation.finished.wait(), HANG)


async def test_the_owner_follows_an_answer_streaming_here_without_a_trip(
    trips: list[str],
) -> None:
    answer = await create_answer(WORKER)
    key = await _held_token(answer.user_id)
    generation, gate = await _streaming(answer)
    owner = await database.run(User.objects.get, pk=answer.user_id)
    trips.clear()
    who, state = await selectors.reader_state(_scope(key), answer.message_id)
    assert who.pk == answer.user_id
    assert state == MessageState.streaming(answer.message_id, 0)
    assert await selectors.message_state(owner, answer.message_id) == state
    assert trips == []
    # As the database has it: streaming, so a reader follows the log live.
    stored = await database.run(selectors._state, owner, answer.message_id)
    assert (stored.status, stored.final) == (state.status, state.final) == ("streaming", False)
    await _ended(generation, gate)


async def test_a_continues_segment_is_followed_from_where_the_earlier_ones_end(
    trips: list[str],
) -> None:
    answer = await create_answer(WORKER, content="Hel", last_seq=4)
    key = await _held_token(answer.user_id)
    generation, gate = await _streaming(answer, segment_index=1, first_seq=5, base_text="Hel")
    _, state = await selectors.reader_state(_scope(key), answer.message_id)
    # A `done` at or below 4 ended the earlier segment, not this stream.
    assert state == MessageState.streaming(answer.message_id, 4)
    await _ended(generation, gate)


async def test_anyone_else_is_answered_by_the_database(trips: list[str]) -> None:
    answer = await create_answer(WORKER)
    other = await create_answer(WORKER)
    key = await _held_token(other.user_id)
    generation, gate = await _streaming(answer)
    stranger = await database.run(User.objects.get, pk=other.user_id)
    trips.clear()
    who, state = await selectors.reader_state(_scope(key), answer.message_id)
    assert (who.pk, state) == (other.user_id, None)
    with pytest.raises(NotFound):
        await selectors.message_state(stranger, answer.message_id)
    # No credentials this process can name without a query: the database resolves them.
    who, state = await selectors.reader_state(_scope(None), answer.message_id)
    assert (who.is_authenticated, state) == (False, None)
    assert trips == ["_reader", "_state", "_reader"]
    await _ended(generation, gate)


async def test_an_answer_asked_to_end_is_read_from_the_database(trips: list[str]) -> None:
    answer = await create_answer(WORKER)
    key = await _held_token(answer.user_id)
    generation, gate = await _streaming(answer)
    assert generation.cancel(Status.CANCELLED.value)
    trips.clear()
    _, state = await selectors.reader_state(_scope(key), answer.message_id)
    assert "_reader" in trips, "its end is on its way (its final write runs meanwhile)"
    assert state is not None and state.id == answer.message_id
    await asyncio.wait_for(generation.finished.wait(), HANG)
    trips.clear()
    _, state = await selectors.reader_state(_scope(key), answer.message_id)
    assert trips == ["_reader"]
    assert state is not None and state.status == Status.CANCELLED
    gate.open()


async def test_a_caller_known_to_be_anonymous_costs_no_trip(trips: list[str]) -> None:
    answer = await create_answer(WORKER)
    key = await _held_token(answer.user_id)
    generation, gate = await _streaming(answer)
    trips.clear()
    for scope in (_scope("abc", scheme="Basic"), _scope(key, scheme="Token x")):
        who, state = await selectors.reader_state(scope, answer.message_id)
        assert (who.is_authenticated, state) == (False, None)
    assert trips == []
    await _ended(generation, gate)
