"""REST endpoints: thin adapters from HTTP to ``streaming.services``/``selectors``.

DRF views are synchronous (Daphne runs them in a worker thread). Creating a message or a
continuation writes its rows in the request's thread and only then starts the generation
on the process's event loop, where the generation tasks live; waiting and stopping are
async services, run from here with ``services.call``.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django.db.models import QuerySet
from django.http import HttpRequest
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.permissions import SAFE_METHODS
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer
from rest_framework.views import APIView

from streaming import params, selectors, services
from streaming.api.authentication import AUTHENTICATION_CLASSES
from streaming.api.parsers import JSONBodyParser, PayloadTooLarge
from streaming.api.serializers import (
    ConversationPostSerializer,
    ConversationSerializer,
    EditSerializer,
    ErrorSerializer,
    ExchangeSerializer,
    MessageSerializer,
    PostMessageSerializer,
    RegenerateSerializer,
    RegenerationSerializer,
)
from streaming.errors import IDEMPOTENCY_HEADER, IDEMPOTENCY_META, REPLAYED_HEADER, InvalidParams
from streaming.jsonbody import body_limit, declared_length, too_large_detail
from streaming.models import Conversation, Message
from streaming.storable import UNSTORABLE, is_storable

ERRORS = {
    400: OpenApiResponse(ErrorSerializer, description="invalid request; `field` names it"),
    401: OpenApiResponse(ErrorSerializer, description="not authenticated"),
    403: OpenApiResponse(ErrorSerializer, description="CSRF token missing (session auth)"),
    404: OpenApiResponse(ErrorSerializer, description="no such object of yours"),
    413: OpenApiResponse(ErrorSerializer, description="request body too large"),
    503: OpenApiResponse(
        ErrorSerializer, description="the process is shutting down; retry after `Retry-After`"
    ),
}
# What a request with a body can be told besides.
WITH_BODY = {
    **ERRORS,
    415: OpenApiResponse(ErrorSerializer, description="the body is not `application/json`"),
}
# A 429's causes: the user's answers streaming, or their calls waiting (``?wait=true``).
TOO_MANY = "too many answers streaming, or (`?wait=true`) too many calls waiting on answers"
WAIT = OpenApiParameter("wait", bool, description="block until the answer ends")
TREE = OpenApiParameter(
    "tree", bool, description="every message of every branch (with `parent_id`), oldest first"
)
REUSED = {
    422: OpenApiResponse(
        ErrorSerializer, description="the `Idempotency-Key` was sent with another request"
    )
}
STARTED = {
    **WITH_BODY,
    409: OpenApiResponse(
        ErrorSerializer,
        description="that branch is still streaming, or the conversation is full "
        "(`conversation_full`)",
    ),
    **REUSED,
    429: OpenApiResponse(ErrorSerializer, description=TOO_MANY),
}
POST_RESPONSES = {201: ExchangeSerializer, **STARTED}
IDEMPOTENCY_KEY = OpenApiParameter(
    IDEMPOTENCY_HEADER,
    str,
    OpenApiParameter.HEADER,
    description="a key of the client's (1 to 255 printable ASCII characters), new for each "
    "request: a retry with the same key and body gets what the first request made "
    "(`Idempotent-Replayed: true`) instead of making it again",
)


class JSONOnly(DefaultContentNegotiation):
    """JSON whatever the client asks for: no ``Accept`` or ``?format=`` turns an answer
    or an error into DRF's browsable HTML (or a 404 for a format it does not know).
    Bodies are still chosen by their ``Content-Type`` (415 for anything but JSON)."""

    def select_renderer(self, request: Request, renderers: Any, format_suffix: Any = None) -> Any:
        return renderers[0], renderers[0].media_type


class JSONView(APIView):
    """Every API view: JSON bodies only, bounded and valid UTF-8 on every unsafe method,
    checked after authentication so anonymous callers learn nothing about the body rules."""

    authentication_classes = AUTHENTICATION_CLASSES
    # The unsafe methods whose body holds fields; a key sent with any other (a DELETE,
    # a cancel) is refused by name, as a key no field takes is elsewhere, not ignored.
    body_methods: frozenset[str] = frozenset({"POST", "PUT", "PATCH"})
    parser_classes = [JSONBodyParser]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = JSONOnly

    def initialize_request(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Request:
        """A chunked body (no ``Content-Length``) is read here, at most one byte past the
        limit, and given its length: DRF reads a body only as long as the declared one,
        so it took a chunked body for an empty one."""
        if "CONTENT_LENGTH" not in request.META and request.method not in SAFE_METHODS:
            limit = body_limit()
            raw = request.read(limit + 1) if limit else request.read()
            request.META["CONTENT_LENGTH"] = str(len(raw))
            request._stream = io.BytesIO(raw)
            request._read_started = False  # type: ignore[attr-defined]
        return super().initialize_request(request, *args, **kwargs)

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        limit = body_limit()
        if limit and declared_length(request.META) > limit:
            raise PayloadTooLarge(too_large_detail(limit))
        if request.method not in SAFE_METHODS:
            data = request.data  # parse now: a bad body is a 400 whatever the view
            # Nothing, or ``{}``: a body that is no object (``[]``, ``null``, ``""``) is
            # refused as one with a key is, though it is as empty.
            nothing = isinstance(data, dict) and not data
            if request.method not in self.body_methods and not nothing:
                field = sorted(data)[0] if isinstance(data, dict) else "body"
                message = "takes no body" if field == "body" else params.unknown_field(field)
                raise ValidationError({field: [message]})


SEARCH = OpenApiParameter("search", str, description="only conversations whose title has it")


class ConversationList(JSONView, generics.ListCreateAPIView):
    serializer_class = ConversationSerializer

    def get_queryset(self) -> QuerySet[Conversation]:
        search = self.request.query_params.get("search", "").strip()
        if not is_storable(search):
            # No title holds one, and PostgreSQL refuses NUL in any text it is given.
            raise InvalidParams(UNSTORABLE, field="search")
        return selectors.conversations_of(self.request.user, search)

    def perform_create(self, serializer: BaseSerializer[Any]) -> None:
        serializer.instance = services.create_conversation(
            self.request.user,
            title=serializer.validated_data.get("title", ""),
            system_prompt=serializer.validated_data.get("system_prompt", ""),
            model=serializer.validated_data.get("model", ""),
        )

    @extend_schema(
        responses={200: ConversationSerializer(many=True), **ERRORS}, parameters=[SEARCH]
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(responses={201: ConversationSerializer, **WITH_BODY})
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().post(request, *args, **kwargs)


class ConversationDetail(JSONView, generics.RetrieveUpdateDestroyAPIView):
    serializer_class = ConversationSerializer
    lookup_url_kwarg = "conversation_id"
    http_method_names = ["get", "patch", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[Conversation]:
        return selectors.conversations_of(self.request.user)

    def perform_update(self, serializer: BaseSerializer[Any]) -> None:
        changes = dict(serializer.validated_data)
        leaf = changes.pop("current_leaf_id", None)
        serializer.instance = services.update_conversation(
            self.request.user,
            self.kwargs["conversation_id"],
            changes,
            switch="current_leaf" in self.request.data,
            current_leaf=leaf,
        )

    @extend_schema(responses={200: ConversationSerializer, **ERRORS})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(responses={200: ConversationSerializer, **WITH_BODY})
    def patch(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().patch(request, *args, **kwargs)

    @extend_schema(
        responses={
            204: None,
            **ERRORS,
            409: OpenApiResponse(
                ErrorSerializer, description="answers kept starting in it meanwhile"
            ),
        }
    )
    def delete(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Stop the conversation's running answers, then delete it, its messages and logs."""
        services.delete_conversation(request.user, kwargs["conversation_id"])
        return Response(status=status.HTTP_204_NO_CONTENT)


