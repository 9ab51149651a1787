"""Writes: the only code that creates conversations, messages and segments and starts,
continues or stops generations. Views and consumers call these and nothing below them.

Every function takes the acting user and looks objects up through them: another user's
id is indistinguishable from a missing one (``NotFound``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from django.conf import settings
from django.db import IntegrityError, connections, transaction
from django.db.models import Count, QuerySet

from streaming import database, statements
from streaming.branches import History, sibling_ids, tree_of
from streaming.conf import streaming_settings
from streaming.engines.base import ChatTurn, EngineRequest
from streaming.errors import (
    IDEMPOTENCY_HEADER,
    Conflict,
    ContextFull,
    ConversationFull,
    IdempotencyKeyReused,
    InvalidParams,
    NotFound,
    ServiceError,
    ShuttingDown,
    StopUnconfirmed,
    TooManyGenerations,
    TooManyWaits,
    WrongRole,
    too_long,
)
from streaming.events import done as done_event
from streaming.generation import Generation, SegmentPlan
from streaming.models import Conversation, Message, Segment
from streaming.params import ParamError, validate_params
from streaming.reading import Subscription
from streaming.runtime import get_runtime
from streaming.selectors import conversation_for, locked_for_post, message_for
from streaming.storable import UNSTORABLE, is_storable
from streaming.termination import NATURAL_ENDS, Status
from streaming.worker import WORKER_ID

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(slots=True)
class Exchange:
    user_message: Message | None
    assistant_message: Message
    # None when the request was a retry (its ``Idempotency-Key`` named an earlier one):
    # nothing was started, the messages are the earlier request's, as they are now.
    generation: Generation | None
    # The siblings of the messages created (id -> ids sharing its parent, in creation
    # order), known inside the creating transaction, so describing them needs no query.
    siblings: dict[str, list[str]] = field(default_factory=dict)
    # Where a reader of what was started begins: after the seq its answer had reached
    # (a Continue's earlier segments), else from the beginning.
    after: int = 0


def call(fn: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run an async service from a request thread (a DRF view, the admin) and wait for it.

    This thread's database connection goes back to the pool first: the service's own
    database calls run in other threads and need connections too, so request threads
    holding theirs while they wait would exhaust the pool under concurrent requests.
    Not inside a transaction (the admin's delete view runs in one): closing its
    connection rolled it back, and the delete it was making answered done and undone."""
    if not any(c.in_atomic_block for c in connections.all(initialized_only=True)):
        connections.close_all()
    return get_runtime().call(fn(*args, **kwargs))


def _event(kind: str, **fields: Any) -> dict[str, Any]:
    """A feed event (``streaming.feed``): ``{"event": kind, ...}``."""
    return {"event": kind, **fields}


def _notify(user_id: int, *events: dict[str, Any]) -> None:
    """Tell the user's other tabs (the feed, ``streaming.feed``) once the transaction this
    runs in has committed: events for rows that were rolled back are never sent. The
    events of one call travel together, in one message to every process."""
    batch = list(events)
    transaction.on_commit(lambda: get_runtime().notify(user_id, batch))


def created_fields(question: Message | None, answer: Message) -> dict[str, Any]:
    """What says where an exchange went, the same in the feed's ``message.created`` and
    in the reply to the WebSocket frame that made it: ``parent_id`` is the parent of the
    first message made (the question's; the answer's, for a regenerated one), the place
    another tab puts the new branch."""
    return {
        "conversation": str(answer.conversation_id),
        "user_message_id": None if question is None else str(question.id),
        "message_id": str(answer.id),
        "parent_id": _id_or_none(answer.parent_id if question is None else question.parent_id),
    }


def _created(question: Message | None, answer: Message) -> dict[str, Any]:
    return _event("message.created", **created_fields(question, answer))


def _id_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _turns(
    conversation: Conversation, messages: list[Message], partial: Message | None = None
) -> list[ChatTurn]:
    """The prompt: the system prompt, then every message of ``messages`` (an assistant's
    with its tool calls, a tool result with the call it answers) but an answer that said
    nothing (no text, no tool calls: it failed or was cut before its first token). A tool
    result is a turn even when empty: a tool that printed nothing answered its call, and
    a call left unanswered is a malformed prompt. ``partial`` is the answer a Continue
    extends, last: it goes with its reasoning (the model must see its own thinking to go
    on from it), even when the cut came before any answer text."""
    turns = []
    if conversation.system_prompt:
        turns.append(ChatTurn("system", conversation.system_prompt))
    turns.extend(_turn(m) for m in messages if _said(m))
    if partial is not None:
        turns.append(ChatTurn(partial.role, partial.content, partial.reasoning))
    return turns


def _said(message: Message) -> bool:
    """Whether ``message`` is a turn of the prompt: all are but an empty answer."""
    return message.role != Message.Role.ASSISTANT or bool(message.content or message.tool_calls)


def _turn(message: Message) -> ChatTurn:
    return ChatTurn(
        message.role,
        message.content,
        tool_calls=tuple(message.tool_calls or ()),
        tool_call_id=message.tool_call_id,
    )


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
        tools=params.get("tools"),
        tool_choice=params.get("tool_choice"),
    )


def _check_capacity(user: Any) -> None:
    """Count the user's streaming answers. The caller holds the lock on the user's row
    (taken by the locking read of ``conversation_for`` or ``message_for``, in the same
    transaction), so concurrent requests in different conversations cannot both pass."""
    _refuse_over_capacity(statements.running_answers(user.pk))


def _refuse_over_capacity(running: int) -> None:
    """``running``: the user's streaming answers, counted under the lock on their row."""
    limit = settings.MAX_CONCURRENT_GENERATIONS_PER_USER
    if running >= limit:
        answers = "one answer" if limit == 1 else f"{limit} answers"
        raise TooManyGenerations(f"at most {answers} may stream at once; wait for one to end")


# Each user's calls waiting on an answer in this process (``waiting``).
_waits: Counter[Any] = Counter()
_waits_lock = threading.Lock()


@contextlib.contextmanager
def waiting(user: Any) -> Iterator[None]:
    """Hold one of ``user``'s waits in this process for a call that returns once its
    answer ended (``?wait=true``), from before it makes anything to its response;
    ``TooManyWaits`` past ``MAX_CONCURRENT_GENERATIONS_PER_USER``. Such a call holds a
    request slot (``REQUEST_CONCURRENCY``) all along, and the answers' own limit does not
    bound them: a retry (its ``Idempotency-Key``) starts nothing, so one user's retries
    of one answer could hold every slot of the process. Refused before the call makes
    anything, so a refusal never leaves an answer behind."""
    limit = settings.MAX_CONCURRENT_GENERATIONS_PER_USER
    with _waits_lock:
        if _waits[user.pk] >= limit:
            calls = "one call" if limit == 1 else f"{limit} calls"
            raise TooManyWaits(
                f"at most {calls} may wait on answers at once; follow the answer's stream "
                "instead, or wait for one to end",
                field="wait",
            )
        _waits[user.pk] += 1
    try:
        yield
    finally:
        with _waits_lock:
            _waits[user.pk] -= 1
            if not _waits[user.pk]:
                del _waits[user.pk]


