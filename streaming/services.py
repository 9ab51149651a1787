"""Writes: the only code that creates conversations, messages and segments and starts,
continues or stops generations. Views and consumers call these and nothing below them.

Every function takes the acting user and looks objects up through them: another user's
id is indistinguishable from a missing one (``NotFound``).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from streaming import database
from streaming.engines.base import ChatTurn, EngineRequest
from streaming.generation import Generation, SegmentPlan
from streaming.models import Conversation, Message, Segment
from streaming.params import validate_params
from streaming.runtime import Runtime, get_runtime
from streaming.termination import NATURAL_ENDS, Status
from streaming.worker import WORKER_ID


class ServiceError(Exception):
    status = 400
    code = "invalid"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class Conflict(ServiceError):
    status = 409
    code = "conflict"


class TooManyGenerations(ServiceError):
    status = 429
    code = "too_many_generations"
    retry_after = 5


class ShuttingDown(ServiceError):
    status = 503
    code = "shutting_down"
    retry_after = 2


class InvalidParams(ServiceError):
    status = 400
    code = "invalid_params"


@dataclass(slots=True)
class Exchange:
    user_message: Message | None
    assistant_message: Message
    generation: Generation


def conversation_for(user: Any, conversation_id: Any, *, lock: bool = False) -> Conversation:
    """``lock``: the conversation's row and its owner's (``_check_capacity`` counts under
    the owner's), in the same query."""
    queryset = Conversation.objects.filter(owner=user)
    if lock:
        queryset = queryset.select_related("owner").select_for_update(of=("self", "owner"))
    try:
        return queryset.get(id=conversation_id)
    # A malformed id is just an id that names nothing (ValidationError for bad UUIDs).
    except (Conversation.DoesNotExist, ValidationError, ValueError, TypeError):
        raise NotFound("conversation not found") from None


def message_for(user: Any, message_id: Any, *, lock: bool = False) -> Message:
    """``lock``: the message's row and its owner's (as ``conversation_for``)."""
    queryset = Message.objects.filter(conversation__owner=user).select_related("conversation")
    if lock:
        queryset = queryset.select_related("conversation__owner").select_for_update(
            of=("self", "conversation__owner")
        )
    try:
        return queryset.get(id=message_id)
    except (Message.DoesNotExist, ValidationError, ValueError, TypeError):
        raise NotFound("message not found") from None


def _turns(conversation: Conversation, messages: list[Message]) -> list[ChatTurn]:
    turns = []
    if conversation.system_prompt:
        turns.append(ChatTurn("system", conversation.system_prompt))
    turns.extend(ChatTurn(m.role, m.content) for m in messages if m.content)
    return turns


def _engine_request(
    message: Message,
    segment_index: int,
    turns: list[ChatTurn],
    params: dict[str, Any],
    *,
    continue_final: bool,
) -> EngineRequest:
    return EngineRequest(
        messages=turns,
        request_id=f"{message.id}.{segment_index}",
        model=message.model,
        max_tokens=min(
            params.get("max_tokens", settings.DEFAULT_MAX_TOKENS), settings.MAX_TOKENS_CAP
        ),
        temperature=params.get("temperature"),
        top_p=params.get("top_p"),
        seed=params.get("seed"),
        stop=list(params.get("stop", [])),
        continue_final=continue_final,
        simulation=dict(params.get("simulation", {})),
    )


def _check_capacity(user: Any) -> None:
    """Count the user's streaming answers. The caller holds the lock on the user's row
    (taken by the locking read of ``conversation_for`` or ``message_for``, in the same
    transaction), so concurrent requests in different conversations cannot both pass."""
    running = Message.objects.filter(
        conversation__owner=user, role=Message.Role.ASSISTANT, status=Status.STREAMING
    ).count()
    if running >= settings.MAX_CONCURRENT_GENERATIONS_PER_USER:
        raise TooManyGenerations(
            f"at most {settings.MAX_CONCURRENT_GENERATIONS_PER_USER} answers may stream at "
            "once; wait for one to end"
        )


def create_conversation(
    user: Any, *, title: str = "", system_prompt: str = "", model: str = ""
) -> Conversation:
    return Conversation.objects.create(
        owner=user, title=title, system_prompt=system_prompt, model=model
    )


def _create_exchange(
    user: Any,
    conversation_id: Any,
    content: str,
    params: dict[str, Any],
    model: str,
    prior: list[ChatTurn],
    grace: float | None,
) -> tuple[Message, Message, SegmentPlan]:
    with transaction.atomic():
        conversation = conversation_for(user, conversation_id, lock=True)
        _check_capacity(user)
        for turn in prior:
            Message.objects.create(conversation=conversation, role=turn.role, content=turn.content)
        user_message = Message.objects.create(
            conversation=conversation, role=Message.Role.USER, content=content
        )
        assistant = Message.objects.create(
            conversation=conversation,
            role=Message.Role.ASSISTANT,
            status=Status.STREAMING,
            params=params,
            model=conversation.model or model,
        )
        segment = Segment.objects.create(message=assistant, index=0, first_seq=1, worker=WORKER_ID)
        # The answer describes both messages as created: no second read for them.
        user_message._prefetched_objects_cache = {"segments": []}
        assistant._prefetched_objects_cache = {"segments": [segment]}
        if not conversation.title:
            conversation.title = content.strip().splitlines()[0][:80] if content.strip() else ""
        conversation.save(update_fields=["title", "updated_at"])
        history = list(conversation.messages.exclude(id=assistant.id).order_by("created_at"))
        plan = SegmentPlan(
            message_id=str(assistant.id),
            conversation_id=str(conversation.id),
            user_id=user.pk,
            segment_index=0,
            first_seq=1,
            base_text="",
            request=_engine_request(
                assistant, 0, _turns(conversation, history), params, continue_final=False
            ),
        )
        if grace is not None:
            plan.abandon_grace = grace
    return user_message, assistant, plan


def _validate_content(content: Any) -> str:
    if not isinstance(content, str) or not content.strip():
        raise InvalidParams("content must be a non-empty string", field="content")
    if len(content) > settings.MAX_MESSAGE_CHARS:
        raise InvalidParams(
            f"content is longer than {settings.MAX_MESSAGE_CHARS} characters", field="content"
        )
    return content


def clean_params(raw: Any, runtime: Runtime) -> dict[str, Any]:
    from streaming.params import ParamError

    try:
        return validate_params(raw, accepts_simulation=runtime.engine.accepts_simulation)
    except ParamError as exc:
        raise InvalidParams(exc.message, field=exc.field) from None


def create_exchange(
    runtime: Runtime,
    user: Any,
    conversation_id: Any,
    content: Any,
    raw_params: Any = None,
    *,
    prior: list[ChatTurn] | None = None,
    abandon_grace: float | None = None,
) -> Exchange:
    """Create the user message and the streaming assistant message, and start the answer.

    Synchronous, for the thread that already holds a database connection (a REST
    request's): the rows are written here and only the start hops onto ``runtime``'s
    event loop, which does no database work for it, so a request thread never waits on
    a database thread (nor holds a connection another call needs).
    """
    if not runtime.accepting:
        raise ShuttingDown("this server is shutting down; retry")
    content = _validate_content(content)
    params = clean_params(raw_params, runtime)
    user_message, assistant, plan = _create_exchange(
        user,
        conversation_id,
        content,
        params,
        runtime.engine.model,
        prior or [],
        abandon_grace,
    )
    return Exchange(user_message, assistant, runtime.launch_threadsafe(plan))


async def post_message(
    user: Any,
    conversation_id: Any,
    content: Any,
    raw_params: Any = None,
    *,
    prior: list[ChatTurn] | None = None,
    abandon_grace: float | None = None,
) -> Exchange:
    """``create_exchange`` for async callers: one trip to a database thread."""
    runtime = get_runtime()
    await runtime.ensure_started()
    return await database.run(
        create_exchange,
        runtime,
        user,
        conversation_id,
        content,
        raw_params,
        prior=prior,
        abandon_grace=abandon_grace,
    )


def _create_continuation(user: Any, message_id: Any) -> tuple[Message, SegmentPlan]:
    with transaction.atomic():
        message = message_for(user, message_id, lock=True)
        if message.role != Message.Role.ASSISTANT:
            raise Conflict("only assistant messages can be continued")
        if message.status == Status.STREAMING:
            raise Conflict("this message is still streaming; wait for it to end or stop it")
        if message.status in NATURAL_ENDS:
            raise Conflict(
                f"this message ended {message.status}: it is finished and cannot be continued"
            )
        _check_capacity(user)
        last = message.segments.order_by("-index").first()
        index = last.index + 1 if last else 0
        first_seq = message.last_seq + 1
        Segment.objects.create(
            message=message,
            index=index,
            first_seq=first_seq,
            start_offset=len(message.content),
            end_offset=len(message.content),
            worker=WORKER_ID,
        )
        message.status = Status.STREAMING
        message.save(update_fields=["status", "updated_at"])
        conversation = message.conversation
        history = list(
            conversation.messages.filter(created_at__lte=message.created_at).order_by("created_at")
        )
        plan = SegmentPlan(
            message_id=str(message.id),
            conversation_id=str(conversation.id),
            user_id=conversation.owner_id,
            segment_index=index,
            first_seq=first_seq,
            base_text=message.content,
            request=_engine_request(
                message,
                index,
                _turns(conversation, history),
                message.params,
                continue_final=True,
            ),
        )
    return message, plan


def create_continuation(runtime: Runtime, user: Any, message_id: Any) -> Exchange:
    """Append a new segment to a cut-off assistant message and start streaming it on the
    same id (synchronous, like ``create_exchange``)."""
    if not runtime.accepting:
        raise ShuttingDown("this server is shutting down; retry")
    message, plan = _create_continuation(user, message_id)
    return Exchange(None, message, runtime.launch_threadsafe(plan))


async def continue_message(user: Any, message_id: Any) -> Exchange:
    """``create_continuation`` for async callers."""
    runtime = get_runtime()
    await runtime.ensure_started()
    return await database.run(create_continuation, runtime, user, message_id)


async def continue_interrupted(runtime: Runtime, message_id: str) -> None:
    """Automatic Continue after a reaped interruption (``STREAM_AUTO_CONTINUE_INTERRUPTED``)."""
    owner = await database.run(
        lambda: (
            Message.objects.select_related("conversation__owner")
            .get(id=message_id)
            .conversation.owner
        )
    )
    with contextlib.suppress(ServiceError):
        await continue_message(owner, message_id)


async def cancel_message(user: Any, message_id: Any, *, wait: float = 5.0) -> Message:
    """Stop a streaming message wherever it is generated; answer with its final state."""
    message = await database.run(message_for, user, message_id)
    if message.status != Status.STREAMING:
        return message
    runtime = get_runtime()
    await runtime.ensure_started()
    await runtime.cancel(str(message.id), "cancelled")
    with contextlib.suppress(TimeoutError):
        await wait_until_ended(str(message.id), wait)
    return await database.run(message_for, user, message_id)


async def wait_until_ended(message_id: str, limit: float | None = None) -> None:
    """Follow the message's log until its ``done`` (the generating process may be remote)."""
    runtime = get_runtime()
    generation = runtime.generations.get(message_id)
    if generation is not None:
        await asyncio.wait_for(generation.finished.wait(), limit)
        return
    last, status = await database.run(
        lambda: Message.objects.values_list("last_seq", "status").get(id=message_id)
    )
    if status != Status.STREAMING:
        return
    try:
        async with asyncio.timeout(limit):
            async for batch in runtime.hub.read(message_id, last):
                if batch and batch[-1]["type"] == "done":
                    return
    except TimeoutError:
        return


def delete_conversation(user: Any, conversation_id: Any) -> list[str]:
    """Delete a conversation; returns the message ids whose logs should be dropped."""
    with transaction.atomic():
        conversation = conversation_for(user, conversation_id, lock=True)
        ids = [str(i) for i in conversation.messages.values_list("id", flat=True)]
        conversation.delete()
    return ids
