"""What people expect around the answers: the empty state, the action bar, the sidebar
(groups, search, streaming marker, tab title), waiting and stall states, the theme switch,
keyboard shortcuts; with screenshots of the main states at desktop and phone width."""

from __future__ import annotations

from datetime import timedelta

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.e2e

PHONE = {"width": 390, "height": 844}
ANSWER = "A **short** answer:\n\n- one\n- two\n\n`done`"


@pytest.fixture
def older_conversations(account):
    """Two conversations of ``account``: one active yesterday, one ten days ago."""
    from django.utils import timezone

    from streaming.models import Conversation

    now = timezone.now()
    for title, age in (("from yesterday", timedelta(days=1)), ("long ago", timedelta(days=10))):
        conversation = Conversation.objects.create(owner=account.user, title=title)
        Conversation.objects.filter(pk=conversation.pk).update(updated_at=now - age)


def test_the_page_runs_only_its_own_scripts(open_chat):
    """A second wall behind the sanitiser: the page's policy lets only its own scripts
    run (its inline ones carry a nonce of each load), so markup that got past it could
    not run a script of its own."""
    chat = open_chat()
    page = chat.page
    nonces = set()
    for _ in range(2):
        response = page.reload()
        assert response is not None
        policy = response.headers["content-security-policy"]
        assert "script-src 'self' 'nonce-" in policy and "connect-src 'self'" in policy
        nonces.add(policy.split("'nonce-")[1].split("'")[0])
        chat.wait_ready()
    assert len(nonces) == 2, "a nonce is each load's own"
    assert chat.errors == [], "the page's own scripts, styles and streams all pass"
    page.evaluate(
        """() => { const s = document.createElement("script");
                   s.textContent = "window.pwned = 1"; document.head.append(s); }"""
    )
    assert page.evaluate("window.pwned") is None
    expect(page.locator("html")).to_have_attribute("data-ready", "true")
    assert any("Content Security Policy" in error for error in chat.errors), chat.errors
    chat.errors.clear()


def test_the_empty_state_names_the_simulator_and_starts_from_an_example(open_chat):
    chat = open_chat()
    page = chat.page
    empty = page.get_by_role("region", name="New conversation")
    expect(empty.get_by_role("heading")).to_have_text("Chat with simulated")
    expect(empty).to_contain_text("Simulated engine: answers are generated text, not a model.")
    expect(page).to_have_title("New conversation - Chat")
    chat.screenshot("empty-state")
    empty.get_by_role("button", name="Compare SSE and WebSocket in a table").click()
    expect(page.locator("article.user .bubble")).to_have_text(
        "Compare SSE and WebSocket in a table"
    )
    expect(empty).to_have_count(0)
    expect(page).to_have_title("Compare SSE and WebSocket in a table - Chat")


