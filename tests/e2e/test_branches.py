"""Versions in the page (real Chromium, real Daphne): regenerate, step through them, edit a
question and resend, the branch kept across a reload, and a second tab in step."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from playwright.sync_api import expect

from tests.e2e.chatpage import ChatPage, paragraphs

pytestmark = pytest.mark.e2e

QUICK = {"length": 8, "ttft_ms": 0, "tokens_per_second": 200}


def finished(bubble) -> None:
    expect(bubble).not_to_have_attribute("data-status", "streaming")


def edit_last_question(page, text: str):
    """Edit the last question to ``text`` and send it; the new question's bubble."""
    page.locator("article.message.user").last.get_by_role(
        "button", name="Edit this message"
    ).click()
    page.get_by_label("Edit your message").fill(text)
    page.get_by_role("button", name="Save and Send").click()
    return page.locator("article.message.user").last


def test_regenerate_step_through_versions_edit_and_reload(open_chat) -> None:
    chat = open_chat()
    page = chat.page
    first = chat.ask("Tell me about rivers", **QUICK)
    finished(first)
    answers = page.locator("article.message.assistant")
    ids = [first.get_attribute("data-message-id")]
    for version in (2, 3):
        answers.last.get_by_role("button", name="Regenerate this answer").click()
        counter = answers.last.locator(".version-count")
        expect(counter).to_have_text(f"{version} / {version}")
        finished(answers.last)
        ids.append(answers.last.get_attribute("data-message-id"))
    assert len(set(ids)) == 3 and answers.count() == 1, "one answer shown, three versions"

    answers.last.get_by_role("button", name="Previous version").click()
    expect(answers.last.locator(".version-count")).to_have_text("2 / 3")
    expect(answers.last).to_have_attribute("data-message-id", ids[1])
    answers.last.get_by_role("button", name="Previous version").click()
    expect(answers.last).to_have_attribute("data-message-id", ids[0])
    expect(answers.last.get_by_role("button", name="Previous version")).to_be_disabled()

    question = edit_last_question(page, "Tell me about lakes")
    expect(question.locator(".version-count")).to_have_text("2 / 2")
    expect(question.locator(".bubble")).to_have_text("Tell me about lakes")
    finished(answers.last)
    edited_answer = answers.last.get_attribute("data-message-id")
    assert edited_answer not in ids
    chat.screenshot("branches-edited")

    page.reload()
    chat.wait_ready()
    expect(page.locator("article.message.user").last.locator(".bubble")).to_have_text(
        "Tell me about lakes"
    )
    expect(page.locator("article.message.assistant").last).to_have_attribute(
        "data-message-id", edited_answer
    )
    page.locator("article.message.user").last.get_by_role("button", name="Previous version").click()
    expect(page.locator("article.message.user").last.locator(".bubble")).to_have_text(
        "Tell me about rivers"
    )
    # The branch through the old question goes down its latest answer.
    expect(page.locator("article.message.assistant").last).to_have_attribute(
        "data-message-id", ids[2]
    )
    assert chat.errors == []


def test_a_second_tab_shows_what_the_first_sent_and_follows_its_answer(open_chat) -> None:
    chat = open_chat()
    first = chat.ask("Hello from the first tab", **QUICK)
    finished(first)
    match = re.search(r"#/c/([0-9a-f-]+)", chat.page.url)
    assert match, chat.page.url
    other = ChatPage(chat.context, chat.base_url, chat.api_url, chat.token)
    other.page.goto(f"{chat.base_url}/#/c/{match.group(1)}")
    other.wait_ready()
    expect(other.page.locator("article.message.assistant")).to_have_count(1)

    slow = {"length": 40, "ttft_ms": 0, "tokens_per_second": 20}
    sent = chat.ask("And a second question", **slow)
    seen = other.page.locator("article.message.assistant").last
    expect(other.page.locator("article.message.user").last.locator(".bubble")).to_have_text(
        "And a second question"
    )
    expect(seen).to_have_attribute("data-message-id", sent.get_attribute("data-message-id") or "")
    expect(seen).to_have_attribute("data-status", "streaming")  # followed live, not reloaded
    finished(seen)
    finished(sent)
    expect(chat.content(seen)).to_have_text(chat.content(sent).inner_text())
    assert chat.wait_for_server_status(sent, "complete")["content"]
    assert other.errors == []


