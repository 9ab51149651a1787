"""Titles for conversations, written by the engine that gave the first answer, after it.

A conversation starts titled with its first question's first line (``title_source``
"question"). When that first answer completes, one small extra request (``TITLE_MAX_TOKENS``,
``TITLE_TIMEOUT``) asks the engine for a short title, which replaces the placeholder unless
the person set a title meanwhile ("user" is never overwritten). The request creates no
message, so it never counts against the user's concurrency limit, and its failure costs
nothing but the better title. ``TITLES``: "auto" asks every engine but the simulated one,
whose text is unrelated to the question (its conversations keep the question's line).

The first answer is the first one with text that the engine gave on its branch, and the
question is the branch's first user message, the one the placeholder quotes. An OpenAI
call's history (the earlier turns it sends, stored in the conversation it creates) holds
no answer of the engine's: such a conversation is new, and like any new conversation of a
chat product it is titled by what it was first asked, not by the last message, the one the
engine answered. An answer below one the engine gave (a later turn) never titles: the
conversation had an answer, and its title already says what it is about. Nor does an
answer without text (a tool call's; the answer to the tool's result titles instead). A
regenerated or edited first exchange titles only over a placeholder still there (the first
answer's title failed, or that answer never completed).
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from django.db.models import BooleanField, Case, Exists, OuterRef, Q, TextField, Value, When
from django.db.models.functions import Left

from streaming import database
from streaming.branches import Tree
from streaming.conf import streaming_settings
from streaming.detokenize import Detokenizer
from streaming.engines.base import ChatTurn, Engine, EngineRequest
from streaming.models import Conversation, Message, Segment
from streaming.runtime import get_runtime
from streaming.storable import storable

log = logging.getLogger(__name__)

MAX_TITLE_CHARS = 80
# How much of the question and the answer the title request shows the engine.
EXCERPT_CHARS = 2000
INSTRUCTION = (
    "Write a title of at most six words for the conversation below. "
    "Answer with the title only: no quotes, no punctuation at the end."
)
PLACEHOLDERS = ("", Conversation.TitleSource.QUESTION)


def wanted(engine: Engine) -> bool:
    setting = str(streaming_settings.TITLES).strip().lower()
    if setting == "auto":
        return not engine.accepts_simulation
    return setting in ("1", "true", "yes", "on")


def clean(text: str) -> str:
    """One line of plain text: markup, quotes and a trailing full stop taken off."""
    line = next((part for part in text.strip().splitlines() if part.strip()), "")
    line = re.sub(r"^(?:title\s*:\s*)", "", line.strip(), flags=re.IGNORECASE)
    line = line.strip().strip("#*_`\"'“”‘’«» ").rstrip(".").strip()
    line = re.sub(r"\s+", " ", storable(line))
    return line[:MAX_TITLE_CHARS].strip()


def _placeholder_answer(message_id: str) -> tuple[Conversation, Message] | None:
    """The answer and its conversation, if the answer has text and the conversation's
    title is a placeholder still."""
    answer = Message.objects.select_related("conversation").get(id=message_id)
    conversation = answer.conversation
    if conversation.title_source not in PLACEHOLDERS or not answer.content.strip():
        return None
    return conversation, answer


def _first_question(answer: Message) -> str | None:
    """The excerpt of the first user message on ``answer``'s branch, if ``answer`` is the
    first answer with text the engine gave there (an answer it gave has segments; an
    earlier turn an OpenAI call sent has none). One query: the conversation's tree, with
    what each message is."""
    generated = Exists(Segment.objects.filter(message_id=OuterRef("pk")))
    rows = (
        Message.objects.filter(conversation_id=answer.conversation_id)
        .annotate(
            excerpt=Case(
                When(role=Message.Role.USER, then=Left("content", EXCERPT_CHARS)),
                default=Value(""),
                output_field=TextField(),
            ),
            answered=Case(
                When(Q(role=Message.Role.ASSISTANT) & ~Q(content="") & generated, then=True),
                default=False,
                output_field=BooleanField(),
            ),
        )
        .order_by("created_at", "id")
        .values_list("id", "parent_id", "role", "excerpt", "answered", named=True)
    )
    by_id = {str(row.id): row for row in rows}
    tree = Tree((row.id, row.parent_id) for row in by_id.values())
    above = [by_id[key] for key in tree.path(answer.id)[:-1]]
    if any(row.answered for row in above):
        return None
    return next((row.excerpt for row in above if row.role == Message.Role.USER), None)


def _save(conversation_id: str, title: str) -> bool:
    """Only over a placeholder: a title the person set meanwhile stays."""
    updated = Conversation.objects.filter(id=conversation_id, title_source__in=PLACEHOLDERS).update(
        title=title, title_source=Conversation.TitleSource.MODEL
    )
    return bool(updated)


async def _ask(engine: Engine, conversation: Conversation, question: str, answer: Message) -> str:
    """The engine's title for ``answer`` to ``question`` (already an excerpt)."""
    prompt = f"{INSTRUCTION}\n\nQuestion:\n{question}\n\nAnswer:\n{answer.content[:EXCERPT_CHARS]}"
    request = EngineRequest(
        messages=[ChatTurn("user", prompt)],
        request_id=f"title-{conversation.id}",
        model=answer.model or conversation.model or engine.model,
        max_tokens=streaming_settings.TITLE_MAX_TOKENS,
        temperature=0.2,
    )
    detok = Detokenizer()
    parts: list[str] = []
    async with asyncio.timeout(streaming_settings.TITLE_TIMEOUT):
        stream = engine.stream(request)
        try:
            async for chunk in stream:
                parts.append(detok.feed(chunk.token_bytes) if chunk.token_bytes else chunk.text)
        finally:
            await stream.aclose()
    return "".join(parts)


async def title_conversation(message_id: str, engine: Engine | None = None) -> None:
    """Title the conversation of ``message_id``, a first answer that completed, if it
    still has a placeholder title (``engine``: by default the one that gave the answer).
    Never raises: a title is a nicety."""
    try:
        found = await database.run(_placeholder_answer, message_id)
        if found is None:
            return
        conversation, answer = found
        asked = engine or get_runtime().catalog.engine_for(answer.model)
        if engine is None and not wanted(asked):
            return  # before the tree is read: the simulated engine's answers are many
        question = await database.run(_first_question, answer)
        if question is None:
            return
        title = clean(await _ask(asked, conversation, question, answer))
        if not title or not await database.run(_save, str(conversation.id), title):
            return
        get_runtime().notify(
            conversation.owner_id,
            [
                {
                    "event": "conversation.updated",
                    "conversation": str(conversation.id),
                    "title": title,
                }
            ],
        )
    except Exception as exc:
        log.info("no title for the conversation of %s: %s", message_id, exc)


def on_answer_completed(
    sender: Any, message_id: str, segment_index: int, status: str, **kwargs: Any
) -> None:
    """``signals.answer_ended``'s receiver: title in the background after an answer's
    first segment completed (``title_conversation`` tells whether it is the first
    answer), so the generation's end waits for nothing."""
    runtime = get_runtime()
    if status != "complete" or segment_index != 0:
        return
    if not any(wanted(engine) for engine in runtime.engines.values()):
        return  # no engine writes titles (the simulated one alone): nothing to look up
    runtime.lifecycle.spawn(title_conversation(message_id), "title")
