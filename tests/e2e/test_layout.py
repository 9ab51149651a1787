"""The page around the answers: conversations, the Settings popover, readiness, phone width."""

from __future__ import annotations

import signal

import httpx
import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.e2e


def test_a_refresh_of_the_list_keeps_the_entries_it_did_not_change(open_chat):
    """A conversation made in another tab arrives through the feed: the list shows it on
    top and keeps every other entry as it was, the same nodes, with keyboard focus on the
    one that had it (a list rebuilt whole would drop the focus and every reference)."""
    chat = open_chat()
    page = chat.page
    headers = {"Authorization": f"Token {chat.token}"}
    for title in ("first", "second", "third"):
        made = httpx.post(
            f"{chat.api_url}/api/conversations/", json={"title": title}, headers=headers
        )
        assert made.status_code == 201, made.text
    titles = page.locator("#conversation-list .open")
    expect(titles).to_have_text(["third", "second", "first"])
    page.evaluate(
        "() => document.querySelectorAll('#conversation-list .conversation')"
        ".forEach((li) => { li.seen = true; })"
    )
    titles.nth(1).focus()
    made = httpx.post(
        f"{chat.api_url}/api/conversations/", json={"title": "elsewhere"}, headers=headers
    )
    assert made.status_code == 201, made.text
    expect(titles).to_have_text(["elsewhere", "third", "second", "first"])
    kept = page.evaluate(
        "() => [...document.querySelectorAll('#conversation-list .conversation')]"
        ".map((li) => Boolean(li.seen))"
    )
    assert kept == [False, True, True, True]
    assert page.evaluate("() => document.activeElement.textContent") == "second"


def test_an_open_menu_survives_a_refresh_of_the_list(open_chat):
    """The list refreshing under an open conversation menu (here a rename in another tab,
    arriving through the feed) keeps the menu open, with focus where it was."""
    chat = open_chat()
    page = chat.page
    chat.ask("keep me", text="one", tokens_per_second=200)
    expect(page.locator("article.assistant").last).to_have_attribute("data-status", "complete")
    conversation = page.locator("#conversation-list .conversation").first.get_attribute("data-id")
    page.get_by_role("button", name="Actions for keep me").click()
    page.get_by_role("menuitem", name="Delete").focus()
    renamed = httpx.patch(
        f"{chat.api_url}/api/conversations/{conversation}/",
        json={"title": "renamed elsewhere"},
        headers={"Authorization": f"Token {chat.token}"},
    )
    assert renamed.status_code == 200, renamed.text
    expect(page.locator("#conversation-list .open")).to_have_text(["renamed elsewhere"])
    expect(page.get_by_role("menuitem", name="Delete")).to_be_focused()
    expect(page.get_by_role("button", name="Actions for renamed elsewhere")).to_have_attribute(
        "aria-expanded", "true"
    )


def test_the_transport_is_a_setting_kept_across_reloads_not_in_plain_view(open_chat):
    """How answers are read is a setting by the user's name, as other chat pages keep
    theirs: hidden until Settings is opened, and the choice survives a reload."""
    chat = open_chat()
    page = chat.page
    websocket = page.get_by_label("WebSocket")
    expect(websocket).to_be_hidden()
    expect(page.get_by_label("SSE")).to_be_checked()
    chat.use_transport("ws")
    page.reload()
    chat.wait_ready()
    expect(websocket).to_be_hidden()
    answer = chat.ask("slow", length=30, tokens_per_second=15)
    expect(answer).to_have_attribute("data-status", "streaming")
    page.get_by_role("button", name="Settings").click()
    expect(websocket).to_be_visible()
    expect(websocket).to_be_checked()
    # Esc closes Settings and nothing else: the answer streaming meanwhile goes on.
    page.keyboard.press("Escape")
    expect(websocket).to_be_hidden()
    expect(answer).to_have_attribute("data-status", "complete")


