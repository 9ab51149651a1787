"""API representations. Output only describes; writes go through ``streaming.services``.

Generation parameters are validated by ``streaming.params`` (the same rules for every entry
point); ``GenerationParamsSerializer`` is built from that module's schema, so the OpenAPI
description states exactly the bounds that are enforced.

Messages and segments are described on the path of every answer (its creation answers
with both messages), so their serializers describe them with ``streaming.representation``,
which reads the listed attributes directly: a ``ModelSerializer`` builds its fields from
the model on every instance, which costs more than the description itself. The declared
fields still define the schema, and a test checks that both ways give the same JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db import models
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from streaming import params, representation
from streaming.branches import Tree, sibling_ids
from streaming.errors import too_long
from streaming.models import TITLE_CHARS, Conversation, Message, Segment
from streaming.termination import Status


class TextField(serializers.CharField):
    """A string, not anything that can be turned into one (``42`` is not a message); one
    too long is told so as every entry point tells it, with its length ("is longer than
    32000 characters (it has 40000)"), not DRF's "Ensure this field has no more than"."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        if self.max_length is not None and len(data) > self.max_length:
            raise serializers.ValidationError(too_long(self.max_length, data), code="max_length")
        return super().to_internal_value(data)


class UUIDText(serializers.UUIDField):
    """An id as a string, kept as sent: DRF would also take a number (``123`` as the UUID
    of that int), and would read other spellings of a UUID (uppercase, braces, no hyphens,
    ``urn:uuid:``) as the id the paths spell in lowercase with hyphens. Such a spelling
    names nothing, as it does in a path (``streaming.ids``): the service looks the id up
    as sent, so it answers 404 as an unknown id; what is no UUID at all stays a 400."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid", value=data)
        super().to_internal_value(data)
        return data


class Flag(serializers.BooleanField):
    """``true`` or ``false``, as the WebSocket frames take them: DRF would also take
    ``"yes"``, ``"on"``, ``1`` and their opposites, which a client typing a flag wrongly
    should be told about rather than have read."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            raise serializers.ValidationError("must be true or false", code="invalid")
        return data


class StrictFields(serializers.Serializer):
    """A request body with a key this serializer has no field for is refused, naming it:
    a misspelt key, or one in the wrong place (``max_tokens`` beside ``content`` rather
    than in ``params``, as OpenAI's API has it), would otherwise be ignored and the request
    done otherwise than asked. Read-only fields are fields: a client may send back what
    it was given."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(key for key in data if key not in self.fields)
            if unknown:
                message = params.unknown_field(unknown[0])
                raise serializers.ValidationError({unknown[0]: [message]})
        return super().to_internal_value(data)


class ConversationSerializer(StrictFields, serializers.ModelSerializer):
    current_leaf = UUIDText(
        source="current_leaf_id",
        required=False,
        allow_null=True,  # a conversation without messages has none; a PATCH must name one
        help_text="the last message of the branch shown and continued; PATCH it with any "
        "message of the conversation to switch branch (it goes down that message's latest "
        "answers to a leaf)",
    )
    streaming = serializers.SerializerMethodField(
        help_text="whether an answer of this conversation is streaming now"
    )

    # Text fields take strings only, as a message's content does: a title of 5 is a
    # client's mistake, not "5".
    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.CharField: TextField,
        models.TextField: TextField,
    }

    class Meta:
        model = Conversation
        fields = [
            "id", "title", "title_source", "model", "system_prompt", "current_leaf", "created_at",
            "updated_at", "streaming",
        ]  # fmt: skip
        read_only_fields = ["id", "title_source", "created_at", "updated_at"]
        extra_kwargs = {
            "title": {"required": False, "max_length": TITLE_CHARS},
            "system_prompt": {"required": False, "max_length": settings.MAX_MESSAGE_CHARS},
            "model": {
                "required": False,
                "max_length": 200,
                "help_text": "the model that answers (one of /v1/models); empty: the default",
            },
        }

    def validate_current_leaf(self, value: Any) -> Any:
        if value is None:
            raise serializers.ValidationError("must be the id of a message of the conversation")
        return value

    def get_streaming(self, conversation: Conversation) -> bool:
        """Annotated by ``selectors.conversations_of`` (lists: no query per row); asked of
        the database only for a conversation that did not come from there (a PATCH's)."""
        annotated = getattr(conversation, "streaming", None)
        if annotated is not None:
            return bool(annotated)
        return conversation.messages.filter(status=Status.STREAMING).exists()


class SegmentSerializer(serializers.ModelSerializer):
    def to_representation(self, segment: Segment) -> dict[str, Any]:
        return representation.segment_data(segment)

    class Meta:
        model = Segment
        fields = list(representation.SEGMENT_FIELDS)


class StreamUrlsSerializer(serializers.Serializer):
    sse = serializers.CharField(help_text="GET this for the SSE stream")
    ws = serializers.CharField(help_text='connect, then send {"type": "subscribe", ...}')
    message_id = serializers.UUIDField()


class MessageSerializer(serializers.ModelSerializer):
    """``context``: ``request`` (absolute stream URLs), and ``tree`` (the conversation's
    ``Tree``) or ``siblings`` (id -> sibling ids) when the caller knows them; otherwise a
    message's siblings cost one query."""

    parent_id = serializers.UUIDField(
        read_only=True, allow_null=True, help_text="the message this one follows"
    )
    siblings = serializers.SerializerMethodField()
    segments = SegmentSerializer(many=True, read_only=True)
    stream = serializers.SerializerMethodField()

    class Meta:
        model = Message
        fields = list(representation.MESSAGE_FIELDS)
        read_only_fields = fields

    def to_representation(self, message: Message) -> dict[str, Any]:
        return representation.message_data(message, self.get_siblings(message), self._absolute())

    def _absolute(self) -> representation.Absolute | None:
        request = self.context.get("request")
        return None if request is None else request.build_absolute_uri

    @extend_schema_field(
        serializers.ListField(
            child=serializers.UUIDField(),
            help_text="the messages sharing this one's parent, in creation order, itself "
            "included (the versions of a regenerated answer or an edited question)",
        )
    )
    def get_siblings(self, message: Message) -> list[str]:
        tree: Tree | None = self.context.get("tree")
        if tree is not None and message.id in tree:
            return tree.siblings(message.id)
        known = self.context.get("siblings", {}).get(str(message.id))
        if known is not None:
            return list(known)
        return sibling_ids(message.conversation_id, message.parent_id)

    @extend_schema_field(StreamUrlsSerializer(allow_null=True))
    def get_stream(self, message: Message) -> dict[str, str] | None:
        if message.role != Message.Role.ASSISTANT:
            return None
        return representation.stream_urls(message, self._absolute())


class SimulatedToolCallSerializer(serializers.Serializer):
    name = serializers.CharField()
    arguments = serializers.CharField(required=False, help_text="a string of JSON")


def _simulation_fields() -> dict[str, serializers.Field]:
    """The keys ``validate_simulation`` takes, with its bounds: the documented rules
    are the enforced ones."""
    numbers, integers, texts = params.simulation_keys()
    fields: dict[str, serializers.Field] = {}
    for key, (lowest, highest) in numbers.items():
        fields[key] = serializers.FloatField(required=False, min_value=lowest, max_value=highest)
    for key, (low, high) in integers.items():
        fields[key] = serializers.IntegerField(required=False, min_value=low, max_value=high)
    for key in texts:
        fields[key] = serializers.CharField(required=False)
    fields["tool_call"] = SimulatedToolCallSerializer(required=False)
    return fields


SimulationSerializer = type(
    "SimulationSerializer",
    (serializers.Serializer,),
    {
        "__doc__": "Only while the simulated engine is active (``ENGINE_URL`` unset).",
        **_simulation_fields(),
    },
)


def _number_field(spec: params.Number) -> serializers.Field:
    low, high = spec.bounds()
    bounds: dict[str, Any] = {}
    if low is not None:
        bounds["min_value"] = int(low) if spec.integer else low
    if high is not None:
        bounds["max_value"] = int(high) if spec.integer else high
    field = serializers.IntegerField if spec.integer else serializers.FloatField
    return field(required=False, **bounds)


def _param_field(name: str) -> serializers.Field:
    if name in params.NUMBERS:
        return _number_field(params.NUMBERS[name])
    if name == "tools":
        return serializers.ListField(
            child=serializers.DictField(),
            required=False,
            max_length=params.MAX_TOOLS,
            help_text='OpenAI\'s function tools: [{"type": "function", "function": {"name", '
            '"description", "parameters"}}]',
        )
    if name == "tool_choice":
        return serializers.JSONField(
            required=False,
            help_text='"none", "auto", "required" or {"type": "function", "function": {"name"}}',
        )
    if name == "stop":
        return serializers.ListField(
            child=serializers.CharField(max_length=params.MAX_STOP_CHARS),
            required=False,
            max_length=params.max_stop_sequences(),
            help_text="a string or a list of strings",
        )
    return SimulationSerializer(required=False)


# Fields made in ``params.ALLOWED``'s order: DRF orders declared fields by creation.
GenerationParamsSerializer = type(
    "GenerationParamsSerializer",
    (serializers.Serializer,),
    {"__module__": __name__, **{name: _param_field(name) for name in params.ALLOWED}},
)


@extend_schema_field(GenerationParamsSerializer(allow_null=True))
class GenerationParamsField(serializers.DictField):
    """A JSON object passed on unchanged to ``streaming.params`` for validation."""


class PostMessageSerializer(StrictFields):
    content = TextField(
        max_length=settings.MAX_MESSAGE_CHARS, trim_whitespace=False, allow_blank=False
    )
    params = GenerationParamsField(required=False, allow_null=True)
    model = TextField(
        required=False,
        allow_blank=True,
        max_length=200,
        help_text="the model that answers this message; by default the conversation's",
    )


class ConversationPostSerializer(PostMessageSerializer):
    parent_id = UUIDText(
        required=False,
        allow_null=True,
        help_text="the answer the question goes after, as the client shows the conversation; "
        "another than the current leaf makes a new branch there. Absent or null: after the "
        "current leaf",
    )


class RegenerateSerializer(StrictFields):
    params = GenerationParamsField(
        required=False, allow_null=True, help_text="default: the old answer's parameters"
    )
    stop = Flag(required=False, default=False, help_text="stop the old answer first if it streams")


class EditSerializer(PostMessageSerializer):
    stop = Flag(
        required=False, default=False, help_text="stop the branch below first if it streams"
    )


class ExchangeSerializer(serializers.Serializer):
    user_message = MessageSerializer()
    message = MessageSerializer()


class RegenerationSerializer(serializers.Serializer):
    message = MessageSerializer()


class ErrorDetailSerializer(serializers.Serializer):
    status = serializers.IntegerField()
    code = serializers.CharField()
    message = serializers.CharField()
    field = serializers.CharField(required=False, help_text="the offending field, dotted")


class ErrorSerializer(serializers.Serializer):
    """``streaming.errors``: the shape of every 4xx/5xx answer."""

    error = ErrorDetailSerializer()