def _refuse_full(tree: History) -> None:
    """``ConversationFull`` when the conversation already holds
    ``MAX_CONVERSATION_MESSAGES`` messages or ``MAX_CONVERSATION_CHARS`` characters of
    text (``content``: what the tree holds; an answer's reasoning is bounded by its
    tokens, and the messages by their count). Every request that makes something in a conversation
    reads all of it, so without a bound one user's edits or posts made each of them
    slower for good (870 edits of 32,000 characters: half a second a post), and held
    the database threads every other request needs. The bound is checked before a
    request adds its own: a conversation ends at most one request past it."""
    messages = tree.messages.values()
    if len(messages) >= settings.MAX_CONVERSATION_MESSAGES:
        held = f"{settings.MAX_CONVERSATION_MESSAGES} messages"
    elif sum(len(m.content) for m in messages) >= settings.MAX_CONVERSATION_CHARS:
        held = f"{settings.MAX_CONVERSATION_CHARS} characters"
    else:
        return
    raise ConversationFull(
        f"this conversation holds as much as one may ({held}); start a new conversation"
    )


def create_conversation(
    user: Any, *, title: str = "", system_prompt: str = "", model: str = ""
) -> Conversation:
    conversation = Conversation.objects.create(
        owner=user,
        title=title,
        title_source=Conversation.TitleSource.USER if title else Conversation.TitleSource.NONE,
        system_prompt=system_prompt,
        model=check_model(model),
    )
    _notify(user.pk, _event("conversation.created", conversation=str(conversation.id), title=title))
    return conversation


def update_conversation(
    user: Any,
    conversation_id: Any,
    changes: dict[str, Any],
    *,
    switch: bool = False,
    current_leaf: Any = None,
) -> Conversation:
    """Save changed fields (``title``, ``system_prompt``, ``model``, as validated by the
    caller; ``model`` is checked here) of one of the user's conversations and, when
    ``switch``, show the branch through ``current_leaf`` (``_show_branch``), in one
    statement. All or nothing: a refused change (an unknown model, a message of another
    conversation) leaves the conversation as it was."""
    if "model" in changes:
        changes = {**changes, "model": check_model(changes["model"])}
    with transaction.atomic():
        conversation = conversation_for(user, conversation_id, lock=True)
        fields = _show_branch(user, conversation, current_leaf) if switch else []
        if changes:
            fields += _apply_changes(user, conversation, changes)
        if fields:
            conversation.save(update_fields=fields)
    return conversation


def _apply_changes(user: Any, conversation: Conversation, changes: dict[str, Any]) -> list[str]:
    """Set the changed fields; the fields to save (the caller saves them). A change is
    activity: the conversation moves up the list."""
    for name, value in changes.items():
        setattr(conversation, name, value)
    fields = [*changes, "updated_at"]
    if "title" in changes:
        conversation.title_source = Conversation.TitleSource.USER
        fields.append("title_source")
        _notify(
            user.pk,
            _event(
                "conversation.updated", conversation=str(conversation.id), title=conversation.title
            ),
        )
    return fields


def _start_answer(
    user: Any,
    conversation: Conversation,
    prompt: list[Message],
    params: dict[str, Any],
    model: str,
    grace: float | None,
    *,
    new: tuple[Message, ...] = (),
    key: IdempotencyKey | None = None,
    write: statements.Write = statements.insert_then_update,
) -> tuple[Message, SegmentPlan]:
    """The streaming answer to the last message of ``prompt`` (the path down to the
    message it answers), made the conversation's current leaf; ``model`` answers it.
    ``new``: messages not stored yet (the question, earlier turns), written with the
    answer in one statement. ``key``: the request's, when the answer is the first thing
    it makes (a regeneration). ``write`` stores the rows (the caller's transaction may
    hold them back for its ``COMMIT``: ``statements.creating_transaction``). Inside the
    caller's transaction."""
    assistant = Message(
        conversation=conversation,
        parent=prompt[-1],
        role=Message.Role.ASSISTANT,
        status=Status.STREAMING,
        params=params,
        model=model,
        idempotency_key=key.stored if key is not None else None,
    )
    segment = Segment(message=assistant, index=0, first_seq=1, worker=WORKER_ID)
    # The answer describes the message as created: no second read for it.
    assistant._prefetched_objects_cache = {"segments": [segment]}  # type: ignore[attr-defined]
    conversation.current_leaf = assistant
    if conversation._state.adding:  # a new conversation: stored with its messages
        write([[conversation], [*new, assistant], [segment]])
    else:
        write(
            [[*new, assistant], [segment]],
            conversation,
            ["title", "title_source", "current_leaf", "updated_at"],
        )
    plan = SegmentPlan(
        message_id=str(assistant.id),
        conversation_id=str(conversation.id),
        user_id=user.pk,
        segment_index=0,
        first_seq=1,
        base_text="",
        request=_engine_request(
            assistant, 0, _turns(conversation, prompt), params, continue_final=False
        ),
    )
    if grace is not None:
        plan.abandon_grace = grace
    return assistant, plan


def _ask(
    conversation: Conversation,
    parent_id: Any,
    content: str,
    *,
    role: str = Message.Role.USER,
    tool_call_id: str = "",
    key: IdempotencyKey | None = None,
) -> Message:
    """The message an answer answers: the user's question, or a tool's result (with the
    call of the model's it answers, in a tool loop); ``key``: the request's, which made
    it. Not stored yet (``_start_answer``)."""
    question = Message(
        conversation=conversation,
        parent_id=parent_id,
        role=role,
        content=content,
        tool_call_id=tool_call_id,
        idempotency_key=key.stored if key is not None else None,
    )
    question._prefetched_objects_cache = {"segments": []}  # type: ignore[attr-defined]
    return question


@dataclass(frozen=True, slots=True)
class IdempotencyKey:
    """A client's ``Idempotency-Key`` for a post, a regenerate or an edit, and the name
    the client gave it (the header's, or a frame's field), for the errors about it."""

    stored: str  # as ``Message.idempotency_key`` holds it: unique per user
    field: str

    MAX_CHARS = 255

    @classmethod
    def of(cls, user: Any, value: Any, field: str) -> IdempotencyKey | None:
        """The key ``value`` (None: absent), or ``InvalidParams`` naming ``field``."""
        if value is None:
            return None
        if not (
            isinstance(value, str)
            and 0 < len(value) <= cls.MAX_CHARS
            and value.isascii()
            and value.isprintable()
        ):
            raise InvalidParams(
                f"must be 1 to {cls.MAX_CHARS} printable ASCII characters", field=field
            )
        return cls(f"{user.pk}:{value}", field)