def test_conversations_new_rename_delete_newest_first(open_chat):
    chat = open_chat()
    page = chat.page
    chat.ask("first question", text="one", tokens_per_second=200)
    expect(page.locator("article.assistant").last).to_have_attribute("data-status", "complete")
    page.get_by_role("button", name="New conversation").click()
    expect(page.locator("#log article")).to_have_count(0)
    chat.ask("second question", text="two", tokens_per_second=200)
    expect(page.locator("article.assistant").last).to_have_attribute("data-status", "complete")

    titles = page.locator("#conversation-list .open")
    expect(titles).to_have_text(["second question", "first question"])

    page.get_by_role("button", name="Actions for first question").click()
    page.get_by_role("menuitem", name="Rename").click()
    field = page.get_by_label("Conversation title")
    expect(field).to_be_focused()
    field.fill("Renamed ✓ مرحبا")
    field.press("Enter")
    expect(titles).to_have_text(["Renamed ✓ مرحبا", "second question"])

    # Delete asks in the page (not the browser's confirm()); Cancel keeps it.
    page.get_by_role("button", name="Actions for second question").click()
    page.get_by_role("menuitem", name="Delete").click()
    confirm = page.get_by_role("dialog", name="Delete")
    expect(confirm).to_contain_text("Delete “second question” and all its messages?")
    chat.screenshot("delete-confirmation")
    confirm.get_by_role("button", name="Cancel").click()
    expect(confirm).to_have_count(0)
    expect(titles).to_have_text(["Renamed ✓ مرحبا", "second question"])
    page.get_by_role("button", name="Actions for second question").click()
    page.get_by_role("menuitem", name="Delete").click()
    page.get_by_role("dialog", name="Delete").get_by_role("button", name="Delete").click()
    expect(titles).to_have_text(["Renamed ✓ مرحبا"])
    assert chat.dialogs == []
    listed = httpx.get(
        f"{chat.api_url}/api/conversations/",
        headers={"Authorization": f"Token {chat.token}"},
    ).json()["results"]
    assert [c["title"] for c in listed] == ["Renamed ✓ مرحبا"]

    titles.first.click()
    expect(chat.content(page.locator("article.assistant"))).to_have_text("one")


def test_the_list_loads_a_page_at_a_time_and_a_send_refetches_one_entry(daphne, open_chat, account):
    server = daphne()
    with httpx.Client(base_url=server.url, timeout=30) as api:
        headers = {"Authorization": f"Token {account.token}"}
        for i in range(60):
            created = api.post("/api/conversations/", json={"title": f"old {i}"}, headers=headers)
            assert created.status_code == 201
    chat = open_chat(server)
    page = chat.page
    titles = page.locator("#conversation-list .open")
    expect(titles).to_have_count(50)
    lists: list[str] = []
    page.on(
        "request",
        lambda r: "/api/conversations/" in r.url and r.method == "GET" and lists.append(r.url),
    )
    answer = chat.ask("newest", text="ok", tokens_per_second=200)
    expect(answer).to_have_attribute("data-status", "complete")
    expect(titles.first).to_have_text("newest")
    conversation = answer.evaluate("n => location.hash.slice(4)")
    # That one entry (after the send, and after the answer ended), never the list.
    one = f"{server.url}/api/conversations/{conversation}/"
    assert lists and set(lists) == {one}, lists

    lists.clear()
    titles.last.scroll_into_view_if_needed()
    expect(titles).to_have_count(61)
    expect(titles.last).to_have_text("old 0")
    assert lists == [f"{server.url}/api/conversations/?page=2"], lists


def test_composer_is_disabled_with_the_reason_while_the_engine_is_down(open_chat, daphne):
    # Port 9 (discard) is closed here: the engine never answers its health check.
    chat = open_chat(daphne(ENGINE_URL="http://127.0.0.1:9", ENGINE_MODEL="m"))
    page = chat.page
    expect(page.locator("#composer-reason")).to_contain_text("the model engine is unreachable")
    expect(page.get_by_role("button", name="Send")).to_be_disabled()
    box = page.get_by_label("Message", exact=True)
    box.fill("hello")
    box.press("Enter")
    expect(page.locator("#log article")).to_have_count(0)
    expect(page.locator(".simulation-only")).to_be_hidden()


def test_phone_width(open_chat):
    chat = open_chat(viewport={"width": 390, "height": 844})
    page = chat.page
    sidebar = page.locator("#sidebar")
    expect(sidebar).to_be_hidden()
    answer = chat.ask("hello from a phone", text="Short answer on a small screen.")
    expect(answer).to_have_attribute("data-status", "complete")
    page.locator("#settings summary").click()  # fold the settings away
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page scrolls sideways ({width}px)"
    chat.screenshot("phone-width")
    page.get_by_role("button", name="Show conversations").click()
    expect(sidebar).to_be_visible()
    expect(page.get_by_role("button", name="New conversation")).to_be_focused()
    chat.screenshot("phone-width-conversations")
    page.get_by_role("button", name="Close the conversation list").click()
    expect(sidebar).to_be_hidden()
    # Open, the list dims the messages; a tap beside it closes it.
    page.get_by_role("button", name="Show conversations").click()
    expect(sidebar).to_be_visible()
    page.mouse.click(370, 400)
    expect(sidebar).to_be_hidden()
    expect(page.get_by_role("button", name="Show conversations")).to_have_attribute(
        "aria-expanded", "false"
    )


# The page header's parts as boxes: the title (with whether its text is cut), the time to
# first token, the buttons, and the header itself.
HEADER = """() => {
  const box = (node) => {
    const { top, bottom, left, right } = node.getBoundingClientRect();
    return { top, bottom, left, right };
  };
  const title = document.getElementById("conversation-title");
  return {
    header: box(document.querySelector(".pane-head")),
    title: box(title),
    cut: title.scrollWidth > title.clientWidth,
    ellipsis: getComputedStyle(title).textOverflow === "ellipsis",
    ttft: box(document.getElementById("ttft")),
    buttons: [...document.querySelectorAll(".pane-head > .button")]
      .filter((n) => n.offsetParent).map(box),
  };
}"""


