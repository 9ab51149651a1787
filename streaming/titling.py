"""Titles for conversations, written by the engine that gave the first answer, after it.

A conversation starts titled with its first question's first line (``title_source``
"question"). When that first answer completes, one small extra request (``TITLE_MAX_TOKENS``,
``TITLE_TIMEOUT``) asks the engine for a short title, which replaces the placeholder unless
the person set a title meanwhile ("user" is never overwritten). The request creates no
message, so it never counts against the user's concurrency limit, and its failure costs
nothing but the better title. ``TITLES``: "auto" asks every engine but the simulated one,
whose text is unrelated to the question (its conversations keep the question's line).
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from streaming import database
from streaming.conf import streaming_settings
from streaming.detokenize import Detokenizer
from streaming.engines.base import ChatTurn, Engine, EngineRequest
from streaming.models import Conversation, Message
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


def _first_exchange(message_id: str) -> tuple[Conversation, str, Message] | None:
    """The conversation, question and answer if this answer can title its conversation."""
    answer = Message.objects.select_related("conversation").get(id=message_id)
    conversation = answer.conversation
    if conversation.title_source not in PLACEHOLDERS or answer.parent_id is None:
        return None
    question = Message.objects.filter(id=answer.parent_id).values_list("content", flat=True)
    return conversation, question.first() or "", answer


def _save(conversation_id: str, title: str) -> bool:
    """Only over a placeholder: a title the person set meanwhile stays."""
    updated = Conversation.objects.filter(id=conversation_id, title_source__in=PLACEHOLDERS).update(
        title=title, title_source=Conversation.TitleSource.MODEL
    )
    return bool(updated)


async def _ask(engine: Engine, conversation: Conversation, question: str, answer: Message) -> str:
    prompt = (
        f"{INSTRUCTION}\n\nQuestion:\n{question[:EXCERPT_CHARS]}\n\n"
        f"Answer:\n{answer.content[:EXCERPT_CHARS]}"
    )
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
        found = await database.run(_first_exchange, message_id)
        if found is None:
            return
        conversation, question, answer = found
        asked = engine or get_runtime().catalog.engine_for(answer.model)
        if engine is None and not wanted(asked):
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
    """``signals.answer_ended``'s receiver: title in the background after a first
    answer completed, so the generation's end waits for nothing."""
    runtime = get_runtime()
    if status != "complete" or segment_index != 0:
        return
    if not any(wanted(engine) for engine in runtime.engines.values()):
        return  # no engine writes titles (the simulated one alone): nothing to look up
    runtime.lifecycle.spawn(title_conversation(message_id), "title")
