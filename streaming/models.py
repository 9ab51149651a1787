"""Conversations, messages and the segments (generation runs) of assistant messages.

A conversation is a tree of messages: each message has a parent (``None`` for a first
message), siblings share a parent (a regenerated answer, an edited question), and the
conversation records the leaf of the branch it shows and continues (``current_leaf``).
A Message's content is always the concatenation of its segments' texts, and its
reasoning that of their reasoning; each segment records where its text and its reasoning
start and end in the message (provenance of Continue).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from streaming.termination import Status


class ConversationOwner(models.ForeignKey):
    """A message's copy of its conversation's owner, set when the message is stored (by
    ``save``, ``bulk_create`` and ``streaming.statements`` alike: each asks the field's
    ``pre_save``), so no code that makes a message has to remember it. A conversation
    never changes hands, so the copy never goes stale."""

    def pre_save(self, model_instance: models.Model, add: bool) -> object:
        if add:
            owner = model_instance.conversation.owner_id  # type: ignore[attr-defined]
            setattr(model_instance, self.attname, owner)
        return super().pre_save(model_instance, add)


# The longest title a conversation has.
TITLE_CHARS = 200


class Conversation(models.Model):
    class TitleSource(models.TextChoices):
        NONE = "", "None yet"
        QUESTION = "question", "The first question's first line"
        MODEL = "model", "Written by the engine"
        USER = "user", "Set by the person"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed as the first column of ``conv_owner_recent``: an index of its own would be
    # one more to write on every change of a conversation, and no query needs it.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="conversations",
        db_index=False,
    )
    title = models.CharField(max_length=TITLE_CHARS, blank=True, default="")
    # Who wrote the title: a placeholder (none, the question's line) may be replaced by the
    # engine's title; the person's is never replaced (streaming.titling).
    title_source = models.CharField(
        max_length=16, choices=TitleSource.choices, blank=True, default=TitleSource.NONE
    )
    model = models.CharField(max_length=200, blank=True, default="")
    system_prompt = models.TextField(blank=True, default="")
    # The last message of the branch shown and continued; a new message goes after it.
    current_leaf = models.ForeignKey(
        "Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["owner", "-updated_at"], name="conv_owner_recent")]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.id}"


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user", "User"
        ASSISTANT = "assistant", "Assistant"
        SYSTEM = "system", "System"
        TOOL = "tool", "Tool result"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed as the first column of ``msg_conv_created`` (see ``Meta.indexes``).
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages", db_index=False
    )
    # Its conversation's owner, for the one query by user that every post makes: counting
    # the user's running answers (``msg_owner_streaming``), which through the
    # conversations read every conversation the user ever had. A message goes with its
    # conversation (deleting a user deletes those), so deleting a user looks nothing up
    # by this column.
    owner = ConversationOwner(
        settings.AUTH_USER_MODEL,
        on_delete=models.DO_NOTHING,
        related_name="+",
        editable=False,
        db_index=False,
    )
    # The message this one follows; None for a conversation's first message (and for an
    # edit of it: roots are siblings too).
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True, default="")
    # The model's reasoning before (and between) its answer's text, all segments' in order.
    reasoning = models.TextField(blank=True, default="")
    # An assistant message's tool calls, in OpenAI's shape: [{"id", "type": "function",
    # "function": {"name", "arguments"}}]; a tool message names the call it answers.
    tool_calls = models.JSONField(default=list, blank=True)
    tool_call_id = models.CharField(max_length=200, blank=True, default="")
    # Indexed as the first column of ``msg_status_updated``, and ``msg_streaming`` holds
    # the rows streaming now.
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COMPLETE)
    # The termination record of the last segment (see streaming.termination.Termination).
    termination = models.JSONField(default=dict, blank=True)
    params = models.JSONField(default=dict, blank=True)
    model = models.CharField(max_length=200, blank=True, default="")
    last_seq = models.PositiveBigIntegerField(default=0)
    # The ``Idempotency-Key`` of the request that created this message, as
    # "<owner's pk>:<key>" (keys are the client's, unique per user): a retry of that
    # request finds it instead of making another.
    idempotency_key = models.CharField(max_length=300, null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="msg_idempotency_key",
            )
        ]
        # Every answer inserts two messages and rewrites one as it ends, a change of
        # status that updates every index of the row: only indexes some query needs are
        # kept, none that another one's first column already covers.
        indexes = [
            models.Index(fields=["conversation", "created_at"], name="msg_conv_created"),
            models.Index(fields=["status", "updated_at"], name="msg_status_updated"),
            # The answers streaming now, by conversation (a conversation list says which
            # stream) and by user (every post counts the user's, in
            # ``statements.running_answers``). Only the rows streaming now are in them,
            # where an index of every message's status grows with the table and, until
            # a vacuum, with every answer that once streamed.
            models.Index(
                fields=["conversation"],
                condition=models.Q(status=Status.STREAMING),
                name="msg_streaming",
            ),
            models.Index(
                fields=["owner"],
                condition=models.Q(status=Status.STREAMING),
                name="msg_owner_streaming",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.role} {self.id}"


class Segment(models.Model):
    """One generation run of an assistant message: the first answer or a Continue."""

    # Indexed as the first column of ``segment_message_index``. ``status`` and ``worker``
    # are read only by the reaper, for the segments streaming now
    # (``segment_streaming_worker``). A segment's end changes its status, which updates
    # every index of the row.
    message = models.ForeignKey(
        Message, on_delete=models.CASCADE, related_name="segments", db_index=False
    )
    index = models.PositiveIntegerField()
    start_offset = models.PositiveIntegerField(default=0)
    end_offset = models.PositiveIntegerField(default=0)
    # Where this segment's reasoning lies in the message's reasoning.
    reasoning_start_offset = models.PositiveIntegerField(default=0)
    reasoning_end_offset = models.PositiveIntegerField(default=0)
    # The tool calls the model made in this segment (the message holds all of them).
    tool_calls = models.JSONField(default=list, blank=True)
    first_seq = models.PositiveBigIntegerField(default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.STREAMING)
    finish_reason = models.CharField(max_length=32, blank=True, null=True)
    stop_reason = models.CharField(max_length=200, blank=True, null=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    reasoning_tokens = models.PositiveIntegerField(null=True, blank=True)
    ttft_ms = models.FloatField(null=True, blank=True)
    reasoning_ttft_ms = models.FloatField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    has_unclosed_code_block = models.BooleanField(default=False)
    is_valid_json = models.BooleanField(null=True, blank=True)
    error_type = models.CharField(max_length=100, blank=True, null=True)
    error_message = models.TextField(blank=True, null=True)
    error_code = models.CharField(max_length=64, blank=True, null=True)
    context_full = models.BooleanField(default=False)
    ended_in_reasoning = models.BooleanField(default=False)
    # Which process generates/generated it ("host:pid:start"), for the reaper.
    worker = models.CharField(max_length=200, blank=True, default="")
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["message", "index"]
        constraints = [
            models.UniqueConstraint(fields=["message", "index"], name="segment_message_index")
        ]
        # Only the segments streaming now: the reaper's pass reads them and no others,
        # and a segment leaves the index as it ends (an index of every segment's status
        # grew with the table, and with an entry for every end until a vacuum).
        indexes = [
            models.Index(
                fields=["worker"],
                condition=models.Q(status=Status.STREAMING),
                name="segment_streaming_worker",
            )
        ]

    def __str__(self) -> str:
        return f"segment {self.index} of {self.message_id}"