def test_a_double_click_on_regenerate_makes_one_version(open_chat) -> None:
    chat = open_chat()
    page = chat.page
    first = chat.ask("Tell me about rivers", **QUICK)
    finished(first)
    chat.simulate(length=40, ttft_ms=0, tokens_per_second=100)
    first.get_by_role("button", name="Regenerate this answer").dblclick()
    answers = page.locator("article.message.assistant")
    finished(answers.last)
    expect(answers.last.locator(".version-count")).to_have_text("2 / 2")
    conversation = re.search(r"#/c/([0-9a-f-]+)", page.url)
    assert conversation, page.url
    tree = chat.api_get(f"/api/conversations/{conversation.group(1)}/messages/?tree=true")
    assert [m["role"] for m in tree["results"]] == ["user", "assistant", "assistant"]
    assert chat.errors == []


def test_a_message_goes_after_the_answer_shown_here(open_chat) -> None:
    """Another tab switched the conversation's branch and this one has not heard yet (its
    feed event on the way): a message sent here goes after the answer shown here."""
    from streaming.models import Conversation

    chat = open_chat()
    page = chat.page
    first = chat.ask("Tell me about rivers", **QUICK)
    finished(first)
    second = chat.ask("And about lakes", **QUICK)
    finished(second)
    shown = second.get_attribute("data-message-id")
    conversation = re.search(r"#/c/([0-9a-f-]+)", page.url)
    assert conversation, page.url
    # The switch as stored, with no feed event: this tab still shows the second answer.
    # (In a thread: Playwright's loop runs in this one, where Django refuses queries.)
    switch = Conversation.objects.filter(pk=conversation.group(1)).update
    with ThreadPoolExecutor(1) as thread:
        thread.submit(switch, current_leaf_id=first.get_attribute("data-message-id")).result()
    third = chat.ask("And about the sea", **QUICK)
    finished(third)
    question = page.locator("article.message.user").last
    stored = chat.message(question.get_attribute("data-message-id") or "")
    assert stored["parent_id"] == shown
    expect(page.locator("article.message.assistant")).to_have_count(3)
    assert chat.errors == []


def test_simulation_settings_sent_with_an_edit_are_for_it_only(open_chat) -> None:
    """The simulation settings script the next message only, an edited question too: once
    the edit is sent they are cleared, and the message after is not scripted by them."""
    chat = open_chat()
    page = chat.page
    finished(chat.ask("Tell me about rivers", **QUICK))
    chat.simulate(text="Edited and scripted.", ttft_ms=0, tokens_per_second=400)
    edit_last_question(page, "Tell me about lakes")
    answers = page.locator("article.message.assistant")
    expect(chat.content(answers.last)).to_have_text("Edited and scripted.")
    expect(page.get_by_label("Simulation (JSON, for the next message only)")).to_have_value("")
    box = page.get_by_label("Message", exact=True)
    box.fill("and then")
    box.press("Enter")
    expect(answers).to_have_count(2)
    finished(answers.last)
    assert "simulation" not in chat.server_message(answers.last)["params"]
    assert chat.errors == []