def overlaps(a: dict, b: dict) -> bool:
    return (
        a["left"] < b["right"]
        and b["left"] < a["right"]
        and a["top"] < b["bottom"]
        and b["top"] < a["bottom"]
    )


def test_on_a_phone_the_title_gets_the_header_and_the_first_token_time_fits_below(open_chat):
    chat = open_chat(viewport={"width": 390, "height": 844})
    page = chat.page
    before = page.evaluate(HEADER)
    answer = chat.ask("hello from a phone", text="ok", tokens_per_second=200)
    expect(answer).to_have_attribute("data-status", "complete")
    expect(page.locator("#conversation-title")).to_have_text("hello from a phone")
    ttft = page.locator("#ttft")
    expect(ttft).to_contain_text("First token")
    expect(ttft).to_be_in_viewport()
    shown = page.evaluate(HEADER)
    assert not shown["cut"], f"a short title is cut: {shown}"
    parts = [shown["title"], shown["ttft"], *shown["buttons"]]
    for n, a in enumerate(parts):
        assert all(not overlaps(a, b) for b in parts[n + 1 :]), f"parts overlap: {shown}"
        assert shown["header"]["top"] <= a["top"] and a["bottom"] <= shown["header"]["bottom"]
    assert shown["header"] == before["header"], "the header changed its height"
    chat.screenshot("phone-header")

    # A title too long for the header is cut with an ellipsis, clear of the buttons.
    long_title = "A conversation about the rivers and the old stone mills of the north"
    page.get_by_role("button", name="Show conversations").click()
    page.get_by_role("button", name="Actions for hello from a phone").click()
    page.get_by_role("menuitem", name="Rename").click()
    page.get_by_label("Conversation title").fill(long_title)
    page.get_by_label("Conversation title").press("Enter")
    page.get_by_role("button", name="Close the conversation list").click()
    expect(page.locator("#conversation-title")).to_have_text(long_title)
    cut = page.evaluate(HEADER)
    assert cut["cut"] and cut["ellipsis"], cut
    assert all(not overlaps(cut["title"], b) for b in [cut["ttft"], *cut["buttons"]]), cut
    assert chat.errors == []


def test_a_draining_server_is_shown_as_restarting_not_unreachable(open_chat, daphne, account):
    server = daphne(STREAM_SHUTDOWN_DEADLINE="8")
    chat = open_chat(server)
    page = chat.page
    expect(page.get_by_role("button", name="Send")).to_be_enabled()
    with httpx.Client(base_url=server.url, timeout=30) as api:
        headers = {"Authorization": f"Token {account.token}"}
        conversation = api.post("/api/conversations/", json={}, headers=headers).json()["id"]
        running = api.post(
            f"/api/conversations/{conversation}/messages/",
            json={"content": "long", "params": {"simulation": {"length": 3000}}},
            headers=headers,
        )
        assert running.status_code == 201
        server.signal(signal.SIGTERM)  # it drains: the answer may finish, nothing new starts
        ready = api.get("/readyz")
        assert ready.status_code == 503 and ready.json()["down"] == ["process"]
    page.evaluate("window.dispatchEvent(new Event('online'))")  # the page checks at once
    expect(page.locator("#composer-reason")).to_contain_text("the server is restarting")
    expect(page.get_by_role("button", name="Send")).to_be_disabled()


def test_an_input_methods_enter_picks_its_word_and_does_not_save_the_rename(open_chat):
    """Japanese or Chinese is typed through an input method: Enter picks the word being
    composed, and only the Enter after it saves (it saved the unpicked reading)."""
    chat = open_chat()
    page = chat.page
    chat.ask("a question", text="one", tokens_per_second=200)
    expect(page.locator("article.assistant").last).to_have_attribute("data-status", "complete")
    page.get_by_role("button", name="Actions for a question").click()
    page.get_by_role("menuitem", name="Rename").click()
    field = page.get_by_label("Conversation title")
    field.fill("")
    ime = chat.context.new_cdp_session(page)
    ime.send("Input.imeSetComposition", {"text": "にほん", "selectionStart": 3, "selectionEnd": 3})
    # Enter while composing (Chromium marks it so: isComposing, keyCode 229).
    page.keyboard.press("Enter")
    expect(field).to_be_visible()
    ime.send("Input.insertText", {"text": "日本"})  # the word picked ends the composition
    expect(field).to_have_value("日本")
    field.press("Enter")
    expect(page.locator("#conversation-list .open")).to_have_text(["日本"])
