"""Messages and segments are described by reading their attributes directly (see
``streaming.api.serializers``); the JSON must stay what DRF's generic representation of
the declared fields gives, or the schema would lie."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.contrib.auth.models import User
from django.test import RequestFactory
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request

from streaming.api.serializers import MessageSerializer, SegmentSerializer
from streaming.models import Conversation, Message, Segment

pytestmark = pytest.mark.django_db


def as_json(data: object) -> object:
    return json.loads(JSONRenderer().render(data))


def test_fast_and_generic_representations_agree() -> None:
    owner = User.objects.create_user("repr")
    conversation = Conversation.objects.create(owner=owner, title="t", model="m")
    question = Message.objects.create(conversation=conversation, role="user", content="q ü")
    answer = Message.objects.create(
        conversation=conversation,
        role="assistant",
        content="an answer 👋🏽",
        status="stopped",
        last_seq=7,
        params={"max_tokens": 5, "stop": ["x"]},
        termination={"status": "stopped", "stop_reason": "x", "ttft_ms": 12.5},
        model="m",
    )
    Segment.objects.create(
        message=answer,
        index=0,
        first_seq=1,
        status="stopped",
        finish_reason="stop",
        stop_reason="x",
        completion_tokens=4,
        ttft_ms=12.5,
        duration_ms=80.25,
        has_unclosed_code_block=False,
        is_valid_json=None,
        worker="w-1",
        ended_at=dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC),
    )
    Segment.objects.create(message=answer, index=1, first_seq=6, worker="w-2")
    context = {"request": Request(RequestFactory().get("/"))}

    for message in (question, Message.objects.get(id=answer.id)):
        serializer = MessageSerializer(message, context=context)
        generic = serializers.ModelSerializer.to_representation(serializer, message)
        assert as_json(serializer.data) == as_json(generic)
    segments = list(answer.segments.all())
    assert len(segments) == 2
    for segment in segments:
        fast = SegmentSerializer().to_representation(segment)
        generic = serializers.ModelSerializer.to_representation(SegmentSerializer(), segment)
        assert as_json(fast) == as_json(generic)
    described = as_json(MessageSerializer(answer, context=context).data)
    assert described["segments"][0]["ended_at"] == "2026-01-02T03:04:05.678901Z"
    assert "worker" not in described["segments"][0], "host and pid are for staff (admin)"
    assert described["conversation"] == str(conversation.id)
    assert described["stream"]["sse"].endswith(f"/api/messages/{answer.id}/stream/")
