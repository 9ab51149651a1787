"""Titles from the engine: what a title is made of, when one is asked for, and that the
person's own title always wins. The engine is scripted; the rows are real."""

from __future__ import annotations

import pytest
from django.test import override_settings

from streaming import database
from streaming.models import Conversation, Message, Segment
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


async def answer_after(
    *earlier: tuple[str, str],
    content: str = "It is Paris.",
    title: str = "Capital of France?",
    source: str = "question",
) -> str:
    """A complete answer the engine gave below ``earlier``, (role, content) from the
    conversation's first message down: role "engine" is an answer the engine gave (with
    its segment), "assistant" an earlier turn an OpenAI call sent (none)."""
    answer = await create_answer("tests:titling", content=content)

    def shape() -> None:
        parent = None
        for role, said in earlier:
            parent = Message.objects.create(
                conversation_id=answer.conversation_id,
                parent=parent,
                role="assistant" if role == "engine" else role,
                content=said,
            )
            if role == "engine":
                Segment.objects.create(message=parent, index=0, status=Status.COMPLETE)
        Message.objects.filter(id=answer.message_id).update(parent=parent, status=Status.COMPLETE)
        Conversation.objects.filter(id=answer.conversation_id).update(
            title=title, title_source=source
        )

    await database.run(shape)
    return answer.message_id


async def first_answer(title: str, source: str) -> str:
    return await answer_after(("user", "Capital of France?"), title=title, source=source)


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


def titler() -> ScriptedEngine:
    return ScriptedEngine([chunk("A title"), chunk(finish_reason="stop")])


async def test_a_conversation_made_with_history_is_titled_by_its_first_question() -> None:
    """An OpenAI call's earlier turns hold no answer of the engine's: its conversation is
    new, and is about what it was first asked, not the last message, the one answered."""
    message_id = await answer_after(
        ("user", "Capital of France?"),
        ("assistant", "Paris."),
        ("user", "And of Spain?"),
        content="It is Madrid.",
    )
    engine = titler()
    await title_conversation(message_id, engine)
    assert await title_of(message_id) == ("A title", "model")
    [request] = engine.requests
    assert "Capital of France?" in request.messages[-1].content
    assert "And of Spain?" not in request.messages[-1].content
    assert "It is Madrid." in request.messages[-1].content


async def test_a_later_turn_does_not_title() -> None:
    """Below an answer the engine gave, even when that answer's title never came."""
    message_id = await answer_after(
        ("user", "Capital of France?"),
        ("engine", "It is Paris."),
        ("user", "And of Spain?"),
        content="It is Madrid.",
    )
    engine = titler()
    await title_conversation(message_id, engine)
    assert await title_of(message_id) == ("Capital of France?", "question")
    assert engine.requests == []


async def test_an_answer_without_text_does_not_title() -> None:
    message_id = await answer_after(("user", "What time is it in Tokyo?"), content="")
    engine = titler()
    await title_conversation(message_id, engine)
    assert engine.requests == []


async def test_the_answer_to_a_tool_result_is_titled_by_the_question() -> None:
    """A tool call without text is no answer yet: the answer to its result titles, by the
    question, not by the tool's output."""
    message_id = await answer_after(
        ("user", "What time is it in Tokyo?"),
        ("engine", ""),
        ("tool", "09:00"),
        content="It is nine in Tokyo.",
    )
    engine = titler()
    await title_conversation(message_id, engine)
    [request] = engine.requests
    assert "What time is it in Tokyo?" in request.messages[-1].content
    assert "09:00" not in request.messages[-1].content
