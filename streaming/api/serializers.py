"""API representations. Output only describes; writes go through ``streaming.services``."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from streaming.models import Conversation, Message, Segment


class ConversationSerializer(serializers.ModelSerializer):
    class Meta:
        model = Conversation
        fields = ["id", "title", "model", "system_prompt", "created_at", "updated_at"]
        read_only_fields = ["id", "model", "created_at", "updated_at"]
        extra_kwargs = {
            "title": {"required": False, "max_length": 200},
            "system_prompt": {"required": False, "max_length": 32000},
        }


class SegmentSerializer(serializers.ModelSerializer):
    class Meta:
        model = Segment
        fields = [
            "index", "start_offset", "end_offset", "first_seq", "status", "finish_reason",
            "stop_reason", "prompt_tokens", "completion_tokens", "ttft_ms", "duration_ms",
            "has_unclosed_code_block", "is_valid_json", "error_type", "error_message",
            "error_code", "worker", "started_at", "ended_at",
        ]  # fmt: skip


class MessageSerializer(serializers.ModelSerializer):
    segments = SegmentSerializer(many=True, read_only=True)
    stream = serializers.SerializerMethodField()

    class Meta:
        model = Message
        fields = [
            "id", "conversation", "role", "content", "status", "termination", "params",
            "model", "last_seq", "created_at", "updated_at", "segments", "stream",
        ]  # fmt: skip
        read_only_fields = fields

    def get_stream(self, message: Message) -> dict[str, str] | None:
        if message.role != Message.Role.ASSISTANT:
            return None
        return stream_urls(self.context.get("request"), message)


def stream_urls(request: Any, message: Message) -> dict[str, str]:
    sse = f"/api/messages/{message.id}/stream/"
    ws = "/ws/chat/"
    if request is not None:
        sse = request.build_absolute_uri(sse)
        ws = request.build_absolute_uri(ws).replace("http", "ws", 1)
    return {"sse": sse, "ws": ws, "message_id": str(message.id)}


class PostMessageSerializer(serializers.Serializer):
    content = serializers.CharField(
        max_length=settings.MAX_MESSAGE_CHARS, trim_whitespace=False, allow_blank=False
    )
    params = serializers.DictField(required=False, allow_null=True)


class ExchangeSerializer(serializers.Serializer):
    user_message = MessageSerializer()
    message = MessageSerializer()