def _flag(request: Request, name: str) -> bool:
    raw = request.query_params.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise serializers.ValidationError({name: "must be true or false"})


def _wants_wait(request: Request) -> bool:
    return _flag(request, "wait")


PostView = TypeVar("PostView", bound=Callable[..., Response])


def _bounded_waits(post: PostView) -> PostView:
    """A view's ``post`` that takes ``?wait=true``: with it, the call holds one of the
    user's waits (``services.waiting``) from before it makes anything."""

    @functools.wraps(post)
    def wrapped(self: APIView, request: Request, *args: Any, **kwargs: Any) -> Response:
        if not _wants_wait(request):
            return post(self, request, *args, **kwargs)
        with services.waiting(request.user):
            return post(self, request, *args, **kwargs)

    return cast(PostView, wrapped)


def _started(
    request: Request, exchange: services.Exchange, wait: bool, *, with_question: bool
) -> Response:
    """201 with the new answer (and the question it answers when one was made); a retry
    gets the first request's 201 again, said so by ``Idempotent-Replayed``."""
    context = {"request": request, "siblings": exchange.siblings}
    answer = exchange.assistant_message
    if wait:
        services.call(services.wait_until_ended, str(answer.id))
        answer = selectors.message_for(request.user, answer.id)
    data = {"message": MessageSerializer(answer, context=context).data}
    if with_question:
        data = {
            "user_message": MessageSerializer(exchange.user_message, context=context).data,
            **data,
        }
    replayed = {REPLAYED_HEADER: "true"} if exchange.generation is None else None
    return Response(data, status=status.HTTP_201_CREATED, headers=replayed)