Created = tuple[Message | None, Message, SegmentPlan | None, dict[str, list[str]]]


def _earlier_request(key: IdempotencyKey) -> Message | None:
    """The message the request that first sent ``key`` made first (a post's or an
    edit's question, a regenerated answer), or None. Called under the lock that orders
    the requests it could race, so a retry finds what a first request committed."""
    return statements.keyed_message(key.stored)


def _first_of_its_parent(message: Message) -> bool:
    """Whether ``message`` is its parent's first child: a post's question always is (a post
    goes below the leaf shown, which has none), an edit's never (it is made beside the
    question it edits). Which request made a keyed question, for a key sent again."""
    siblings = Message.objects.filter(
        conversation_id=message.conversation_id,
        parent_id=message.parent_id,  # None: the roots (IS NULL)
        created_at__lt=message.created_at,
    )
    return not siblings.exists()


def _replayed(
    key: IdempotencyKey,
    made: Message,
    fits: bool,
    model: str,
    params_for: Callable[[str], dict[str, Any]],
) -> Created:
    """What the first request with ``key`` made (``made``, and its answer when ``made``
    is a question) as it is now, and no plan: a retry starts nothing, the answer it
    finds is the one to read. ``IdempotencyKeyReused`` when the retry does not ``fit``
    that request (another message, elsewhere, another kind of request) or would be
    answered otherwise: by another model than ``model``, the one the retry names, or
    with other parameters than ``params_for`` gives (the retry's, checked for a model's
    engine). A retry that names no model ("") fits the model its answer was made with:
    the first request named none either (it was answered by the conversation's model
    then, which may have changed since) or named that one."""
    answer: Message | None = made
    if made.role != Message.Role.ASSISTANT:
        answer = (
            Message.objects.filter(parent_id=made.id, role=Message.Role.ASSISTANT)
            .order_by("created_at", "id")
            .first()
        )
    if fits and answer is not None:
        model = model or answer.model
        fits = answer.model == model and answer.params == params_for(model)
    if not fits or answer is None:
        raise IdempotencyKeyReused(
            f"was sent with another request (message {made.id}); a retry repeats its "
            "request, and a new request takes a new key",
            field=key.field,
        )
    question = made if made is not answer else None
    siblings = {
        str(message.id): sibling_ids(message.conversation_id, message.parent_id)
        for message in (question, answer)
        if message is not None
    }
    return question, answer, None, siblings


def _create_exchange(
    user: Any,
    conversation_id: Any,
    content: str,
    raw_params: Any,
    model: str,
    prior: list[ChatTurn],
    grace: float | None,
    asked: ChatTurn,
    default_model: str,
    key: IdempotencyKey | None,
    after: str | None,
) -> Created:
    """``raw_params`` were checked for ``model``'s engine (the default one for ""); they
    are checked again for the engine that answers (the conversation's model may be
    another engine's). ``after``: the answer the question goes after (None: the current
    leaf). With ``key``, a retry of a request that made its messages gets those
    (``_replayed``, for the ``model`` it names) and no plan."""
    events: list[dict[str, Any]] = []
    with statements.creating_transaction() as tx:
        # The owner's row is locked first (with the conversation's), for the limit's count;
        # a new conversation is made with its messages or not at all.
        reads = locked_for_post(user, conversation_id, key.stored if key is not None else None)
        if reads.conversation is not None:
            conversation = reads.conversation
        if key is not None and (made := reads.keyed) is not None:
            fits = (
                made.role == asked.role
                and made.content == asked.content
                # A new conversation's question is its first message; a post's to one
                # that had messages is not, and is not what this retry asks for.
                and (
                    made.parent_id is None
                    if conversation_id is None
                    else str(made.conversation_id) == str(conversation_id)
                )
                and (
                    _first_of_its_parent(made)  # an edit's question is not a post's
                    if after is None
                    else str(made.parent_id) == after
                )
            )
            return _replayed(key, made, fits, model, functools.partial(clean_params, raw_params))
        # A new conversation has no model of its own yet.
        model = model or (conversation.model if conversation_id else "") or default_model
        if conversation_id is None:
            # Stored with the answer's rows (``_start_answer``), in the same statement.
            conversation = Conversation(owner_id=user.pk)
            events.append(
                _event("conversation.created", conversation=str(conversation.id), title="")
            )
        _refuse_over_capacity(reads.running)
        params = clean_params(raw_params, model)
        # After the answer the client shows, else the branch shown; the conversation's
        # lock orders concurrent posts.
        parent_id = conversation.current_leaf_id
        # The path down to it (the prompt so far) and the messages the question joins.
        history: list[Message] = []
        siblings_before: list[str] = []
        if conversation_id is not None:
            tree = History(reads.messages)
            _refuse_full(tree)
            if after is not None:
                parent_id = _chosen_parent(tree, after)
            history = tree.path(parent_id)
            siblings_before = [] if prior else tree.children(parent_id)
            _refuse_streaming_path(history)
        _check_tool_results(history, [*prior, asked])
        earlier: list[Message] = []
        for turn in prior:
            earlier.append(
                Message(
                    conversation=conversation,
                    parent_id=parent_id,
                    role=turn.role,
                    content=turn.content,
                    tool_calls=list(turn.tool_calls),
                    tool_call_id=turn.tool_call_id,
                )
            )
            parent_id = earlier[-1].id
        user_message = _ask(
            conversation,
            parent_id,
            content,
            role=asked.role,
            tool_call_id=asked.tool_call_id,
            key=key,
        )
        if not conversation.title:
            conversation.title = _title_from(history, [*prior, asked])
            conversation.title_source = Conversation.TitleSource.QUESTION
            events.append(
                _event(
                    "conversation.updated",
                    conversation=str(conversation.id),
                    title=conversation.title,
                )
            )
        assistant, plan = _start_answer(
            user,
            conversation,
            [*history, *earlier, user_message],
            params,
            model,
            grace,
            new=(*earlier, user_message),
            write=tx.write,
        )
        _notify(user.pk, *events, _created(user_message, assistant))
        siblings = {
            str(user_message.id): [*siblings_before, str(user_message.id)],
            str(assistant.id): [str(assistant.id)],
        }
    return user_message, assistant, plan, siblings


def _title_from(history: list[Message], turns: list[ChatTurn]) -> str:
    """The first line of the conversation's first question (an OpenAI call's history
    may start long before its last message), or "" when it has none yet."""
    said: list[Message | ChatTurn] = [*history, *turns]
    for turn in said:
        if turn.role == Message.Role.USER and turn.content.strip():
            return turn.content.strip().splitlines()[0][:80]
    return ""


