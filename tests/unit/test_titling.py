"""Titles from the engine: what a title is made of, when one is asked for, and that the
person's own title always wins. The engine is scripted; the rows are real."""

from __future__ import annotations

import pytest
from django.test import override_settings

from streaming import database
from streaming.models import Conversation, Message
from streaming.termination import Status
from streaming.titling import MAX_TITLE_CHARS, clean, title_conversation, wanted
from tests.unit.scripted import ScriptedEngine, chunk, create_answer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("said", "title"),
    [
        ("Paris, the capital", "Paris, the capital"),
        ('"Paris, the capital."\nand more lines', "Paris, the capital"),
        ("\n\n  Title: **Backpressure in streams**  ", "Backpressure in streams"),
        ("# Heading  with   spaces", "Heading with spaces"),
        ("«Bonjour»", "Bonjour"),
        ("a\x00b", "a\ufffdb"),
        ("", ""),
    ],
)
def test_a_title_is_one_clean_line(said: str, title: str) -> None:
    assert clean(said) == title


def test_a_title_is_bounded() -> None:
    assert len(clean("word " * 100)) <= MAX_TITLE_CHARS


def test_the_simulated_engine_is_not_asked_unless_titles_are_on() -> None:
    simulated, real = ScriptedEngine([], accepts_simulation=True), ScriptedEngine([])
    assert not wanted(simulated) and wanted(real)
    with override_settings(STREAMING={"TITLES": "false"}):
        assert not wanted(real)
    with override_settings(STREAMING={"TITLES": "true"}):
        assert wanted(simulated)


async def first_answer(title: str, source: str) -> str:
    answer = await create_answer("tests:titling", content="It is Paris.")

    def shape() -> None:
        message = Message.objects.get(id=answer.message_id)
        question = Message.objects.create(
            conversation_id=answer.conversation_id, role="user", content="Capital of France?"
        )
        message.parent = question
        message.status = Status.COMPLETE
        message.save()
        Conversation.objects.filter(id=answer.conversation_id).update(
            title=title, title_source=source
        )

    await database.run(shape)
    return answer.message_id


async def title_of(message_id: str) -> tuple[str, str]:
    def read() -> tuple[str, str]:
        c = Message.objects.select_related("conversation").get(id=message_id).conversation
        return c.title, c.title_source

    return await database.run(read)


async def test_a_placeholder_title_is_replaced_by_the_engines() -> None:
    message_id = await first_answer("Capital of France?", "question")
    engine = ScriptedEngine(
        [chunk('"The capital'), chunk(' of France"'), chunk(finish_reason="stop")]
    )
    await title_conversation(message_id, engine)
    assert await title_of(message_id) == ("The capital of France", "model")
    [request] = engine.requests
    assert "Capital of France?" in request.messages[-1].content
    assert "It is Paris." in request.messages[-1].content
    assert request.max_tokens == 16


async def test_the_persons_title_is_never_replaced() -> None:
    message_id = await first_answer("Mine", "user")
    engine = ScriptedEngine([chunk("Other"), chunk(finish_reason="stop")])
    await title_conversation(message_id, engine)
    assert await title_of(message_id) == ("Mine", "user")
    assert engine.requests == [], "not even asked"


async def test_an_engine_title_is_written_once() -> None:
    message_id = await first_answer("Already", "model")
    engine = ScriptedEngine([chunk("Again"), chunk(finish_reason="stop")])
    await title_conversation(message_id, engine)
    assert await title_of(message_id) == ("Already", "model")
    assert engine.requests == []


async def test_a_failing_engine_leaves_the_placeholder() -> None:
    message_id = await first_answer("Capital of France?", "question")
    engine = ScriptedEngine([chunk("Half"), RuntimeError("engine down")])
    await title_conversation(message_id, engine)  # no exception
    assert await title_of(message_id) == ("Capital of France?", "question")