def _message_data(request: Request, message_id: Any) -> dict[str, Any]:
    message = selectors.message_for(request.user, message_id)
    return MessageSerializer(message, context={"request": request}).data


class ConversationMessages(JSONView, generics.ListAPIView):
    serializer_class = MessageSerializer

    def get_queryset(self) -> QuerySet[Message]:
        """Unused: a listing follows the conversation's tree (``get``), not a query."""
        return Message.objects.none()

    @extend_schema(responses={200: MessageSerializer(many=True), **ERRORS}, parameters=[TREE])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """The branch shown, first message to current leaf (``?tree=true``: every branch)."""
        tree, ids = selectors.branch_ids(
            request.user, kwargs["conversation_id"], whole_tree=_flag(request, "tree")
        )
        page: list[str] | None = self.paginate_queryset(ids)  # type: ignore[arg-type]
        messages = selectors.messages_in_order(page if page is not None else ids)
        data = MessageSerializer(messages, many=True, context={"request": request, "tree": tree})
        return self.get_paginated_response(data.data)

    @extend_schema(
        request=ConversationPostSerializer,
        responses=POST_RESPONSES,
        parameters=[WAIT, IDEMPOTENCY_KEY],
    )
    @_bounded_waits
    def post(self, request: Request, conversation_id: Any) -> Response:
        """Post a user message (after ``parent_id``, else the current leaf) and start the
        answer; the answer's ``stream`` has its URLs."""
        return _post_message(request, conversation_id)


def _post_message(request: Request, conversation_id: Any) -> Response:
    """``conversation_id`` ``None``: in a new conversation, made with the message."""
    wait = _wants_wait(request)
    kind = PostMessageSerializer if conversation_id is None else ConversationPostSerializer
    body = kind(data=request.data)
    body.is_valid(raise_exception=True)
    exchange = services.create_exchange(
        request.user,
        conversation_id,
        body.validated_data["content"],
        body.validated_data.get("params"),
        model=body.validated_data.get("model", ""),
        parent_id=body.validated_data.get("parent_id"),
        idempotency_key=_idempotency_key(request),
    )
    return _started(request, exchange, wait, with_question=True)


def _idempotency_key(request: Request) -> str | None:
    """The header as the lean post reads it (``request.META``), one value for both."""
    return request.META.get(IDEMPOTENCY_META)


