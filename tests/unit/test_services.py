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

from streaming import database, services
from streaming.errors import Conflict, StopUnconfirmed
from streaming.models import Conversation, Message
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


async def test_a_branch_stop_no_process_confirms_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = await create_answer("tests:services:a", content="Hel", last_seq=3)

    async def reaches_nobody(message_ids: list[str], **kwargs: Any) -> None:
        pass  # the generating process is gone: nothing ends the answer

    monkeypatch.setattr(services, "stop_answers", reaches_nobody)
    with pytest.raises(StopUnconfirmed) as unconfirmed:
        await services.stop_branch(await owner_of(answer.user_id), answer.message_id)
    assert unconfirmed.value.status == 503 and unconfirmed.value.retry_after


@pytest.mark.parametrize("meanwhile", ["an answer below", "a Continue"])
async def test_a_branch_stop_is_not_unconfirmed_by_what_started_after_it(
    monkeypatch: pytest.MonkeyPatch, meanwhile: str
) -> None:
    """The stopped answer ended; what streams now was started after the stop (by a racing
    request): the request that stopped finds it and refuses (409), no process is in doubt."""
    answer = await create_answer("tests:services:a", content="Hel", last_seq=3)

    def start_below() -> None:
        stopped = Message.objects.get(id=answer.message_id)
        Message.objects.create(
            conversation_id=stopped.conversation_id,
            parent=stopped,
            role=Message.Role.ASSISTANT,
            status=Status.STREAMING,
        )

    async def stop_then_another_write(message_ids: list[str], **kwargs: Any) -> None:
        await database.run(
            lambda: Message.objects.filter(id=answer.message_id).update(status=Status.CANCELLED)
        )
        if meanwhile == "a Continue":
            await add_segment(answer.message_id, 1, 5, "tests:services:b")
        else:
            await database.run(start_below)

    monkeypatch.setattr(services, "stop_answers", stop_then_another_write)
    await services.stop_branch(await owner_of(answer.user_id), answer.message_id)


@pytest.mark.parametrize("meanwhile", ["a Continue", "nothing ends it"])
async def test_a_delete_stops_what_streams_until_the_rows_go(
    monkeypatch: pytest.MonkeyPatch, meanwhile: str
) -> None:
    """A Continue that lands between the delete's Stop and its locks is a new segment of
    the stopped answer: stopped in turn before the rows go (it was deleted as it was, and
    streamed on). One whose Stop no process confirms goes as it is, and is stopped once
    more after: a Stop sent before its generation started reaches it then."""
    answer = await create_answer("tests:services:a", content="Hel", last_seq=3)
    stops: list[tuple[list[str], Any]] = []

    async def stop(message_ids: list[str], **kwargs: Any) -> None:
        stops.append((message_ids, kwargs.get("wait")))
        if meanwhile == "nothing ends it":
            return
        await database.run(
            lambda: Message.objects.filter(id=answer.message_id).update(status=Status.CANCELLED)
        )
        if len(stops) == 1:
            await add_segment(answer.message_id, 1, 5, "tests:services:b")

    async def drop_logs(message_ids: list[str]) -> None:
        pass  # the logs are not what is asked here

    loop = asyncio.get_running_loop()
    monkeypatch.setattr(services, "stop_answers", stop)
    monkeypatch.setattr(services, "_drop_logs", drop_logs)
    monkeypatch.setattr(
        services,
        "call",
        lambda fn, *args, **kwargs: asyncio.run_coroutine_threadsafe(
            fn(*args, **kwargs), loop
        ).result(),
    )
    chosen = Conversation.objects.filter(pk=answer.conversation_id)
    assert await database.run(services.delete_conversations, chosen) == 1
    assert not await database.run(Message.objects.filter(id=answer.message_id).exists)
    mine = [answer.message_id]
    if meanwhile == "a Continue":
        assert stops == [(mine, None), (mine, None)]
    else:
        assert stops == [(mine, None), (mine, 0)]


def test_the_prompt_holds_an_empty_tool_result_but_not_an_empty_answer() -> None:
    """A tool that printed nothing answered its call: its result is a turn, as the call
    is. An answer that said nothing (it failed, or was cut before its first token) is not."""
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    conversation = Conversation(system_prompt="be brief")
    path = [
        Message(role=Message.Role.USER, content="look it up"),
        Message(role=Message.Role.ASSISTANT, content="", tool_calls=[call]),
        Message(role=Message.Role.TOOL, content="", tool_call_id="call_1"),
        Message(role=Message.Role.ASSISTANT, content="", status=Status.ERROR),
    ]
    turns = services._turns(conversation, path)
    assert [(t.role, t.content, t.tool_call_id) for t in turns] == [
        ("system", "be brief", ""),
        ("user", "look it up", ""),
        ("assistant", "", ""),
        ("tool", "", "call_1"),
    ]
    assert turns[2].tool_calls == (call,)