def test_regenerate_and_edit_while_an_answer_streams_stop_it_and_go_on(open_chat) -> None:
    chat = open_chat()
    page = chat.page
    notice = page.locator("#notice")
    # Silent after three tokens: the answer is still streaming when Regenerate is pressed
    # (and so is its new version, which has the same settings).
    first = chat.ask("Tell me about rivers", text="Rivers run to the sea.", stall_after_tokens=3)
    expect(first).to_have_attribute("data-status", "streaming")
    expect(chat.content(first)).to_contain_text("Rivers run")
    first_id = first.get_attribute("data-message-id") or ""
    bar = first.get_by_role("toolbar", name="Answer actions")
    # Copy waits for the end of the answer and leaves no gap: Regenerate comes first.
    expect(bar.get_by_role("button", name="Copy the answer as Markdown")).to_be_hidden()
    regenerate = bar.get_by_role("button", name="Regenerate this answer")
    left = "n => n.getBoundingClientRect().left"
    assert regenerate.evaluate(left) == bar.evaluate(left)

    regenerate.click()
    answer = page.locator("article.message.assistant").last
    expect(answer.locator(".version-count")).to_have_text("2 / 2")
    expect(answer).to_have_attribute("data-status", "streaming")
    expect(chat.content(answer)).to_contain_text("Rivers run")
    # Its time to first token is measured as a sent message's is.
    expect(page.locator("#ttft")).to_contain_text("First token")
    chat.wait_for_server_status(first_id, "cancelled")
    expect(notice).to_be_hidden()

    second_id = answer.get_attribute("data-message-id") or ""
    chat.simulate(text="Lakes are still.", tokens_per_second=200)
    question = page.locator("article.message.user").last
    question.get_by_role("button", name="Edit this message").click()
    page.get_by_label("Edit your message").fill("Tell me about lakes")
    page.get_by_role("button", name="Save and Send").click()
    expect(question.locator(".version-count")).to_have_text("2 / 2")
    expect(chat.content(answer)).to_have_text("Lakes are still.")
    finished(answer)
    chat.wait_for_server_status(second_id, "cancelled")
    expect(notice).to_be_hidden()
    expect(page.get_by_role("button", name="Stop")).to_be_hidden()
    assert chat.errors == []


def test_stepping_to_another_version_keeps_it_where_it_was(open_chat) -> None:
    chat = open_chat(viewport={"width": 1000, "height": 600})
    page = chat.page
    long = {"max_tokens": 4000, "text": paragraphs(12), "tokens_per_second": 400, "ttft_ms": 0}
    first = chat.ask("Tell me about rivers", **long)
    finished(first)
    finished(chat.ask("And about lakes", **long))
    # A new version of the first answer ends the branch there; stepping back to the old
    # one brings back what followed it, a long way below.
    first.get_by_role("button", name="Regenerate this answer").click()
    answers = page.locator("article.message.assistant")
    expect(answers).to_have_count(1)
    expect(answers.first.locator(".version-count")).to_have_text("2 / 2")
    finished(answers.first)
    answers.first.get_by_role("button", name="Previous version").click()
    expect(answers).to_have_count(2)
    expect(answers.first.locator(".version-count")).to_have_text("1 / 2")
    # The version stepped to is where the one before it was: the button just pressed is
    # still in view, not scrolled away to the end of the conversation.
    expect(answers.first.get_by_role("button", name="Next version")).to_be_in_viewport()
    assert chat.errors == []


def test_stepping_back_to_a_version_shows_the_branch_last_shown_under_it(open_chat) -> None:
    """The answer version looked at under a question is kept when the question's versions
    are stepped through: back to version 1, its answer 1 / 2 again, not its newest."""
    chat = open_chat()
    page = chat.page
    answer = chat.ask("Tell me about rivers", **QUICK)
    finished(answer)
    answers = page.locator("article.message.assistant")
    answers.last.get_by_role("button", name="Regenerate this answer").click()
    expect(answers.last.locator(".version-count")).to_have_text("2 / 2")
    finished(answers.last)
    answers.last.get_by_role("button", name="Previous version").click()
    expect(answers.last.locator(".version-count")).to_have_text("1 / 2")
    first_answer = answers.last.get_attribute("data-message-id")

    chat.simulate(**QUICK)
    question = edit_last_question(page, "Tell me about lakes")
    expect(question.locator(".version-count")).to_have_text("2 / 2")
    finished(answers.last)
    question.get_by_role("button", name="Previous version").click()
    expect(question.locator(".version-count")).to_have_text("1 / 2")
    expect(answers.last.locator(".version-count")).to_have_text("1 / 2")
    assert answers.last.get_attribute("data-message-id") == first_answer
    assert chat.errors == []


