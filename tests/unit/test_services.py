"""The write services' rules that only an interleaving shows: a Stop against a Continue.

``stop_answers`` is the seam where the interleaving is injected (the Stop is "on its
way" while the test lands the other writer's change); everything else is real: the
database rows, the lookups, the error.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from streaming import database, services
from streaming.errors import Conflict, TooManyGenerations
from streaming.generation import Generation
from streaming.models import Message
from streaming.runtime import get_runtime
from streaming.termination import Status
from tests.unit.scripted import add_segment, create_answer, load_message

pytestmark = pytest.mark.django_db(transaction=True)


async def owner_of(user_id: int) -> User:
    return await database.run(User.objects.get, pk=user_id)


async def test_a_stop_that_a_continue_overtook_is_refused_not_reported_streaming(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answer = await create_answer("tests:services:a", content="Hel", last_seq=3)

    async def stop_while_a_continue_lands(message_ids: list[str], **kwargs: Any) -> None:
        # Segment 0 ends as stopped, and a Continue starts segment 1 before the Stop's
        # caller reads the message again.
        await database.run(
            lambda: Message.objects.filter(id=answer.message_id).update(status=Status.CANCELLED)
        )
        await add_segment(answer.message_id, 1, 5, "tests:services:b")

    monkeypatch.setattr(services, "stop_answers", stop_while_a_continue_lands)
    with pytest.raises(Conflict) as refused:
        await services.cancel_message(await owner_of(answer.user_id), answer.message_id)
    assert refused.value.status == 409
    assert "new segment" in refused.value.message
    assert (await load_message(answer.message_id)).status == Status.STREAMING, "left running"


async def test_a_stop_answers_with_the_final_state(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = await create_answer("tests:services:a", content="Hel", last_seq=3)

    async def stop_and_end(message_ids: list[str], **kwargs: Any) -> None:
        await database.run(
            lambda: Message.objects.filter(id=answer.message_id).update(status=Status.CANCELLED)
        )

    monkeypatch.setattr(services, "stop_answers", stop_and_end)
    stopped = await services.cancel_message(await owner_of(answer.user_id), answer.message_id)
    assert stopped.status == Status.CANCELLED


on_the_loop = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="a post's transaction on the loop"
)


async def ended(generation: Generation) -> None:
    """Wait for ``generation``, which runs on the runtime's own loop (not bound to the
    test's, it runs one in a thread, as for a request thread's post)."""
    loop = get_runtime().loop
    assert loop is not None
    ending = asyncio.run_coroutine_threadsafe(generation.finished.wait(), loop)
    await asyncio.wait_for(asyncio.wrap_future(ending), 10)


@on_the_loop
async def test_a_post_goes_to_no_database_thread(trips: list[str]) -> None:
    """A post's transaction runs on the event loop: its rows are committed and its answer
    streams without a trip to a database thread, and the feed hears of it."""
    user = await database.run(User.objects.create_user, "poster")
    trips.clear()
    runtime = get_runtime()
    told: list[tuple[int, list[dict[str, Any]]]] = []
    notify = runtime.notify
    runtime.notify = lambda user_id, events: told.append((user_id, events))  # type: ignore[method-assign]
    try:
        exchange = await services.post_message(
            user,
            None,
            "hello",
            {"simulation": {"length": 3, "ttft_ms": 0, "tokens_per_second": 1000}},
        )
    finally:
        runtime.notify = notify  # type: ignore[method-assign]
    assert trips == []
    assert exchange.generation is not None and exchange.user_message is not None
    await ended(exchange.generation)
    answer = await load_message(str(exchange.assistant_message.id))
    assert answer.status == Status.COMPLETE and answer.content
    assert [event["event"] for _, batch in told for event in batch] == [
        "conversation.created",
        "conversation.updated",
        "message.created",
    ]


@on_the_loop
async def test_a_refused_post_on_the_loop_makes_nothing(trips: list[str], settings: Any) -> None:
    settings.MAX_CONCURRENT_GENERATIONS_PER_USER = 0
    user = await database.run(User.objects.create_user, "refused")
    with pytest.raises(TooManyGenerations):
        await services.post_message(user, None, "hello")
    assert trips == ["create_user"]
    assert not await Message.objects.aexists()


@on_the_loop
async def test_a_keys_retry_is_replayed_in_a_database_thread(trips: list[str]) -> None:
    user = await database.run(User.objects.create_user, "retries")
    simulation = {"simulation": {"length": 2, "ttft_ms": 0, "tokens_per_second": 1000}}
    first = await services.post_message(user, None, "hi", simulation, idempotency_key="k")
    assert first.generation is not None
    await ended(first.generation)
    trips.clear()
    again = await services.post_message(user, None, "hi", simulation, idempotency_key="k")
    assert again.generation is None and trips == ["_exchange_of"]
    assert again.assistant_message.id == first.assistant_message.id
