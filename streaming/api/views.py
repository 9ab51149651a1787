"""REST endpoints: thin adapters from HTTP to ``streaming.services``/``selectors``.

DRF views are synchronous (Daphne runs them in a worker thread); calls that start or
stop generations hop onto the process's event loop with ``async_to_sync``, where the
generation tasks live.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from streaming import selectors, services
from streaming.api.serializers import (
    ConversationSerializer,
    ExchangeSerializer,
    MessageSerializer,
    PostMessageSerializer,
)
from streaming.models import Conversation, Message
from streaming.runtime import get_runtime


class ConversationList(generics.ListCreateAPIView):
    serializer_class = ConversationSerializer

    def get_queryset(self) -> QuerySet[Conversation]:
        return selectors.conversations_of(self.request.user)

    def perform_create(self, serializer: ConversationSerializer) -> None:
        serializer.instance = services.create_conversation(
            self.request.user,
            title=serializer.validated_data.get("title", ""),
            system_prompt=serializer.validated_data.get("system_prompt", ""),
        )


class ConversationDetail(generics.RetrieveUpdateDestroyAPIView):
    serializer_class = ConversationSerializer
    lookup_url_kwarg = "conversation_id"
    http_method_names = ["get", "patch", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[Conversation]:
        return selectors.conversations_of(self.request.user)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        ids = services.delete_conversation(request.user, kwargs["conversation_id"])
        async_to_sync(_drop_logs)(ids)
        return Response(status=status.HTTP_204_NO_CONTENT)


async def _drop_logs(message_ids: list[str]) -> None:
    runtime = get_runtime()
    for message_id in message_ids:
        if message_id in runtime.generations:
            await runtime.cancel(message_id, "cancelled")
        await runtime.log.delete(message_id)


class ConversationMessages(generics.ListAPIView):
    serializer_class = MessageSerializer

    def get_queryset(self) -> QuerySet[Message]:
        return selectors.messages_of(self.request.user, self.kwargs["conversation_id"])

    @extend_schema(
        request=PostMessageSerializer,
        responses={201: ExchangeSerializer},
        parameters=[OpenApiParameter("wait", bool, description="block until the answer ends")],
    )
    def post(self, request: Request, conversation_id: Any) -> Response:
        body = PostMessageSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        exchange = async_to_sync(services.post_message)(
            request.user,
            conversation_id,
            body.validated_data["content"],
            body.validated_data.get("params"),
        )
        message = exchange.assistant_message
        if _wants_wait(request):
            async_to_sync(services.wait_until_ended)(str(message.id))
        message = Message.objects.prefetch_related("segments").get(id=message.id)
        context = {"request": request}
        data = {
            "user_message": MessageSerializer(exchange.user_message, context=context).data,
            "message": MessageSerializer(message, context=context).data,
        }
        return Response(data, status=status.HTTP_201_CREATED)


def _wants_wait(request: Request) -> bool:
    return request.query_params.get("wait", "").lower() in ("1", "true", "yes")


class MessageDetail(generics.RetrieveAPIView):
    serializer_class = MessageSerializer
    lookup_url_kwarg = "message_id"

    def get_queryset(self) -> QuerySet[Message]:
        return Message.objects.filter(conversation__owner=self.request.user).prefetch_related(
            "segments"
        )


class MessageCancel(APIView):
    @extend_schema(request=None, responses={200: MessageSerializer})
    def post(self, request: Request, message_id: Any) -> Response:
        message = async_to_sync(services.cancel_message)(request.user, message_id)
        message = Message.objects.prefetch_related("segments").get(id=message.id)
        return Response(MessageSerializer(message, context={"request": request}).data)


class MessageContinue(APIView):
    @extend_schema(
        request=None,
        responses={202: MessageSerializer},
        parameters=[OpenApiParameter("wait", bool, description="block until the answer ends")],
    )
    def post(self, request: Request, message_id: Any) -> Response:
        exchange = async_to_sync(services.continue_message)(request.user, message_id)
        message_id = str(exchange.assistant_message.id)
        code = status.HTTP_202_ACCEPTED
        if _wants_wait(request):
            async_to_sync(services.wait_until_ended)(message_id)
            code = status.HTTP_200_OK
        message = Message.objects.prefetch_related("segments").get(id=message_id)
        data = MessageSerializer(message, context={"request": request}).data
        data["after"] = exchange.generation.plan.first_seq - 1
        return Response(data, status=code)