def _refuse_streaming_path(path: list[Message]) -> None:
    """409 while an answer on ``path`` (the messages a new answer's prompt is built
    from) streams, the last one or one above it that a Continue extends: its text is not
    known yet, so the new answer's prompt would lack what the conversation shows there
    (the chat page's Send waits for the end, as Stop is offered)."""
    streaming = next((m for m in reversed(path) if m.status == Status.STREAMING), None)
    if streaming is not None:
        raise Conflict(
            "an answer above is still streaming; wait for its end or stop it "
            f"(POST /api/messages/{streaming.id}/cancel/) first"
        )


def _check_tool_results(history: list[Message], turns: list[ChatTurn]) -> None:
    """Each tool result in ``turns`` answers a call made before it: by an earlier turn, or
    by a message of ``history`` (the stored path the turns join). A result of no call is
    refused, in OpenAI's words, as OpenAI refuses it: a prompt holding an answer to no
    call is malformed for a model's chat template, and once stored it would be in every
    later prompt of the conversation. ``turns`` are numbered as the OpenAI endpoint's
    ``messages`` (the earlier turns, then the new one)."""
    if all(turn.role != Message.Role.TOOL for turn in turns):
        return  # a question: no walk of the path on the common post
    called = {call.get("id") for message in history for call in message.tool_calls or ()}
    for index, turn in enumerate(turns):
        if turn.role == Message.Role.TOOL and turn.tool_call_id not in called:
            raise InvalidParams(
                "messages with role 'tool' must be a response to a preceding message with "
                "'tool_calls'",
                field=f"messages[{index}].tool_call_id",
            )
        called.update(call.get("id") for call in turn.tool_calls)


def _validate_content(content: Any, *, tool_result: bool = False) -> str:
    """A question's text, or (``tool_result``) a tool's output, which may be empty: a
    tool that printed nothing answered, as OpenAI takes it."""
    if not isinstance(content, str) or not (tool_result or content.strip()):
        wanted = "a string" if tool_result else "a non-empty string"
        raise InvalidParams(f"must be {wanted}", field="content")
    if len(content) > settings.MAX_MESSAGE_CHARS:
        raise InvalidParams(too_long(settings.MAX_MESSAGE_CHARS, content), field="content")
    if not is_storable(content):
        raise InvalidParams(UNSTORABLE, field="content")
    return content


def clean_params(raw: Any, model: str = "") -> dict[str, Any]:
    """``raw`` validated for the engine that serves ``model``."""
    engine = get_runtime().catalog.engine_for(model)
    try:
        return validate_params(raw, accepts_simulation=engine.accepts_simulation)
    except ParamError as exc:
        raise InvalidParams(exc.message, field=exc.field) from None


def check_model(model: Any, field: str = "model") -> str:
    """``model`` if an engine serves it ("" chooses the default); ``InvalidParams``
    naming ``field`` otherwise. Asks the servers' model lists only when the configured
    names cannot tell (from a thread that is not the runtime's loop)."""
    if model is None or model == "":
        return ""
    if not isinstance(model, str) or len(model) > 200 or not is_storable(model):
        raise InvalidParams("must be a model name", field=field)
    runtime = get_runtime()
    known = runtime.catalog.known(model)
    if known is None:
        served = runtime.call(runtime.catalog.served())
        known = any(entry.info.id == model for entry in served)
    if not known:
        raise InvalidParams(f"no engine serves the model `{model}`", field=field)
    return model


def _accepting() -> None:
    if not get_runtime().accepting:
        raise ShuttingDown("this server is shutting down; retry")


def create_exchange(
    user: Any,
    conversation_id: Any,
    content: Any,
    raw_params: Any = None,
    *,
    prior: list[ChatTurn] | None = None,
    abandon_grace: float | None = None,
    tool_call_id: str = "",
    model: str = "",
    parent_id: Any = None,
    idempotency_key: Any = None,
    idempotency_field: str = IDEMPOTENCY_HEADER,
) -> Exchange:
    """Create the user message and the streaming assistant message, and start the answer.

    ``conversation_id`` ``None``: in a new conversation, created in the same transaction
    (a refused request leaves nothing behind). ``prior``: earlier turns to store first
    (the OpenAI endpoint's history), at most ``MAX_PRIOR_MESSAGES``. ``tool_call_id``:
    ``content`` is not the user's but a tool's result, for that call of the model's (the
    turn of a tool loop that hands the result back). ``model``: the model that answers
    (checked; by default the conversation's, else the default engine's). ``parent_id``:
    the answer of the conversation the question goes after, as the client shows it
    (None: the conversation's current leaf, whichever client chose it).
    ``idempotency_key``: the client's key for this post (named ``idempotency_field`` in
    its errors); a retry with it gets what the first request made, and starts nothing
    (``Exchange.generation`` None).

    Synchronous, for the thread that already holds a database connection (a REST
    request's): the rows are written here and only the start hops onto the runtime's
    event loop, which does no database work for it, so a request thread never waits on
    a database thread (nor holds a connection another call needs).
    """
    _accepting()
    runtime = get_runtime()
    content = _validate_content(content, tool_result=bool(tool_call_id))
    model = check_model(model)
    clean_params(raw_params, model)  # a bad parameter is reported before a bad id
    after = _parent_id(parent_id, new=conversation_id is None)
    if prior and len(prior) > settings.MAX_PRIOR_MESSAGES:
        raise InvalidParams(
            f"at most {settings.MAX_PRIOR_MESSAGES} earlier messages per request",
            field="messages",
        )
    key = IdempotencyKey.of(user, idempotency_key, idempotency_field)
    role = Message.Role.TOOL if tool_call_id else Message.Role.USER
    create = functools.partial(
        _create_exchange,
        user,
        conversation_id,
        content,
        raw_params,
        model,
        prior or [],
        abandon_grace,
        ChatTurn(role, content, tool_call_id=tool_call_id),
        runtime.engine.model,
        key,
        after,
    )
    return _exchange(_made_once(create, key))


def _parent_id(value: Any, *, new: bool) -> str | None:
    """A post's ``parent_id`` (None: after the current leaf), checked for its form (some
    UUID's) and kept as sent; whether it names an answer of the conversation is known in
    the transaction. It is compared with the ids as the paths spell them (``streaming.ids``),
    so another spelling of an answer's id names none: refused as an unknown id is, at the
    same point (a 404, or a retry's key refused as sent with another request)."""
    if value is None:
        return None
    if new:
        raise InvalidParams(
            "a new conversation has no message to go after: post without it", field="parent_id"
        )
    try:
        if isinstance(value, str):
            uuid.UUID(value)
            return value
    except ValueError:
        pass
    raise InvalidParams("must be the id of an answer of the conversation", field="parent_id")


