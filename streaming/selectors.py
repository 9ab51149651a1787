"""Reads: what a user may see, looked up through the user (another user's id -> NotFound).

Selectors never write; the services (writes) use the lookups here. Reading a stream is
the read service's (``streaming.reading``); ``subscription`` hands a transport a reader
built on this process's parts.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Exists, OuterRef, QuerySet

from streaming import database, statements
from streaming.auth import known_user, resolve_user
from streaming.branches import Tree, tree_of
from streaming.engines.base import ModelInfo
from streaming.errors import NotFound
from streaming.feed import Listener
from streaming.models import TITLE_CHARS, Conversation, Message
from streaming.reading import MessageState, SendBuffer, Subscription
from streaming.runtime import get_runtime
from streaming.termination import Status

# A malformed id is just an id that names nothing (ValidationError for bad UUIDs).
_NOTHING = (ValidationError, ValueError, TypeError)


def conversation_for(user: Any, conversation_id: Any, *, lock: bool = False) -> Conversation:
    """``lock`` (inside a write's transaction): the conversation's row and its owner's
    (the per-user limit counts under the owner's), in the same query."""
    try:
        if lock:
            found = statements.lock_conversation(user.pk, conversation_id)
            if found is None:
                raise Conversation.DoesNotExist
            return found
        return Conversation.objects.filter(owner=user).get(id=conversation_id)
    except (Conversation.DoesNotExist, *_NOTHING):
        raise NotFound("conversation not found") from None


def locked_for_post(
    user: Any, conversation_id: Any, stored_key: str | None
) -> statements.PostReads:
    """``statements.post_reads`` for ``user``'s post to ``conversation_id`` (None: a new
    conversation); ``NotFound`` when it names none of the user's conversations."""
    try:
        reads = statements.post_reads(user.pk, conversation_id, stored_key)
    except _NOTHING:
        raise NotFound("conversation not found") from None
    if conversation_id is not None and reads.conversation is None:
        raise NotFound("conversation not found")
    return reads


def message_for(user: Any, message_id: Any, *, lock: bool = False) -> Message:
    """``lock`` (inside a write's transaction): its conversation's row and its owner's
    are locked first, by the statement every write to a conversation locks them with
    (``conversation_for``), so writes to one conversation queue in one order and never
    deadlock; the message and its conversation are read after the lock, so a write
    decides from what the writes before it left (a locking read's other rows are the
    ones its statement saw before it waited: a rename committed meanwhile was written
    back over, a second Continue saw the first's message as cut off)."""
    queryset = Message.objects.filter(conversation__owner=user).select_related("conversation")
    try:
        if lock:
            conversation_id = queryset.values_list("conversation_id", flat=True).get(id=message_id)
            conversation_for(user, conversation_id, lock=True)
        return queryset.get(id=message_id)
    except (Message.DoesNotExist, *_NOTHING):
        raise NotFound("message not found") from None


def conversations_of(user: Any, search: str = "") -> QuerySet[Conversation]:
    """Newest activity first, each with ``streaming``: whether an answer of it is streaming
    now (one subquery, not a query per conversation); ``search`` filters by title. A
    search longer than a title can be is in none, and is not sent to the database (a
    search cut to that length would find titles that hold only its start)."""
    streaming = Message.objects.filter(conversation=OuterRef("pk"), status=Status.STREAMING)
    conversations = Conversation.objects.filter(owner=user)
    if len(search) > TITLE_CHARS:
        conversations = conversations.none()
    elif search:
        conversations = conversations.filter(title__icontains=search)
    return conversations.annotate(streaming=Exists(streaming)).order_by("-updated_at")


def branch_ids(
    user: Any, conversation_id: Any, *, whole_tree: bool = False
) -> tuple[Tree, list[str]]:
    """A conversation's tree and the ids to list: the branch shown, first message to the
    current leaf, or (``whole_tree``) every message oldest first."""
    conversation = conversation_for(user, conversation_id)
    tree = tree_of(conversation.id)
    if whole_tree:
        return tree, list(tree.parents)
    leaf = conversation.current_leaf_id or tree.last_leaf()
    return tree, tree.path(leaf) if leaf is not None else []


def outline(conversation: Conversation) -> list[tuple[Message, int, bool]]:
    """Every message of a conversation in tree order (each followed by its answers or
    follow-ups, versions in creation order), with its depth and whether it is on the
    branch shown: what the admin draws. For callers that checked who may see it."""
    tree = tree_of(conversation.id)
    leaf = conversation.current_leaf_id or tree.last_leaf()
    shown = set(tree.path(leaf)) if leaf is not None else set()
    rows = {str(m.id): m for m in Message.objects.filter(conversation=conversation)}
    ordered: list[tuple[Message, int, bool]] = []
    pending = [(root, 0) for root in reversed(tree.children.get(None, []))]
    while pending:
        message_id, depth = pending.pop()
        ordered.append((rows[message_id], depth, message_id in shown))
        pending.extend((c, depth + 1) for c in reversed(tree.children.get(message_id, [])))
    return ordered


def messages_in_order(ids: list[str]) -> list[Message]:
    """The messages ``ids`` names (from ``branch_ids``: already the caller's), in that
    order, with their segments."""
    rows = Message.objects.filter(id__in=ids).prefetch_related("segments")
    by_id = {str(m.id): m for m in rows}
    return [by_id[i] for i in ids]


def _state(user: Any, message_id: Any) -> MessageState:
    try:
        message = (
            Message.objects.filter(conversation__owner=user, role=Message.Role.ASSISTANT)
            .only(*MessageState.FIELDS)
            .get(id=message_id)
        )
    except (Message.DoesNotExist, *_NOTHING):
        raise NotFound("message not found") from None
    return MessageState.of(message)


def _streaming_here(user: Any, message_id: Any) -> MessageState | None:
    """The state of ``user``'s answer while it streams in this process, known without a
    query: the generation was started from the committed record of that user's
    conversation (its plan holds the owner) and is neither ending nor ended, so the
    record says ``streaming`` as the database would, and anyone else's answer, or one
    not generating here, is left to the database's lookup (and its 404)."""
    if not user.is_authenticated:
        return None
    generation = get_runtime().generations.streaming(str(message_id))
    if generation is None or generation.plan.user_id != user.pk:
        return None
    return MessageState.streaming(generation.message_id, generation.plan.first_seq - 1)


async def message_state(user: Any, message_id: Any) -> MessageState:
    """The state a reader of ``user``'s answer needs (``NotFound`` for anyone else's): a
    database trip unless the answer streams here."""
    state = _streaming_here(user, message_id)
    return state if state is not None else await database.run(_state, user, message_id)


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
    opening a stream is on the path of every answer's first token; none for a token this
    process holds reading an answer that streams here (a resume, most often), nor for an
    ``Authorization`` header that is no token."""
    user = known_user(scope)
    if user is not None:
        if not user.is_authenticated:
            return user, None
        state = _streaming_here(user, message_id)
        if state is not None:
            return user, state
    return await database.run(_reader, scope, message_id)


def subscription(
    state: MessageState, after: int, transport: str, send_buffer: SendBuffer | None = None
) -> Subscription:
    """A reader of ``state``'s message from ``after``, for a transport to frame."""
    return get_runtime().subscription(state, after, transport, send_buffer)


def feed_of(user: Any) -> Listener:
    """A listener of the user's event feed in this process (``forget_feed`` when done)."""
    return get_runtime().feed.listen(user.pk)


def forget_feed(user: Any, listener: Listener) -> None:
    get_runtime().feed.forget(user.pk, listener)


def engine_model() -> str:
    """The model name the engine is configured with ("" when it serves whatever it lists)."""
    return get_runtime().engine.model


def accepts_simulation(model: str = "") -> bool:
    """Whether the engine of ``model`` takes ``params.simulation`` (the simulated one does)."""
    return get_runtime().catalog.engine_for(model).accepts_simulation


async def engine_models() -> list[ModelInfo]:
    """The models every engine serves, the default engine's first (none of a server that
    cannot be reached now, but what an engine is configured with)."""
    return [served.info for served in await get_runtime().catalog.served()]


async def served_models() -> set[str]:
    """The model names a request may ask for."""
    return {served.info.id for served in await get_runtime().catalog.served()}


async def engine_healthy() -> bool:
    return await get_runtime().engine.health()


async def ping_backends() -> None:
    """Raise if the stream log or presence backend is unreachable."""
    runtime = get_runtime()
    await runtime.log.ping()
    await runtime.presence.ping()


def accepting() -> bool:
    """False while this process drains after SIGTERM."""
    return get_runtime().accepting
