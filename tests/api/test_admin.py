"""The Django admin with Django's test client: conversation and message lists with their
filters, change pages with termination records and segments, and the in-flight list whose
Stop action ends a generation running in another process (a real Daphne)."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from streaming.admin import MAX_SEARCH_WORDS
from streaming.models import Conversation, Message, Segment
from tests.api.calls import client, new_conversation, started

REDIS_URL = os.environ.get("REDIS_URL", "")
# The message inline's management form: no rows added or changed.
NO_MESSAGES = {
    "messages-TOTAL_FORMS": "0",
    "messages-INITIAL_FORMS": "0",
    "messages-MIN_NUM_FORMS": "0",
    "messages-MAX_NUM_FORMS": "0",
}


def _conversation(owner, title: str, status: str, text: str) -> Conversation:
    conversation = Conversation.objects.create(owner=owner, title=title)
    Message.objects.create(conversation=conversation, role="user", content=f"question {title}")
    answer = Message.objects.create(
        conversation=conversation,
        role="assistant",
        content=text,
        status=status,
        termination={"status": status, "finish_reason": "length", "completion_tokens": 7},
        last_seq=9,
    )
    Segment.objects.create(
        message=answer,
        index=0,
        status=status,
        first_seq=1,
        end_offset=len(text),
        finish_reason="length",
        completion_tokens=7,
        ttft_ms=12.5,
        worker="host:1:2",
    )
    return conversation


@pytest.fixture
def staff(make_account) -> Client:
    browser = Client()
    browser.force_login(make_account("root", staff=True).user)
    return browser


def test_conversation_changelist_filters_and_search(staff, account, other_account):
    _conversation(account.user, "about cats", "complete", "Cats purr.")
    _conversation(account.user, "about dogs", "truncated", "Dogs bark and")
    _conversation(other_account.user, "about birds", "error", "Birds si")

    page = staff.get("/admin/streaming/conversation/")
    assert page.status_code == 200
    text = page.content.decode()
    for title in ("about cats", "about dogs", "about birds"):
        assert title in text
    assert "last answer status" in text  # the status filter is offered

    truncated = staff.get("/admin/streaming/conversation/?last_status=truncated").content.decode()
    assert "about dogs" in truncated
    assert "about cats" not in truncated and "about birds" not in truncated

    found = staff.get("/admin/streaming/conversation/?q=purr").content.decode()
    assert "about cats" in found and "about dogs" not in found
    by_owner = staff.get(f"/admin/streaming/conversation/?q={other_account.username}")
    assert "about birds" in by_owner.content.decode()
    assert "about cats" not in by_owner.content.decode()

    today = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    dated = staff.get(
        "/admin/streaming/conversation/",
        {"updated_at__gte": str(today), "updated_at__lt": str(today + timedelta(days=1))},
    )
    assert dated.status_code == 200
    assert "about cats" in dated.content.decode()

    errors = staff.get("/admin/streaming/message/?status__exact=error").content.decode()
    assert "Birds si" not in errors  # content is not a list column
    assert errors.count("field-status") == 1
    assert staff.get("/admin/streaming/message/?status__exact=complete").status_code == 200


def test_change_pages_show_the_record_and_segments_as_text(staff, account):
    conversation = _conversation(
        account.user, "markup", "truncated", "<script>alert(1)</script> and more"
    )
    page = staff.get(f"/admin/streaming/conversation/{conversation.id}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "termination record" in html.lower()
    assert "&quot;completion_tokens&quot;: 7" in html
    assert "<td>12.5</td>" in html and "<td>host:1:2</td>" in html  # the segment table

    answer = conversation.messages.get(role="assistant")
    detail = staff.get(f"/admin/streaming/message/{answer.id}/change/")
    assert detail.status_code == 200
    html = detail.content.decode()
    assert "Segments" in html
    assert "host:1:2" in html and "12.5" in html
    assert "<script>alert(1)</script>" not in html
    # Records are read-only: no save button for messages.
    assert 'name="_save"' not in html


def test_a_rename_in_the_admin_is_the_owners_title_and_its_limits_are_the_apis(staff, account):
    conversation = _conversation(account.user, "about cats", "complete", "Cats purr.")
    conversation.title_source = Conversation.TitleSource.QUESTION
    conversation.save()
    url = f"/admin/streaming/conversation/{conversation.id}/change/"
    too_long = "x" * (settings.MAX_MESSAGE_CHARS + 1)
    refused = staff.post(url, {"title": "renamed", "system_prompt": too_long, **NO_MESSAGES})
    assert refused.status_code == 200  # the form again, with the error
    assert f"at most {settings.MAX_MESSAGE_CHARS} characters" in refused.content.decode()
    conversation.refresh_from_db()
    assert (conversation.title, conversation.system_prompt) == ("about cats", "")

    saved = staff.post(url, {"title": "renamed", "system_prompt": "Be brief.", **NO_MESSAGES})
    assert saved.status_code == 302, saved.content.decode()[:2000]
    conversation.refresh_from_db()
    # A model's title never replaces a title someone set, an operator's included.
    assert (conversation.title, conversation.title_source) == ("renamed", "user")
    assert conversation.system_prompt == "Be brief."


def test_a_lookup_text_cannot_hold_is_a_bad_lookup_not_a_500(staff, account):
    _conversation(account.user, "about cats", "complete", "Cats purr.")
    for url in (
        "/admin/streaming/message/?status__exact=%00",
        "/admin/streaming/conversation/?q=%00",
        "/admin/streaming/message/in-flight/?conversation__title=%00",
        "/admin/auth/user/?username=%00",
        "/admin/auth/user/?q=%00",
        "/admin/auth/group/?q=%00",
        "/admin/authtoken/tokenproxy/?q=%00",
    ):
        page = staff.get(url)
        assert page.status_code == 302, url
        assert page["Location"].endswith("?e=1"), url
        assert staff.get(page["Location"]).status_code == 200


def test_a_search_of_too_many_words_is_refused_with_a_message(staff, account):
    """Django filters by every word of a search: thousands of them took tens of seconds.
    Past ``MAX_SEARCH_WORDS`` the list is empty and says why; words are counted as Django
    splits them, so a quoted phrase is one."""
    _conversation(account.user, "about cats", "complete", "Cats purr.")
    _conversation(account.user, "in flight", "streaming", "Cats purr and")  # a row for each list
    refused = f"Search takes at most {MAX_SEARCH_WORDS} words (a quoted phrase is one); "
    too_many = " ".join(["purr"] * (MAX_SEARCH_WORDS + 1))
    for url in (
        "/admin/streaming/conversation/",
        "/admin/streaming/message/",
        "/admin/streaming/message/in-flight/",
        "/admin/auth/user/",
    ):
        page = staff.get(url, {"q": too_many})
        assert page.status_code == 200, url
        text = page.content.decode()
        assert f"{refused}this one has {MAX_SEARCH_WORDS + 1}." in text, url
        assert "0 results" in text, url

    conversations = "/admin/streaming/conversation/"
    page = staff.get(conversations, {"q": too_many, "_facets": "1"}).content.decode()
    assert "about cats" not in page
    assert page.count(refused) == 1, "told once, though each facet's count searches again"
    # As many words as a search takes, each a quoted phrase of two, still find it.
    phrases = " ".join(['"cats purr"'] * MAX_SEARCH_WORDS)
    found = staff.get(conversations, {"q": phrases}).content.decode()
    assert "about cats" in found and refused not in found
    assert "about cats" in staff.get(conversations, {"q": "cats purr"}).content.decode()


def test_a_conversation_is_shown_as_a_tree_with_its_branch_marked(staff, account):
    conversation = Conversation.objects.create(owner=account.user, title="branches")
    question = Message.objects.create(conversation=conversation, role="user", content="Why?")
    old = Message.objects.create(
        conversation=conversation, parent=question, role="assistant", content="<b>Old</b>",
        status="complete",
    )  # fmt: skip
    new = Message.objects.create(
        conversation=conversation, parent=question, role="assistant", content="New answer",
        status="truncated",
    )  # fmt: skip
    follow = Message.objects.create(
        conversation=conversation, parent=new, role="user", content="And then?"
    )
    conversation.current_leaf = follow
    conversation.save()

    html = staff.get(f"/admin/streaming/conversation/{conversation.id}/change/").content.decode()
    tree = html[html.index('class="message-tree"') :]
    tree = tree[: tree.index("</table>")]
    rows = tree.split("<tr>")[1:]
    assert [r.count("▶") for r in rows] == [1, 0, 1, 1], "question, old, new, follow-up"
    assert "&lt;b&gt;Old&lt;/b&gt;" in rows[1] and "<b>Old</b>" not in tree
    assert "padding-left:1.5em" in rows[2] and "padding-left:3.0em" in rows[3]
    assert f"/admin/streaming/message/{old.id}/change/" in rows[1]
    assert f"/admin/streaming/message/{new.id}/change/" in rows[2]
    assert "truncated" in rows[2]


def test_the_admin_is_for_staff_only(account, other_account):
    browser = Client()
    browser.force_login(account.user)
    for url in (
        "/admin/streaming/conversation/",
        "/admin/streaming/message/",
        "/admin/streaming/message/in-flight/",
    ):
        response = browser.get(url)
        assert response.status_code == 302
        assert "/admin/login/" in response["Location"]


def test_messages_text_is_for_those_who_may_view_messages(account, make_account):
    """Staff allowed to view conversations but not messages see neither the messages'
    excerpts in the tree nor find conversations by their text (the list of messages and
    the inline of them were already closed to them)."""
    from django.contrib.auth.models import Permission

    conversation = _conversation(account.user, "private", "complete", "hunter2 answer")
    viewer = make_account("viewer", staff=True).user
    viewer.is_superuser = False
    viewer.save()
    viewer.user_permissions.add(Permission.objects.get(codename="view_conversation"))
    browser = Client()
    browser.force_login(viewer)
    change = f"/admin/streaming/conversation/{conversation.pk}/change/"
    page = browser.get(change)
    assert page.status_code == 200
    assert b"question private" not in page.content and b"hunter2" not in page.content
    assert b"private" in page.content, "the conversation itself is shown"
    found = browser.get("/admin/streaming/conversation/?q=hunter2")
    assert b"0 results" in found.content and change.encode() not in found.content
    viewer.user_permissions.add(Permission.objects.get(codename="view_message"))
    browser.force_login(viewer)
    assert b"question private" in browser.get(change).content
    found = browser.get("/admin/streaming/conversation/?q=hunter2")
    assert change.encode() in found.content


def test_a_conversation_and_a_user_with_messages_can_be_deleted(staff, account, make_account):
    """Messages go with their conversation and conversations with their owner: a delete
    asks for the conversation's (or user's) permission, not the message's, which no one
    has. Both were refused, even to a superuser."""
    from django.contrib.auth.models import User

    conversation = _conversation(account.user, "to delete", "complete", "text")
    url = f"/admin/streaming/conversation/{conversation.pk}/delete/"
    assert b"Cannot delete" not in staff.get(url).content
    assert staff.post(url, {"post": "yes"}).status_code == 302
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    owner = make_account("leaving").user
    _conversation(owner, "theirs", "complete", "text")
    url = f"/admin/auth/user/{owner.pk}/delete/"
    assert b"Cannot delete" not in staff.get(url).content
    assert staff.post(url, {"post": "yes"}).status_code == 302
    assert not User.objects.filter(pk=owner.pk).exists()
    assert not Conversation.objects.filter(owner_id=owner.pk).exists()
    assert Message.objects.filter(conversation__owner=account.user).count() == 0


@pytest.mark.redis
@pytest.mark.skipif(not REDIS_URL, reason="the Stop crosses processes over the Redis layer")
def test_stop_action_cancels_a_generation_running_in_another_process(daphne, account, staff):
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api, title="long one")
        running = started(api, conversation, "go", ttft_ms=0, tokens_per_second=5, length=500)
        other = new_conversation(api, title="short one")
        done = started(api, other, "short", text="ok", ttft_ms=0, tokens_per_second=1000)

        in_flight = staff.get("/admin/streaming/message/in-flight/")
        assert in_flight.status_code == 200
        html = in_flight.content.decode()
        assert running["id"] in html
        assert "Stop generation" in html

        response = staff.post(
            "/admin/streaming/message/in-flight/",
            {"action": "stop_generation", "_selected_action": [running["id"]]},
            follow=True,
        )
        assert response.status_code == 200
        assert "Stopped 1 generation(s)." in response.content.decode()
        assert running["id"] not in response.content.decode()

        stopped = api.get(f"/api/messages/{running['id']}/").json()
        assert stopped["status"] == "cancelled"
        assert stopped["termination"]["status"] == "cancelled"
        assert "worker" not in stopped["termination"]
        assert "worker" not in stopped["segments"][0]
        stopped_segment = Segment.objects.get(message_id=running["id"], index=0)
        assert f":{server.proc.pid}:" in stopped_segment.worker  # the staff-only record
        assert api.get(f"/api/messages/{done['id']}/").json()["status"] != "cancelled"