def _chosen_parent(history: History, parent_id: str) -> uuid.UUID:
    """The id of the answer ``parent_id`` names in the conversation ``history`` holds."""
    message = history.messages.get(parent_id)
    if message is None:
        raise NotFound("message not found in this conversation", field="parent_id")
    if message.role != Message.Role.ASSISTANT:
        raise WrongRole("a question goes after an answer (an assistant message)", field="parent_id")
    return message.id


def _made_once(create: Callable[[], Created], key: IdempotencyKey | None) -> Created:
    """``create()``, tried again when its key collided: requests with one key are ordered
    by the lock they take (a conversation's, its owner's, the message they start from),
    so only a key sent at once with requests that take different locks collides, and the
    second attempt finds the first request's messages and says why the key does not fit."""
    try:
        return create()
    except IntegrityError:
        if key is None:
            raise
        return create()


def _exchange(created: Created) -> Exchange:
    """The exchange of what a create made, its answer started (none for a retry)."""
    question, answer, plan, siblings = created
    generation = get_runtime().launch_threadsafe(plan) if plan is not None else None
    return Exchange(question, answer, generation, siblings)


async def post_message(
    user: Any,
    conversation_id: Any,
    content: Any,
    raw_params: Any = None,
    *,
    prior: list[ChatTurn] | None = None,
    abandon_grace: float | None = None,
    tool_call_id: str = "",
    model: str = "",
    parent_id: Any = None,
    idempotency_key: Any = None,
    idempotency_field: str = IDEMPOTENCY_HEADER,
) -> Exchange:
    """``create_exchange`` for async callers: one trip to a database thread."""
    return await database.run(
        create_exchange,
        user,
        conversation_id,
        content,
        raw_params,
        prior=prior,
        abandon_grace=abandon_grace,
        tool_call_id=tool_call_id,
        model=model,
        parent_id=parent_id,
        idempotency_key=idempotency_key,
        idempotency_field=idempotency_field,
    )


def _create_continuation(user: Any, message_id: Any) -> tuple[Message, SegmentPlan]:
    with transaction.atomic():
        message = message_for(user, message_id, lock=True)
        if message.role != Message.Role.ASSISTANT:
            raise WrongRole("only an answer (an assistant message) can be continued")
        if message.status == Status.STREAMING:
            raise Conflict("this message is still streaming; wait for it to end or stop it")
        if message.status in NATURAL_ENDS:
            raise Conflict(
                f"this message ended {message.status}: it is finished and cannot be continued"
            )
        if message.termination.get("context_full"):
            raise ContextFull(
                "this answer fills the model's context: a Continue cannot add anything; "
                "start a new conversation instead"
            )
        _check_capacity(user)
        conversation = message.conversation
        tree = History.of(conversation.id)
        _refuse_full(tree)
        # The path down to the answer, the answer itself last (with its reasoning).
        history = tree.path(message.id)[:-1]
        _refuse_streaming_path(history)
        # An answer below was asked with this one's text as it is: extending it now would
        # change the prompt of an answer still being written.
        _refuse_streaming_branch(message, "continue it", offer_stop=False)
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
        _notify(
            conversation.owner_id,
            _event(
                "message.continued",
                conversation=str(conversation.id),
                message_id=str(message.id),
                after=first_seq - 1,
            ),
        )
        plan = SegmentPlan(
            message_id=str(message.id),
            conversation_id=str(conversation.id),
            user_id=conversation.owner_id,
            segment_index=index,
            first_seq=first_seq,
            base_text=message.content,
            base_reasoning=message.reasoning,
            request=_engine_request(
                message,
                index,
                _turns(conversation, history, partial=message),
                message.params,
                continue_final=True,
            ),
            previous_done=None
            if last is None
            else done_event(message.last_seq, segment=last.index, termination=message.termination),
        )
    return message, plan


def create_continuation(user: Any, message_id: Any) -> Exchange:
    """Append a new segment to a cut-off assistant message and start streaming it on the
    same id (synchronous, like ``create_exchange``)."""
    _accepting()
    message, plan = _create_continuation(user, message_id)
    generation = get_runtime().launch_threadsafe(plan)
    return Exchange(None, message, generation, after=plan.first_seq - 1)


async def continue_message(user: Any, message_id: Any) -> Exchange:
    """``create_continuation`` for async callers."""
    return await database.run(create_continuation, user, message_id)


def _streaming_at_or_below(message: Message) -> QuerySet[Message]:
    """The answers streaming at ``message`` or anywhere below it."""
    below = tree_of(message.conversation_id).subtree(message.id)
    return Message.objects.filter(id__in=below, status=Status.STREAMING)


def _refuse_streaming_branch(message: Message, what: str, *, offer_stop: bool = True) -> None:
    """409 while ``message`` or anything below it streams: its replacement would race it.
    ``offer_stop``: the request takes ``"stop": true`` (a regenerate, an edit)."""
    if _streaming_at_or_below(message).exists():
        how = ' (or send "stop": true)' if offer_stop else ""
        raise Conflict(f"this branch is still streaming; stop it first{how} to {what}")


def _regeneration_params(old: Message, raw_params: Any) -> tuple[str, dict[str, Any]]:
    """The model and parameters of a new answer beside ``old``, or the refusal that
    holds whatever streams (the wrong role, nothing to answer, bad parameters)."""
    if old.role != Message.Role.ASSISTANT:
        raise WrongRole("only an answer (an assistant message) can be regenerated")
    if old.parent_id is None:
        raise Conflict("this answer follows no message, so there is nothing to answer again")
    # The model that gave the old answer gives the new one.
    model = old.model or old.conversation.model or get_runtime().engine.model
    params = old.params if raw_params is None else clean_params(raw_params, model)
    return model, params


def _is_retry(user: Any, idempotency_key: Any, idempotency_field: str) -> bool:
    """Whether a request carries a key that a first request already made something with."""
    key = IdempotencyKey.of(user, idempotency_key, idempotency_field)
    return key is not None and _earlier_request(key) is not None


def check_regeneration(
    user: Any,
    message_id: Any,
    raw_params: Any = None,
    *,
    idempotency_key: Any = None,
    idempotency_field: str = IDEMPOTENCY_HEADER,
) -> bool:
    """Refuse now what ``regenerate`` would refuse whatever streams below the answer,
    and an answer streaming above it, which stopping the branch would not end: a caller
    that stops the branch first (``"stop": true``) must not end an answer for a request
    refused after. Whether to stop the branch: not for a retry of a request that made its
    answer (its key), which makes nothing now, so it stops nothing and is not refused for
    what streams since (it is answered the first request's answer, or refused the key).
    A draining process refuses it first, as it refuses the request (``ShuttingDown``)."""
    _accepting()
    old = message_for(user, message_id)
    _regeneration_params(old, raw_params)
    if _is_retry(user, idempotency_key, idempotency_field):
        return False
    _refuse_beside(old)
    return True


