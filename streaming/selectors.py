"""Reads: what a user may see, looked up through the user (another user's id -> NotFound)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from streaming import database
from streaming.auth import resolve_user
from streaming.models import Conversation, Message
from streaming.services import NotFound, conversation_for, message_for
from streaming.transports.subscription import MessageState


def conversations_of(user: Any) -> QuerySet[Conversation]:
    return Conversation.objects.filter(owner=user).order_by("-updated_at")


def messages_of(user: Any, conversation_id: Any) -> QuerySet[Message]:
    conversation = conversation_for(user, conversation_id)
    return conversation.messages.prefetch_related("segments").order_by("created_at")


def _state(user: Any, message_id: Any) -> MessageState:
    message = message_for(user, message_id)
    if message.role != Message.Role.ASSISTANT:
        raise NotFound("this message has no stream")
    return MessageState.of(message)


async def message_state(user: Any, message_id: Any) -> MessageState:
    return await database.run(_state, user, message_id)


def _reader(scope: dict[str, Any], message_id: Any) -> tuple[Any, MessageState | None]:
    user = resolve_user(scope)
    if not user.is_authenticated:
        return user, None
    try:
        return user, _state(user, message_id)
    except NotFound:
        return user, None


async def reader_state(scope: dict[str, Any], message_id: Any) -> tuple[Any, MessageState | None]:
    """Who is asking to read a stream, and the stream's state when it is theirs (``None``
    when it is not, or they are not authenticated): one database trip for both, since
    opening a stream is on the path of every answer's first token."""
    return await database.run(_reader, scope, message_id)
