"""Reads: what a user may see, looked up through the user (another user's id -> NotFound)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from streaming import database
from streaming.models import Conversation, Message
from streaming.services import NotFound, message_for
from streaming.transports.subscription import MessageState


def conversations_of(user: Any) -> QuerySet[Conversation]:
    return Conversation.objects.filter(owner=user).order_by("-updated_at")


def messages_of(user: Any, conversation_id: Any) -> QuerySet[Message]:
    from streaming.services import _conversation_for

    conversation = _conversation_for(user, conversation_id)
    return conversation.messages.prefetch_related("segments").order_by("created_at")


def _state(user: Any, message_id: Any) -> MessageState:
    message = message_for(user, message_id)
    if message.role != Message.Role.ASSISTANT:
        raise NotFound("this message has no stream")
    return MessageState(
        id=str(message.id),
        status=message.status,
        last_seq=message.last_seq,
        content=message.content,
        termination=message.termination,
    )


async def message_state(user: Any, message_id: Any) -> MessageState:
    return await database.run(_state, user, message_id)