def _refuse_beside(old: Message) -> None:
    """Refuse now what refuses a new version beside ``old`` (a regenerated answer, an
    edited question) whatever streams below it, for a caller about to stop that branch:
    a full conversation (stopping makes no room), and an answer streaming above ``old``
    (stopping the branch would not end it)."""
    history = History.of(old.conversation_id)
    _refuse_full(history)
    _refuse_streaming_path(history.path(old.parent_id))


def _create_regeneration(
    user: Any, message_id: Any, raw_params: Any, key: IdempotencyKey | None
) -> Created:
    with transaction.atomic():
        old = message_for(user, message_id, lock=True)
        model, params = _regeneration_params(old, raw_params)
        if key is not None and (made := _earlier_request(key)) is not None:
            fits = made.role == Message.Role.ASSISTANT and made.parent_id == old.parent_id
            # The old answer's model answers a regeneration, its first one's as well.
            return _replayed(key, made, fits, model, lambda _model: params)
        _refuse_streaming_branch(old, "regenerate it")
        conversation = old.conversation
        _check_capacity(user)
        tree = History.of(conversation.id)
        _refuse_full(tree)
        prompt = tree.path(old.parent_id)
        _refuse_streaming_path(prompt)
        assistant, plan = _start_answer(user, conversation, prompt, params, model, None, key=key)
        _notify(user.pk, _created(None, assistant))
        siblings = {str(assistant.id): [*tree.children(old.parent_id), str(assistant.id)]}
    return None, assistant, plan, siblings


def regenerate(
    user: Any,
    message_id: Any,
    raw_params: Any = None,
    *,
    idempotency_key: Any = None,
    idempotency_field: str = IDEMPOTENCY_HEADER,
) -> Exchange:
    """A new answer beside an answer (a sibling: same question), streaming, made the
    conversation's current branch. ``raw_params``: its parameters (default: the old
    answer's). ``Conflict`` while the old answer streams (see ``stop_branch``).
    ``idempotency_key`` as for ``create_exchange``: a retry gets the answer the first
    regeneration made."""
    _accepting()
    key = IdempotencyKey.of(user, idempotency_key, idempotency_field)
    create = functools.partial(_create_regeneration, user, message_id, raw_params, key)
    return _exchange(_made_once(create, key))


def _check_editable(old: Message) -> None:
    """The refusal of an edit of ``old`` that holds whatever streams and whatever was
    sent before."""
    if old.role != Message.Role.USER:
        raise WrongRole("only a question (a user message) can be edited")


def _edit_params(old: Message, raw_params: Any, model: str) -> tuple[str, dict[str, Any]]:
    """The model and parameters of a new answer to an edit of ``old``. ``model`` was
    checked (``check_model``); by default the conversation's answers. Not asked of a
    retry: it is answered as its first request was (``_replayed``), whatever engine the
    conversation's model is now."""
    model = model or old.conversation.model or get_runtime().engine.model
    return model, clean_params(raw_params, model)


def _edit_request(content: Any, raw_params: Any, model: Any) -> tuple[str, str]:
    """The content and the checked model of an edit, from what needs no row (a bad
    parameter is reported before a bad id)."""
    content = _validate_content(content)
    model = check_model(model)
    clean_params(raw_params, model)
    return content, model


def check_edit(
    user: Any,
    message_id: Any,
    content: Any,
    raw_params: Any = None,
    model: Any = "",
    *,
    idempotency_key: Any = None,
    idempotency_field: str = IDEMPOTENCY_HEADER,
) -> bool:
    """Refuse now what ``edit`` would refuse whatever streams; whether to stop the branch
    (see ``check_regeneration``)."""
    _accepting()
    _, model = _edit_request(content, raw_params, model)
    old = message_for(user, message_id)
    _check_editable(old)
    if _is_retry(user, idempotency_key, idempotency_field):
        return False
    _edit_params(old, raw_params, model)
    _refuse_beside(old)
    return True


def _create_edit(
    user: Any,
    message_id: Any,
    content: str,
    raw_params: Any,
    model: str,
    key: IdempotencyKey | None,
) -> Created:
    with transaction.atomic():
        old = message_for(user, message_id, lock=True)
        _check_editable(old)
        if key is not None and (made := _earlier_request(key)) is not None:
            fits = (
                made.role == Message.Role.USER
                and made.id != old.id  # an edit makes a question beside it, never it
                and made.conversation_id == old.conversation_id
                and made.parent_id == old.parent_id
                and made.content == content
                and not _first_of_its_parent(made)  # a post's question, not an edit's
            )
            return _replayed(key, made, fits, model, functools.partial(clean_params, raw_params))
        # ``model``: the one the edit names ("" none); ``answering``: the one that answers.
        answering, params = _edit_params(old, raw_params, model)
        _refuse_streaming_branch(old, "edit it")
        _check_capacity(user)
        conversation = old.conversation
        tree = History.of(conversation.id)
        _refuse_full(tree)
        prompt = tree.path(old.parent_id)
        _refuse_streaming_path(prompt)
        question = _ask(conversation, old.parent_id, content, key=key)
        assistant, plan = _start_answer(
            user,
            conversation,
            [*prompt, question],
            params,
            answering,
            None,
            new=(question,),
        )
        _notify(user.pk, _created(question, assistant))
        siblings = {
            str(question.id): [*tree.children(old.parent_id), str(question.id)],
            str(assistant.id): [str(assistant.id)],
        }
    return question, assistant, plan, siblings


def edit(
    user: Any,
    message_id: Any,
    content: Any,
    raw_params: Any = None,
    model: Any = "",
    *,
    idempotency_key: Any = None,
    idempotency_field: str = IDEMPOTENCY_HEADER,
) -> Exchange:
    """A new question beside a question (a sibling) and its streaming answer, made the
    conversation's current branch; the old question and everything below it stay.
    ``model``: the model that answers (checked; by default the conversation's).
    ``idempotency_key`` as for ``create_exchange``."""
    _accepting()
    content, model = _edit_request(content, raw_params, model)
    key = IdempotencyKey.of(user, idempotency_key, idempotency_field)
    create = functools.partial(_create_edit, user, message_id, content, raw_params, model, key)
    return _exchange(_made_once(create, key))


async def _made_after_stopping(
    user: Any,
    message_id: Any,
    stop: bool,
    check: Callable[[], bool],
    make: Callable[[], Exchange],
) -> Exchange:
    """``make()`` in a database thread; with ``stop``, the branch below ``message_id``
    stopped first, once ``check()`` found that the request is not refused (nor a retry)."""
    if stop and await database.run(check):
        await stop_branch(user, message_id)
    return await database.run(make)


async def regenerate_message(
    user: Any, message_id: Any, raw_params: Any = None, *, stop: bool = False, **keyed: Any
) -> Exchange:
    """``regenerate`` for async callers; ``stop``: stop the old answer first, once the
    request is known not to be refused. ``keyed``: ``regenerate``'s idempotency key."""
    return await _made_after_stopping(
        user,
        message_id,
        stop,
        functools.partial(check_regeneration, user, message_id, raw_params, **keyed),
        functools.partial(regenerate, user, message_id, raw_params, **keyed),
    )