class NewConversationMessages(JSONView):
    @extend_schema(
        request=PostMessageSerializer,
        responses=POST_RESPONSES,
        parameters=[WAIT, IDEMPOTENCY_KEY],
    )
    @_bounded_waits
    def post(self, request: Request) -> Response:
        """Start a new conversation with its first message, and its answer. The
        conversation is made in the same transaction: a refused message leaves nothing
        (``message.conversation`` is the new conversation's id)."""
        return _post_message(request, None)


class MessageDetail(JSONView):
    @extend_schema(responses={200: MessageSerializer, **ERRORS})
    def get(self, request: Request, message_id: Any) -> Response:
        """Content, status, termination record and segments of one message."""
        return Response(_message_data(request, message_id))


class MessageCancel(JSONView):
    body_methods: frozenset[str] = frozenset()

    @extend_schema(
        request=None,
        responses={
            200: MessageSerializer,
            **ERRORS,
            409: OpenApiResponse(ErrorSerializer, description="a Continue started meanwhile"),
        },
    )
    def post(self, request: Request, message_id: Any) -> Response:
        """Stop the answer wherever it is generated; answers with its final state."""
        message = services.call(services.cancel_message, request.user, message_id)
        return Response(_message_data(request, message.id))


class MessageContinue(JSONView):
    body_methods: frozenset[str] = frozenset()

    @extend_schema(
        request=None,
        responses={
            200: MessageSerializer,
            202: MessageSerializer,
            **ERRORS,
            409: OpenApiResponse(
                ErrorSerializer,
                description="not a cut-off answer, or the conversation is full "
                "(`conversation_full`)",
            ),
            429: OpenApiResponse(ErrorSerializer, description=TOO_MANY),
        },
        parameters=[WAIT],
    )
    @_bounded_waits
    def post(self, request: Request, message_id: Any) -> Response:
        """Append a segment to a cut-off answer; stream it from ``after``."""
        wait = _wants_wait(request)
        exchange = services.create_continuation(request.user, message_id)
        message_id = str(exchange.assistant_message.id)
        code: int = status.HTTP_202_ACCEPTED
        if wait:
            services.call(services.wait_until_ended, message_id)
            code = status.HTTP_200_OK
        data = _message_data(request, message_id)
        data["after"] = exchange.after
        return Response(data, status=code)


class MessageRegenerate(JSONView):
    @extend_schema(
        request=RegenerateSerializer,
        responses={201: RegenerationSerializer, **STARTED},
        parameters=[WAIT, IDEMPOTENCY_KEY],
    )
    @_bounded_waits
    def post(self, request: Request, message_id: Any) -> Response:
        """A new answer beside this one (same question), streaming; it becomes the branch
        shown. 400 for a question; 409 while this answer streams, unless ``stop``."""
        wait = _wants_wait(request)
        body = RegenerateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        raw_params = body.validated_data.get("params")
        key = _idempotency_key(request)
        if body.validated_data["stop"] and services.check_regeneration(
            request.user, message_id, raw_params, idempotency_key=key
        ):
            services.call(services.stop_branch, request.user, message_id)
        exchange = services.regenerate(request.user, message_id, raw_params, idempotency_key=key)
        return _started(request, exchange, wait, with_question=False)


class MessageEdit(JSONView):
    @extend_schema(
        request=EditSerializer,
        responses={201: ExchangeSerializer, **STARTED},
        parameters=[WAIT, IDEMPOTENCY_KEY],
    )
    @_bounded_waits
    def post(self, request: Request, message_id: Any) -> Response:
        """A new question beside this one, and its streaming answer; they become the branch
        shown. 400 for an answer; 409 while the branch below streams, unless ``stop``."""
        wait = _wants_wait(request)
        body = EditSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        edit = (request.user, message_id, data["content"], data.get("params"), data.get("model"))
        key = _idempotency_key(request)
        if data["stop"] and services.check_edit(*edit, idempotency_key=key):
            services.call(services.stop_branch, request.user, message_id)
        exchange = services.edit(*edit, idempotency_key=key)
        return _started(request, exchange, wait, with_question=True)
