"""The operators' view: conversations, messages with their termination records and segments,
and the answers streaming right now with a Stop that really ends them.

Messages are records of what happened, so they are read-only here; only a conversation's
title and system prompt are editable. Stop and delete are the same services the API uses
(``services.stop_answers``, ``services.delete_conversations``): they reach the generating
process wherever it runs, and the engine request is aborted there. The in-flight list
lives at ``/admin/streaming/message/in-flight/``, linked from the conversation and message
lists (``frontend/templates/admin/``).
Model output is shown as text (escaped), never as HTML.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import smart_split
from rest_framework.authtoken.admin import TokenAdmin
from rest_framework.authtoken.models import TokenProxy

from streaming import selectors, services
from streaming.conf import streaming_settings
from streaming.models import Conversation, Message, Segment
from streaming.storable import is_storable
from streaming.termination import Status

SEGMENT_COLUMNS = (
    ("index", "#"),
    ("status", "status"),
    ("finish_reason", "finish"),
    ("stop_reason", "stop reason"),
    ("completion_tokens", "tokens"),
    ("ttft_ms", "TTFT ms"),
    ("duration_ms", "duration ms"),
    ("start_offset", "from"),
    ("end_offset", "to"),
    ("error_message", "error"),
    ("worker", "worker"),
)
# The words a list's search may have. Django filters by every word of ``?q=`` (each word an
# OR over the search fields, the words joined by AND), so the query grows with the words:
# a few thousand took tens of seconds. More than anyone types into a search box.
MAX_SEARCH_WORDS = 32


def _excerpt(text: str, limit: int = 80) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def termination_html(termination: dict[str, Any]) -> SafeString:
    if not termination:
        return format_html("<em>{}</em>", "none yet")
    return format_html("<pre>{}</pre>", json.dumps(termination, indent=2, ensure_ascii=False))


def segments_html(segments: list[Segment]) -> SafeString:
    if not segments:
        return format_html("<em>{}</em>", "no segments")
    head = format_html_join("", "<th>{}</th>", ((label,) for _, label in SEGMENT_COLUMNS))
    rows = format_html_join(
        "",
        "<tr>{}</tr>",
        (
            (
                format_html_join(
                    "",
                    "<td>{}</td>",
                    (
                        ("" if getattr(s, name) is None else getattr(s, name),)
                        for name, _ in SEGMENT_COLUMNS
                    ),
                ),
            )
            for s in segments
        ),
    )
    return format_html("<table><thead><tr>{}</tr></thead><tbody>{}</tbody></table>", head, rows)


@admin.action(description="Stop generation", permissions=["stop"])
def stop_generation(
    model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet
) -> None:
    ids = [str(i) for i in queryset.filter(status=Status.STREAMING).values_list("id", flat=True)]
    if not ids:
        model_admin.message_user(request, "None of these answers is streaming.", messages.WARNING)
        return
    services.call(services.stop_answers, ids)
    still = Message.objects.filter(id__in=ids, status=Status.STREAMING).count()
    stopped = len(ids) - still
    model_admin.message_user(request, f"Stopped {stopped} generation(s).", messages.SUCCESS)
    if still:
        model_admin.message_user(
            request,
            f"{still} did not confirm within {streaming_settings.STOP_WAIT:g} s; they end "
            "when their process "
            "handles the stop (or the reaper finds the process gone).",
            messages.WARNING,
        )


class StopPermission:
    def has_stop_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("streaming.change_message")


class StorableLookups:
    """A list's filters and search that PostgreSQL could not compare (NUL, an unpaired
    surrogate: ``?status__exact=%00`` was a 500) are refused as any bad lookup is: the
    list comes back with its filters dropped and Django's "bad parameters" flag.

    A search of more than ``MAX_SEARCH_WORDS`` words is not run: the list is empty, its
    search kept in the box to shorten, and the staff user told why. Words are counted as
    Django's search splits them (``smart_split``: a quoted phrase is one word)."""

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        for key, values in request.GET.lists():
            if not all(is_storable(text) for text in (key, *values)):
                raise IncorrectLookupParameters(f"{key!r} holds a character text cannot")
        changelist = super().get_changelist_instance(request)  # type: ignore[misc]
        # Told here, once a list: the search itself is run again for each facet's count.
        if words := self._refused_search(request, changelist.query):
            self.message_user(  # type: ignore[attr-defined]
                request,
                f"Search takes at most {MAX_SEARCH_WORDS} words (a quoted phrase is one); "
                f"this one has {words}.",
                messages.ERROR,
            )
        return changelist

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        if self._refused_search(request, search_term):
            return queryset.none(), False
        return super().get_search_results(request, queryset, search_term)  # type: ignore[misc]

    def _refused_search(self, request: HttpRequest, search_term: str) -> int:
        """The words of ``search_term`` when there are more than a search takes, else 0
        (also when the list has no search: Django ignores the term then)."""
        if not self.get_search_fields(request):  # type: ignore[attr-defined]
            return 0
        words = sum(1 for _ in smart_split(search_term))
        return words if words > MAX_SEARCH_WORDS else 0