async def edit_message(
    user: Any,
    message_id: Any,
    content: Any,
    raw_params: Any = None,
    *,
    model: Any = "",
    stop: bool = False,
    **keyed: Any,
) -> Exchange:
    """``edit`` for async callers; ``stop``: stop the branch below the question first,
    once the request is known not to be refused. ``keyed``: ``edit``'s idempotency key."""
    return await _made_after_stopping(
        user,
        message_id,
        stop,
        functools.partial(check_edit, user, message_id, content, raw_params, model, **keyed),
        functools.partial(edit, user, message_id, content, raw_params, model, **keyed),
    )


def _streaming_below(user: Any, message_id: Any) -> dict[str, int]:
    """The answers streaming at or below one of the user's messages, each with its number
    of segments (a Continue adds one: the same id streaming again is a new segment)."""
    return _with_segments(_streaming_at_or_below(message_for(user, message_id)))


def _with_segments(streaming: QuerySet[Message]) -> dict[str, int]:
    """Each of the ``streaming`` answers with its number of segments: a Stop sent to one
    ends the segment it streams then, and the same id streaming again is a new one."""
    counted = streaming.annotate(segment_count=Count("segments")).values_list("id", "segment_count")
    return {str(i): n for i, n in counted}


async def stop_branch(user: Any, message_id: Any) -> None:
    """Stop every answer streaming at or below one of the user's messages, and wait for
    their ends: what a regenerate or an edit that says ``stop`` does first. One of them
    still streaming the segment it was stopped in is ``StopUnconfirmed``; an answer
    started (or continued) meanwhile is left to the request's own check (a 409)."""
    running = await database.run(_streaming_below, user, message_id)
    if not running:
        return
    await stop_answers(list(running), segments=running)
    after = await database.run(_streaming_below, user, message_id)
    if any(running.get(answer) == segments for answer, segments in after.items()):
        raise _unconfirmed(streaming_settings.STOP_WAIT)


def _show_branch(user: Any, conversation: Conversation, message_id: Any) -> list[str]:
    """Show and continue the branch through ``message_id`` (down its latest answers to a
    leaf); the fields to save (the caller saves them). ``NotFound`` for a message that is
    not in ``conversation`` (locked by the caller), and for an id spelt otherwise than
    its tree spells them (as the paths do: ``streaming.ids``), which is looked up as sent."""
    tree = tree_of(conversation.id)
    if message_id is None or message_id not in tree:
        raise NotFound("message not found in this conversation", field="current_leaf")
    conversation.current_leaf_id = tree.leaf_below(message_id)
    _notify(
        user.pk,
        _event(
            "branch.switched",
            conversation=str(conversation.id),
            current_leaf=str(conversation.current_leaf_id),
        ),
    )
    # Looking at another branch is not activity: the conversation keeps its place.
    return ["current_leaf"]


async def continue_interrupted(message_id: str, **kwargs: Any) -> None:
    """Continue an answer the reaper found interrupted, when ``AUTO_CONTINUE_INTERRUPTED``
    (the receiver of ``signals.answer_interrupted``)."""
    if not streaming_settings.AUTO_CONTINUE_INTERRUPTED:
        return
    owner = await database.run(
        lambda: (
            Message.objects.select_related("conversation__owner")
            .get(id=message_id)
            .conversation.owner
        )
    )
    with contextlib.suppress(ServiceError):
        await continue_message(owner, message_id)


def _segment_count(message_id: Any) -> int:
    return Segment.objects.filter(message_id=message_id).count()


async def cancel_message(user: Any, message_id: Any, *, wait: float | None = None) -> Message:
    """Stop a streaming message wherever it is generated; answer with its final state,
    once its end came within ``wait`` seconds (``STOP_WAIT`` by default, as for every
    Stop), else ``StopUnconfirmed``.

    ``Conflict`` when a Continue started a new segment of it meanwhile: that segment was
    not what the caller saw streaming, so it is not stopped behind their back."""
    wait = streaming_settings.STOP_WAIT if wait is None else wait
    message = await database.run(message_for, user, message_id)
    if message.role != Message.Role.ASSISTANT:
        raise WrongRole("only an answer (an assistant message) can be stopped")
    if message.status != Status.STREAMING:
        return message
    segments = await database.run(_segment_count, message.id)
    await stop_answers([str(message.id)], wait=wait, segments={str(message.id): segments})
    after = await database.run(message_for, user, message_id)
    if after.status != Status.STREAMING:
        return after
    if await database.run(_segment_count, message.id) > segments:
        raise Conflict(
            "a Continue started a new segment of this message meanwhile; it is streaming: "
            "stop again to end it"
        )
    raise _unconfirmed(wait)


def _unconfirmed(wait: float) -> StopUnconfirmed:
    """A Stop sent that no process confirmed within ``wait`` seconds: its process is slow,
    or gone, which the others know only once its heartbeat key has expired and stayed
    missing for as long again, at a reaper's pass (every half timeout): its answers are
    then ended ``interrupted``. Said, rather than answering with the answer still
    streaming as if the Stop had been carried out."""
    gone = 2.5 * streaming_settings.HEARTBEAT_TIMEOUT
    return StopUnconfirmed(
        f"the process generating this answer did not confirm the Stop within {wait:g} s; if "
        f"that process is gone, the answer is ended as interrupted within {gone:g} s. "
        "Stop again, or read the answer's end"
    )


async def wait_until_ended(message_id: str, limit: float | None = None) -> None:
    """Return when the message's current segment has ended (the generating process may
    be remote), or after ``limit`` seconds."""
    await get_runtime().wait_until_ended(message_id, limit)


async def left_unread(message_id: str) -> None:
    """The caller that made this answer to read it left before reading it
    (``Generation.left_unread``); nothing if it no longer runs here."""
    generation = get_runtime().generations.get(message_id)
    if generation is not None:
        await generation.left_unread()


async def reader_left(subscription: Subscription) -> None:
    """A transport is done with ``subscription``, whether it read it or not: the one way
    it tells a reader's leaving that the reader could not tell itself. A reader counted
    in presence told it as it left (``Subscription.frames``); one that never began (its
    task cancelled before it ran, its caller gone first) gives back a count it took over
    and leaves its answer unread (``left_unread``), as if it had come and gone. Never
    raises: a failure (presence unreachable) is logged, and the transport ends as it
    would."""
    try:
        await subscription.release()
        if subscription.ended_status is None and not subscription.counted:
            await left_unread(subscription.state.id)
    except Exception:
        log.exception("could not tell that a reader left")


# The answers made for callers that left meanwhile, being told so (``read_by_caller``).
_unread: set[asyncio.Task[None]] = set()