def test_the_edit_box_is_as_wide_as_an_answer(open_chat) -> None:
    chat = open_chat()
    page = chat.page
    answer = chat.ask("Hi", **QUICK)
    finished(answer)
    page.locator("article.message.user").get_by_role("button", name="Edit this message").click()
    box = page.get_by_label("Edit your message")
    expect(box).to_be_focused()
    width = "n => n.getBoundingClientRect().width"
    assert abs(box.evaluate(width) - answer.evaluate(width)) <= 1
    lines = box.evaluate("n => n.clientHeight / parseFloat(getComputedStyle(n).lineHeight)")
    assert lines >= 3, lines
    chat.screenshot("edit-in-place")


def test_a_regenerate_and_an_edit_whose_answers_were_lost_make_one_version_each(
    open_chat,
) -> None:
    """Each request reaches the server, which makes the version, but its answer never
    reaches the page: the page sends it again with the same key and gets that version."""
    chat = open_chat()
    page = chat.page
    first = chat.ask("Tell me about rivers", **QUICK)
    finished(first)
    keys: list[str | None] = []

    def lose_each_first_answer(route):
        keys.append(route.request.headers.get("idempotency-key"))
        if len(keys) % 2:
            route.fetch()  # made on the server; the page never hears of it
            route.abort()
        else:
            route.continue_()

    page.route(re.compile(r".*/api/messages/[^/]+/(regenerate|edit)/$"), lose_each_first_answer)
    answers = page.locator("article.message.assistant")
    answers.last.get_by_role("button", name="Regenerate this answer").click()
    expect(answers.last.locator(".version-count")).to_have_text("2 / 2")
    finished(answers.last)
    question = edit_last_question(page, "Tell me about lakes")
    expect(question.locator(".version-count")).to_have_text("2 / 2")
    finished(answers.last)
    assert len(keys) == 4 and keys[0] == keys[1] and keys[2] == keys[3], keys
    assert keys[0] != keys[2]
    expect(page.locator("#notice")).to_be_hidden()
    conversation = page.url.rsplit("/", 1)[-1]
    tree = chat.api_get(f"/api/conversations/{conversation}/messages/?tree=true")
    assert tree["count"] == 5  # the question, two answers, the edit and its answer


def test_a_conversation_deleted_in_another_tab_while_it_streams_leaves_quietly(
    open_chat,
) -> None:
    """The second tab follows an answer that the first tab deletes with its conversation:
    it leaves for a new conversation without an error banner (it said "Not found." when
    an event of the answer's end made it fetch the deleted conversation)."""
    chat = open_chat()
    slow = {"length": 400, "ttft_ms": 0, "tokens_per_second": 20}
    answer = chat.ask("A long one, please", **slow)
    expect(answer).to_have_attribute("data-status", "streaming")
    match = re.search(r"#/c/([0-9a-f-]+)", chat.page.url)
    assert match, chat.page.url
    other = ChatPage(chat.context, chat.base_url, chat.api_url, chat.token)
    other.page.goto(f"{chat.base_url}/#/c/{match.group(1)}")
    other.wait_ready()
    followed = other.page.locator("article.message.assistant")
    expect(followed).to_have_attribute("data-status", "streaming")
    page = chat.page
    page.get_by_role("button", name="Actions for A long one, please").click()
    page.get_by_role("menuitem", name="Delete").click()
    page.get_by_role("dialog", name="Delete").get_by_role("button", name="Delete").click()
    expect(other.page).not_to_have_url(re.compile(r"#/c/"))
    expect(other.page.locator("#log article")).to_have_count(0)
    expect(other.page.locator("#conversation-list .open")).to_have_count(0)
    expect(other.page.locator("#notice")).to_be_hidden()
    assert other.errors == []