def test_the_empty_state_names_a_real_model_and_hides_the_developer_tools(
    daphne, emulator, open_chat
):
    chat = open_chat(daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model"))
    page = chat.page
    empty = page.get_by_role("region", name="New conversation")
    expect(empty.get_by_role("heading")).to_have_text("Chat with test-model")
    expect(empty).not_to_contain_text("Simulated engine")
    page.locator("#settings summary").click()
    expect(page.get_by_label("Developer")).to_be_hidden()
    expect(page.get_by_label("Max tokens")).to_be_visible()


def test_the_action_bar_copies_the_answer_as_markdown_and_shows_its_time(open_chat):
    chat = open_chat()
    chat.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page = chat.page
    answer = chat.ask("copy me", text=ANSWER, tokens_per_second=400)
    expect(answer).to_have_attribute("data-status", "complete")
    bar = answer.get_by_role("toolbar", name="Answer actions")
    time = bar.locator("time")
    server = chat.server_message(answer)
    assert time.get_attribute("datetime") == server["created_at"]
    page.mouse.move(0, 0)
    assert time.evaluate("n => getComputedStyle(n).opacity") == "0"
    answer.hover()
    expect(time).to_have_css("opacity", "1")
    bar.get_by_role("button", name="Copy the answer as Markdown").click()
    expect(bar.get_by_role("button", name="Copy the answer as Markdown")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == ANSWER == server["content"]
    # The places where Regenerate (answers) and Edit (your messages) go.
    expect(bar.locator('[data-slot="regenerate"]')).to_have_count(1)
    user_bar = page.locator("article.user").get_by_role("toolbar", name="Message actions")
    expect(user_bar.locator('[data-slot="edit"]')).to_have_count(1)
    chat.screenshot("action-bar")


def test_copy_pressed_twice_comes_back_to_copy(open_chat):
    """A second press while a button says "Copied" says it again, then both Copy buttons
    (the answer's and a code block's) read "Copy" again, as after one press."""
    chat = open_chat()
    chat.context.grant_permissions(["clipboard-read", "clipboard-write"])
    answer = chat.ask(
        "copy twice", text="Some code:\n\n```python\nx = 1\n```\n", tokens_per_second=400
    )
    expect(answer).to_have_attribute("data-status", "complete")
    answer.hover()
    copy_answer = answer.get_by_role("toolbar", name="Answer actions").locator(".copy-message")
    copy_code = answer.locator(".code-block .copy")
    for button in (copy_answer, copy_code):
        button.click()
        expect(button).to_have_text("Copied")
        button.click()
        expect(button).to_have_text("Copied")
    for button in (copy_answer, copy_code):
        expect(button).to_have_text("Copy")
    assert chat.page.evaluate("navigator.clipboard.readText()") == "x = 1"


def test_simulation_settings_are_for_the_next_message_only(open_chat):
    chat = open_chat()
    first = chat.ask("scripted", text="Scripted.", tokens_per_second=400)
    expect(first).to_have_attribute("data-status", "complete")
    expect(chat.page.get_by_label("Simulation (JSON, for the next message only)")).to_have_value("")
    box = chat.page.get_by_label("Message", exact=True)
    box.fill("not scripted")
    box.press("Enter")
    second = chat.page.locator("article.assistant").nth(1)
    expect(second).to_have_attribute("data-status", "complete")
    assert chat.server_message(first)["params"]["simulation"]["text"] == "Scripted."
    assert "simulation" not in chat.server_message(second)["params"]
    assert chat.content(second).inner_text() != "Scripted."


def test_the_sidebar_groups_searches_and_marks_streaming_answers(
    daphne, older_conversations, open_chat
):
    chat = open_chat(timezone_id="UTC")
    page = chat.page
    groups = page.locator("#conversation-list .group")
    expect(groups).to_have_text(["Yesterday", "Earlier"])

    running = chat.ask("still talking", length=2000, tokens_per_second=20, ttft_ms=0)
    expect(groups).to_have_text(["Today", "Yesterday", "Earlier"])
    entry = page.locator("#conversation-list .conversation").first
    expect(entry.locator(".open")).to_have_text("still talking (streaming)")
    expect(entry.locator(".live")).to_be_visible()
    expect(page).to_have_title("still talking - Chat")
    chat.screenshot("sidebar-streaming")

    search = page.get_by_label("Search conversations")
    search.fill("long")
    expect(page.locator("#conversation-list .open")).to_have_text(["long ago"])
    search.fill("")
    expect(page.locator("#conversation-list .open")).to_have_count(3)

    page.get_by_role("button", name="Stop").click()
    expect(running).to_have_attribute("data-status", "cancelled")
    expect(entry.locator(".live")).to_have_count(0)
    page.locator("#conversation-list .open", has_text="long ago").click()
    expect(page).to_have_title("long ago - Chat")


def test_waiting_for_the_first_token_and_a_stall_are_shown_counting(open_chat, daphne):
    chat = open_chat(daphne(STREAM_STALL_TIMEOUT="60"))
    state_of = lambda answer: answer.locator(".stream-state")  # noqa: E731
    slow = chat.ask("slow start", text="Finally.", ttft_ms=2500, tokens_per_second=200)
    expect(state_of(slow)).to_contain_text("Waiting for the first token…")
    chat.screenshot("waiting-first-token")
    expect(chat.content(slow)).to_have_text("Finally.")
    expect(state_of(slow)).to_be_hidden()

    quiet = chat.ask("stall", text="One two three four five", stall_after_tokens=2)
    expect(state_of(quiet)).to_contain_text("No tokens for 3 s…", timeout=10_000)
    expect(state_of(quiet)).to_contain_text("No tokens for 4 s…", timeout=10_000)
    chat.screenshot("stall-counting")
    chat.page.get_by_role("button", name="Stop").click()
    expect(quiet).to_have_attribute("data-status", "cancelled")


def test_the_theme_switch_overrides_the_system_and_is_remembered(open_chat):
    chat = open_chat(color_scheme="light")
    page = chat.page
    theme = page.locator("#theme")
    background = "() => getComputedStyle(document.body).backgroundColor"
    light = page.evaluate(background)
    expect(theme).to_have_attribute("aria-label", "Theme: as the system")
    theme.click()
    expect(theme).to_have_attribute("aria-label", "Theme: light")
    theme.click()
    expect(theme).to_have_attribute("aria-label", "Theme: dark")
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    assert page.evaluate(background) != light
    assert page.locator("#code-dark").get_attribute("media") == "all"
    assert page.locator("#code-light").get_attribute("media") == "not all"
    chat.ask(
        "in the dark", text=ANSWER + "\n\n```python\nprint('dark')\n```", tokens_per_second=400
    )
    expect(page.locator("article.assistant")).to_have_attribute("data-status", "complete")
    chat.screenshot("dark-theme")
    page.reload()
    chat.wait_ready()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    theme.click()
    expect(theme).to_have_attribute("aria-label", "Theme: as the system")
    assert page.evaluate(background) == light


def test_keyboard_shortcuts_and_their_help(open_chat):
    chat = open_chat()
    page = chat.page
    page.keyboard.press("Control+/")
    shortcuts = page.get_by_role("dialog", name="Keyboard shortcuts")
    expect(shortcuts).to_be_visible()
    expect(shortcuts).to_contain_text("New conversation")
    chat.screenshot("shortcuts")
    page.keyboard.press("Escape")
    expect(shortcuts).to_be_hidden()

    answer = chat.ask("count", length=2000, tokens_per_second=20, ttft_ms=0)
    expect(chat.content(answer)).not_to_be_empty()
    # Esc in another field is that field's: cancelling an edit, leaving the search box.
    question = page.locator("article.message.user").last
    question.get_by_role("button", name="Edit this message").click()
    page.get_by_label("Edit your message").press("Escape")
    expect(page.get_by_label("Edit your message")).to_have_count(0)
    page.get_by_label("Search conversations").press("Escape")
    # A Stop shows at once ("Stopping…"), before the server's answer: none was asked for.
    expect(answer.locator(".stream-state")).not_to_contain_text("Stop")
    expect(answer).to_have_attribute("data-status", "streaming")
    page.get_by_label("Message", exact=True).fill("draft")
    page.get_by_label("Message", exact=True).press("Escape")  # the message box's Esc stops
    expect(answer).to_have_attribute("data-status", "cancelled")
    assert page.get_by_label("Message", exact=True).input_value() == "draft"

    answer = chat.ask("count again", length=2000, tokens_per_second=20, ttft_ms=0)
    expect(chat.content(answer)).not_to_be_empty()
    page.locator("#conversation-title").click()  # focus away from any field
    page.keyboard.press("Escape")
    expect(answer).to_have_attribute("data-status", "cancelled")

    page.keyboard.press("Control+Shift+O")
    expect(page.get_by_role("region", name="New conversation")).to_be_visible()
    assert "#/c/" not in page.url
    page.locator("#conversation-title").click()
    page.keyboard.press("Shift+Escape")
    expect(page.get_by_label("Message", exact=True)).to_be_focused()


def test_main_states_at_phone_width(open_chat):
    chat = open_chat(viewport=PHONE, is_mobile=True, has_touch=True)
    page = chat.page
    chat.screenshot("phone-empty-state")
    answer = chat.ask(
        "on a phone", text=ANSWER + "\n\n| a | b |\n|---|---|\n| 1 | 2 |", ttft_ms=0, tap_send=True
    )
    expect(answer).to_have_attribute("data-status", "complete")
    page.locator("#settings summary").click()  # fold the settings away
    chat.screenshot("phone-answer")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the page scrolls sideways ({width}px)"
    page.get_by_role("button", name="Show conversations").click()
    page.get_by_role("button", name="Actions for on a phone").click()
    expect(page.get_by_role("menuitem", name="Delete")).to_be_visible()
    chat.screenshot("phone-conversation-menu")