async def read_by_caller(making: Awaitable[T], answer_of: Callable[[T], str | None]) -> T:
    """``making``, a call that makes an answer for its caller to read (a post, an edit,
    a Continue; ``answer_of`` names the answer its result made, None for none), awaited
    shielded from the caller's cancellation. A caller cancelled meanwhile (its client
    left) would not stop the making anyway (its database work runs on in a thread and
    commits whole), only stop waiting for it, and nobody would know of the answer: it
    is left unread (``left_unread``) the moment it exists instead, so it is abandoned
    unless someone else reads it, as when a reader leaves. The cancellation goes on at
    once: the caller is not held until the answer exists."""
    made = asyncio.ensure_future(making)
    try:
        return await asyncio.shield(made)
    except asyncio.CancelledError:
        made.add_done_callback(functools.partial(_made_unread, answer_of))
        raise


def _made_unread(answer_of: Callable[[Any], str | None], made: asyncio.Future[Any]) -> None:
    """``made`` ended for a caller that left: the answer it made, if any, left unread."""
    if made.cancelled() or made.exception() is not None:
        return  # refused or failed: nothing was made
    message_id = answer_of(made.result())
    if message_id is None:
        return
    telling = asyncio.create_task(_tell_unread(message_id))
    _unread.add(telling)
    telling.add_done_callback(_unread.discard)


async def _tell_unread(message_id: str) -> None:
    try:
        await left_unread(message_id)
    except Exception:
        log.exception("could not tell that the caller of an answer left")


def answer_made(exchange: Exchange) -> str:
    """The answer of an exchange (``read_by_caller``'s ``answer_of`` for a service that
    makes one): the one it made, or the one a retry found."""
    return str(exchange.assistant_message.id)


async def stop_answers(
    message_ids: list[str],
    *,
    reason: str = Status.CANCELLED.value,
    wait: float | None = None,
    segments: Mapping[str, int] | None = None,
) -> None:
    """End each message's generation wherever it runs; wait up to ``wait`` seconds
    (``STOP_WAIT`` by default) for their ends. For callers that checked who may stop them
    (the owner through ``message_for``, an operator through the admin's permission).
    ``segments``: how many segments each message had when its caller saw it streaming;
    only the last of those is stopped and waited for, so a Continue's segment started
    meanwhile is not stopped behind the caller's back (a message not in it: whichever
    segment streams)."""
    runtime = get_runtime()
    limit = streaming_settings.STOP_WAIT if wait is None else wait
    stopping = {m: _last_index(segments, m) for m in message_ids}
    for message_id, segment in stopping.items():
        await runtime.cancel(message_id, reason, segment)
    if limit > 0 and message_ids:
        # Each wait returns by itself after ``limit``: no timeout of its own is needed here.
        await asyncio.gather(
            *(runtime.wait_until_ended(m, limit, segment) for m, segment in stopping.items())
        )


def _last_index(segments: Mapping[str, int] | None, message_id: str) -> int | None:
    counted = None if segments is None else segments.get(message_id)
    return None if counted is None else counted - 1


def delete_conversation(user: Any, conversation_id: Any) -> None:
    """Delete one of the user's conversations (``NotFound`` if it is not theirs, or a
    delete at the same moment took it first)."""
    conversation = conversation_for(user, conversation_id)
    if not delete_conversations(Conversation.objects.filter(pk=conversation.pk)):
        raise NotFound("conversation not found")


# How many times a delete stops answers that started after its last stop before it
# gives up with a 409 (each start is a request of the owner's, made in that window).
DELETE_ATTEMPTS = 5


def delete_conversations(conversations: QuerySet[Conversation]) -> int:
    """Stop the conversations' running answers, then delete them with their messages and
    logs, the logs last so that no late append recreates one. Synchronous, for request
    threads; the caller decided who may delete ``conversations``.

    The rows go under the conversations' locks, which every write to a conversation
    takes first: no answer starts in them meanwhile (its rows would outlive the delete,
    or fail it, and its log would outlast it). An answer found streaming under the locks
    that started after the stop is stopped in turn, and the delete tried again: its end
    is written under the same lock, so it cannot be waited for while holding it; so is
    one continued since it was stopped (a new segment of the same answer). One whose
    segment was stopped and did not end (its process is gone or slow, or the Stop came
    before its generation had started) is deleted as it is, and stopped once more
    afterwards; its generation's next write to the deleted log ends it too
    (``LogDeleted``). Returns how many conversations this call deleted (a delete at the
    same moment may take some)."""
    chosen = list(conversations.values_list("pk", flat=True))
    stopped: set[tuple[str, int]] = set()
    for _ in range(DELETE_ATTEMPTS):
        stopping = _streaming_in(chosen) - stopped
        if stopping:
            call(stop_answers, sorted({answer for answer, _ in stopping}))
            stopped |= stopping
        with transaction.atomic():
            locked = Conversation.objects.filter(pk__in=chosen).order_by("pk").select_for_update()
            owned = list(locked.values_list("pk", "owner_id"))
            ids = [pk for pk, _ in owned]
            messages = Message.objects.filter(conversation__in=ids)
            unended = _streaming_in(ids)
            if unended - stopped:
                continue
            message_ids = [str(i) for i in messages.values_list("id", flat=True)]
            _delete_rows_of(ids)
            Conversation.objects.filter(pk__in=ids).delete()
            deleted: defaultdict[int, list[dict[str, Any]]] = defaultdict(list)
            for pk, owner_id in owned:
                deleted[owner_id].append(_event("conversation.deleted", conversation=str(pk)))
            for owner_id, events in deleted.items():
                _notify(owner_id, *events)
        if message_ids:
            call(_drop_logs, message_ids)
        if unended:
            call(stop_answers, sorted({answer for answer, _ in unended}), wait=0)
        return len(owned)
    raise Conflict("answers kept starting in this conversation while it was deleted; try again")


def _delete_rows_of(conversation_ids: list[Any]) -> None:
    """Delete the conversations' messages and segments in a statement each, by their
    conversation. Django's cascade names every message's id in one statement: a
    conversation of more than 65,535 messages could never be deleted, and each try was
    answered "retry". The messages go in one statement, their links to each other with
    them."""
    if not conversation_ids:
        return
    Conversation.objects.filter(pk__in=conversation_ids).update(current_leaf=None)
    Segment.objects.filter(message__conversation__in=conversation_ids).delete()
    statements.delete_rows(Message, "conversation", conversation_ids)


def _streaming_in(conversation_ids: list[Any]) -> set[tuple[str, int]]:
    """The answers streaming in the conversations, each with its segment (its count)."""
    running = Message.objects.filter(conversation__in=conversation_ids, status=Status.STREAMING)
    return set(_with_segments(running).items())


async def _drop_logs(message_ids: list[str]) -> None:
    await get_runtime().log.delete_many(message_ids)