class MessagesGoWithTheirOwner:
    """Deleting what holds messages (a conversation, a user) deletes them with it: Django
    asks for the permission to delete each related model too, and no one has it for
    messages (one is never deleted alone), so no conversation with messages and no user
    with conversations could be deleted here. The owner's own permission is the one asked."""

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        deleted, counts, needed, protected = super().get_deleted_objects(  # type: ignore[misc]
            objs, request
        )
        return deleted, counts, needed - {Message._meta.verbose_name}, protected


class ReadOnlyInline:
    extra = 0
    max_num: int | None = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class MessageInline(ReadOnlyInline, admin.StackedInline):
    model = Message
    fields = readonly_fields = ("role", "status", "content", "termination_record", "segment_table")
    show_change_link = True
    ordering = ["created_at"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Message]:
        return super().get_queryset(request).prefetch_related("segments")

    @admin.display(description="termination record")
    def termination_record(self, message: Message) -> SafeString:
        if message.role != Message.Role.ASSISTANT:
            return format_html("<em>{}</em>", "only answers have one")
        return termination_html(message.termination)

    @admin.display(description="segments")
    def segment_table(self, message: Message) -> SafeString:
        return segments_html(list(message.segments.all()))


class LastStatusFilter(admin.SimpleListFilter):
    title = "last answer status"
    parameter_name = "last_status"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return list(Status.choices)

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value():
            return queryset.filter(last_status=self.value())
        return queryset


class ConversationForm(forms.ModelForm):
    """What the API's conversation fields allow: a system prompt as long as a message."""

    system_prompt = forms.CharField(
        required=False, max_length=settings.MAX_MESSAGE_CHARS, widget=forms.Textarea
    )

    class Meta:
        model = Conversation
        fields = ["title", "system_prompt"]


@admin.register(Conversation)
class ConversationAdmin(StorableLookups, MessagesGoWithTheirOwner, admin.ModelAdmin):
    form = ConversationForm
    list_display = ["__str__", "owner", "message_count", "last_status", "updated_at"]
    list_filter = [LastStatusFilter, "updated_at", "created_at"]
    search_fields = ["title", "messages__content", "owner__username"]
    list_select_related = ["owner"]
    fields = [
        "owner", "title", "title_source", "system_prompt", "models", "branches", "created_at",
        "updated_at",
    ]  # fmt: skip
    readonly_fields = ["owner", "title_source", "models", "branches", "created_at", "updated_at"]
    inlines = [MessageInline]

    # What shows or finds messages' text is for those who may view messages (the inline
    # of messages already is: Django asks the message's permission for it).
    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = super().get_fields(request, obj)
        return fields if _views_messages(request) else [f for f in fields if f != "branches"]

    def get_search_fields(self, request: HttpRequest) -> Any:
        fields = super().get_search_fields(request)
        if _views_messages(request):
            return fields
        return [f for f in fields if not f.startswith("messages__")]

    @admin.display(description="messages as a tree (▶ the branch shown)")
    def branches(self, conversation: Conversation) -> SafeString:
        rows = selectors.outline(conversation)
        if not rows:
            return format_html("<em>{}</em>", "no messages")
        return format_html(
            '<table class="message-tree"><tbody>{}</tbody></table>',
            format_html_join(
                "",
                '<tr><td>{}</td><td style="padding-left:{}em">{} <a href="{}">{}</a></td>'
                "<td>{}</td><td>{}</td></tr>",
                (
                    (
                        "▶" if shown else "",
                        1.5 * depth,
                        message.role,
                        reverse("admin:streaming_message_change", args=[message.id]),
                        _excerpt(message.content),
                        message.status if message.role == Message.Role.ASSISTANT else "",
                        message.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                    )
                    for message, depth, shown in rows
                ),
            ),
        )

    @admin.display(description="model")
    def models(self, conversation: Conversation) -> str:
        """The conversation's fixed model, else the models its answers name."""
        if conversation.model:
            return conversation.model
        named = (
            conversation.messages.filter(role=Message.Role.ASSISTANT)
            .exclude(model="")
            .order_by("model")
            .values_list("model", flat=True)
            .distinct()
        )
        return ", ".join(named) or "-"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Conversation]:
        last = Message.objects.filter(
            conversation=OuterRef("pk"), role=Message.Role.ASSISTANT
        ).order_by("-created_at")
        return (
            super()
            .get_queryset(request)
            .annotate(
                message_count=Count("messages", distinct=True),
                last_status=Subquery(last.values("status")[:1]),
            )
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # conversations are made by their owners, through the API

    @admin.display(description="messages", ordering="message_count")
    def message_count(self, conversation: Conversation) -> int:
        return conversation.message_count  # type: ignore[attr-defined]

    @admin.display(description="last status", ordering="last_status")
    def last_status(self, conversation: Conversation) -> str:
        return conversation.last_status or "-"  # type: ignore[attr-defined]

    def save_model(
        self, request: HttpRequest, obj: Conversation, form: forms.ModelForm, change: bool
    ) -> None:
        """Through the service the API renames with: under the conversation's lock, the
        title then the owner's (a model's title never replaces it), and the owner's open
        pages told."""
        changes = {name: form.cleaned_data[name] for name in form.changed_data}
        if changes:
            services.update_conversation(obj.owner, obj.pk, changes)

    def delete_model(self, request: HttpRequest, obj: Conversation) -> None:
        self.delete_queryset(request, Conversation.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Conversation]) -> None:
        """Stop running answers first, then delete; the logs go last (nothing recreates them)."""
        services.delete_conversations(queryset)


class SegmentInline(ReadOnlyInline, admin.TabularInline):
    model = Segment
    fields = readonly_fields = (*(name for name, _ in SEGMENT_COLUMNS), "error_type", "ended_at")
    ordering = ["index"]


@admin.register(Message)
class MessageAdmin(StorableLookups, StopPermission, admin.ModelAdmin):
    list_display = ["id", "conversation", "owner", "role", "status", "model", "created_at"]
    list_filter = ["status", "role", "created_at"]
    search_fields = ["content", "conversation__title", "conversation__owner__username"]
    list_select_related = ["conversation__owner"]
    fields = readonly_fields = (
        "conversation", "parent", "role", "status", "content", "termination_record", "params",
        "model", "last_seq", "created_at", "updated_at",
    )  # fmt: skip
    # What only an answer has: a user message shows none of it rather than "none yet".
    ANSWER_ONLY = ("status", "termination_record", "params", "model", "last_seq")
    inlines = [SegmentInline]
    actions = [stop_generation]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = super().get_fields(request, obj)
        if obj is not None and obj.role != Message.Role.ASSISTANT:
            return [f for f in fields if f not in self.ANSWER_ONLY]
        return fields

    def get_inlines(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None and obj.role != Message.Role.ASSISTANT:
            return []
        return super().get_inlines(request, obj)

    @admin.display(description="owner", ordering="conversation__owner__username")
    def owner(self, message: Message) -> str:
        return message.conversation.owner.get_username()

    @admin.display(description="termination record")
    def termination_record(self, message: Message) -> SafeString:
        return termination_html(message.termination)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a message goes with its conversation

    def get_urls(self) -> list[URLPattern]:
        in_flight = InFlightAdmin(Message, self.admin_site)
        view = self.admin_site.admin_view(in_flight.changelist_view)
        return [path("in-flight/", view, name="streaming_message_in_flight"), *super().get_urls()]


class InFlightAdmin(StorableLookups, StopPermission, admin.ModelAdmin):
    """The answers streaming now, oldest first, with Stop. Not registered: ``MessageAdmin``
    serves it at ``in-flight/`` (rows link to the message's own page)."""

    list_display = ["id", "conversation", "owner", "model", "last_seq", "updated_at", "created_at"]
    list_select_related = ["conversation__owner"]
    search_fields = ["conversation__title", "conversation__owner__username"]
    ordering = ["created_at"]
    actions = [stop_generation]

    owner = MessageAdmin.owner

    def get_queryset(self, request: HttpRequest) -> QuerySet[Message]:
        return (
            super()
            .get_queryset(request)
            .filter(role=Message.Role.ASSISTANT, status=Status.STREAMING)
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {"title": "Answers streaming now", **(extra_context or {})}
        return super().changelist_view(request, context)


def _views_messages(request: HttpRequest) -> bool:
    return request.user.has_perm("streaming.view_message")


class ConversationsGoFirst(MessagesGoWithTheirOwner):
    """Users are deleted as their conversations are, through the service: their answers
    stopped and their logs dropped first (a cascade from the user left answers generating
    into deleted rows and their logs in Redis)."""

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        services.delete_conversations(Conversation.objects.filter(owner=obj))
        super().delete_model(request, obj)  # type: ignore[misc]

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        services.delete_conversations(Conversation.objects.filter(owner__in=queryset))
        super().delete_queryset(request, queryset)  # type: ignore[misc]


def _with_storable_lookups(
    model: type[Any], model_admin: type[admin.ModelAdmin[Any]], *mixins: type
) -> None:
    """Django's and DRF's own lists (users, groups, tokens) refuse a lookup text cannot
    hold as this app's do (``?username=%00`` was a 500): registered again with
    ``StorableLookups`` (and ``mixins``) in front of their admin class, which is
    otherwise unchanged."""
    admin.site.unregister(model)
    bases = (StorableLookups, *mixins, model_admin)
    admin.site.register(model, type(model_admin.__name__, bases, {}))


_with_storable_lookups(User, UserAdmin, ConversationsGoFirst)
_with_storable_lookups(Group, GroupAdmin)
_with_storable_lookups(TokenProxy, TokenAdmin)
