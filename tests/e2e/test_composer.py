"""The message box: the skip link, refused first messages, errors that name the field, the
composer on a phone (touch keyboard, placeholder, settings), and Send that is Stop while
an answer streams."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.e2e

PHONE = {"width": 390, "height": 844}


def listed_conversations(chat) -> list[dict]:
    return chat.api_get("/api/conversations/")["results"]


def test_the_skip_link_keeps_the_open_conversation(open_chat):
    chat = open_chat()
    page = chat.page
    answer = chat.ask("first", text="one", tokens_per_second=200)
    expect(answer).to_have_attribute("data-status", "complete")
    url = page.url
    assert "#/c/" in url

    skip = page.get_by_role("link", name="Skip to the message box")
    skip.focus()
    page.keyboard.press("Enter")
    box = page.get_by_label("Message", exact=True)
    expect(box).to_be_focused()
    assert page.url == url, "the skip link changed the route"
    expect(page.locator("article.assistant")).to_have_count(1)

    box.fill("second")
    box.press("Enter")
    expect(page.locator("article.assistant")).to_have_count(2)
    expect(page.locator("article.assistant").last).to_have_attribute("data-status", "complete")
    assert page.url == url
    assert len(listed_conversations(chat)) == 1, "the next message started a new conversation"


def test_a_refused_first_message_leaves_no_conversation_and_names_the_field(open_chat, daphne):
    chat = open_chat(daphne(MAX_CONCURRENT_GENERATIONS_PER_USER="1"))
    page = chat.page
    notice = page.locator("#notice")
    box = page.get_by_label("Message", exact=True)
    settings = page.locator("#settings")
    settings.locator("summary").click()
    max_tokens = page.get_by_label("Max tokens")

    for value in ("0", "99999"):
        max_tokens.fill(value)
        box.fill("refused")
        box.press("Enter")
        expect(notice).to_contain_text("Max tokens must be between 1 and 4096.")
    chat.screenshot("error-names-the-field")
    max_tokens.fill("")
    chat.simulate(nope=1)
    box.fill("refused")
    box.press("Enter")
    expect(notice).to_contain_text('The simulation setting "nope" is not a known key')
    # The banner can be dismissed.
    notice.get_by_role("button", name="Dismiss this message").click()
    expect(notice).to_be_hidden()
    expect(box).to_have_value("refused")  # nothing typed is lost

    # One answer streams (the limit is 1): a second conversation's first message is a 429.
    running = chat.ask("long", length=2000, tokens_per_second=20)
    expect(running).to_have_attribute("data-status", "streaming")
    page.get_by_role("button", name="New conversation").click()
    box.fill("one too many")
    box.press("Enter")
    expect(notice).to_contain_text("At most one answer may stream at once")

    titles = [c["title"] for c in listed_conversations(chat)]
    assert titles == ["long"], f"refused messages left conversations behind: {titles}"
    expect(page.locator("#conversation-list .open")).to_have_text(["long (streaming)"])
    expect(page.locator("#log article")).to_have_count(0)
    assert chat.errors == []


def test_on_a_phone_enter_is_a_newline_and_the_composer_stays_small(open_chat):
    chat = open_chat(viewport=PHONE, is_mobile=True, has_touch=True)
    page = chat.page
    box = page.get_by_label("Message", exact=True)
    assert box.evaluate("node => node.enterKeyHint") == "enter"

    # The placeholder fits in the box at 390 px.
    fits = box.evaluate(
        """node => {
          const style = getComputedStyle(node);
          const context = document.createElement("canvas").getContext("2d");
          context.font = `${style.fontSize} ${style.fontFamily}`;
          const padding = parseFloat(style.paddingLeft) + parseFloat(style.paddingRight);
          const room = node.clientWidth - padding;
          return [context.measureText(node.placeholder).width, room];
        }"""
    )
    assert fits[0] <= fits[1], f"the placeholder is clipped: {fits}"

    box.fill("first line")
    box.press("Enter")
    box.type("second line")
    expect(box).to_have_value("first line\nsecond line")
    expect(page.locator("#log article")).to_have_count(0)
    page.get_by_role("button", name="Send").click()
    user = page.locator("article.user .bubble")
    expect(user).to_have_text("first line\nsecond line", use_inner_text=True)
    expect(page.locator("article.assistant")).to_have_count(1)

    # Open settings (with the developer tools shown) leave most of the screen to the log.
    page.locator("#settings summary").click()
    page.get_by_label("Developer").check()
    composer = page.locator("#composer").bounding_box()
    log = page.locator("#log").bounding_box()
    assert composer["height"] <= 0.3 * PHONE["height"], composer
    assert log["height"] >= 0.55 * PHONE["height"], log
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the page scrolls sideways ({width}px)"
    chat.screenshot("phone-settings-open")
    assert chat.errors == []


COUNTING = "One two three four five six seven eight nine ten."

# The composer's button as the page shows it: its name, type, title, icon, and its box
# from the message box's top right corner (the settings below may open meanwhile).
SEND_BUTTON = """node => {
  const icon = node.querySelector(".stop-icon");
  const shown = getComputedStyle(icon).visibility === "visible" && icon.getBoundingClientRect();
  const box = node.getBoundingClientRect();
  const field = document.getElementById("composer-input").getBoundingClientRect();
  return {
    name: node.getAttribute("aria-label") || node.textContent.trim(),
    type: node.type,
    title: node.title,
    box: [box.x - field.right, box.y - field.top, box.width, box.height].map(Math.round),
    icon: shown ? [Math.round(shown.width), Math.round(shown.height)] : null,
  };
}"""


def test_send_becomes_stop_while_the_answer_streams_and_back_when_it_ends(open_chat):
    chat = open_chat()
    page = chat.page
    composer = page.locator("#composer")
    send = composer.get_by_role("button", name="Send")
    idle = send.evaluate(SEND_BUTTON)
    assert idle["type"] == "submit" and idle["icon"] is None, idle
    posts: list[str] = []
    page.on(
        "request",
        lambda r: r.method == "POST" and r.url.endswith("/messages/") and posts.append(r.url),
    )

    # The engine goes silent after four tokens: the answer streams until it is stopped.
    answer = chat.ask("count", text=COUNTING, stall_after_tokens=4, tokens_per_second=100)
    expect(chat.content(answer)).to_have_text("One two three four")
    stop = composer.get_by_role("button", name="Stop")
    expect(stop).to_be_enabled()
    expect(send).to_have_count(0)
    expect(page.get_by_role("button", name="Stop")).to_have_count(1)  # one Stop on the page
    streaming = stop.evaluate(SEND_BUTTON)
    assert streaming["name"] == "Stop" and streaming["type"] == "button", streaming
    assert "Stop" in streaming["title"], streaming
    assert streaming["box"] == idle["box"], "Stop is not where Send was"
    width, height = streaming["icon"]
    assert width == height > 0, f"the stop icon is not a square: {streaming['icon']}"
    chat.screenshot("composer-stop")

    # Enter while it streams sends nothing: what was typed stays in the box for later.
    box = page.get_by_label("Message", exact=True)
    box.fill("a second question")
    box.press("Enter")
    stop.click()
    expect(answer).to_have_attribute("data-status", "cancelled")
    expect(answer.locator(".cut-off")).to_contain_text("Stopped by you")
    expect(send).to_be_enabled()
    expect(stop).to_have_count(0)
    assert send.evaluate(SEND_BUTTON) == idle
    expect(box).to_have_value("a second question")
    assert len(posts) == 1, posts  # the first question only
    expect(page.locator("article.user")).to_have_count(1)

    # Another conversation opened while an answer streams: Send there, Stop back here.
    running = chat.ask("count again", text=COUNTING, stall_after_tokens=4, tokens_per_second=100)
    expect(chat.content(running)).to_have_text("One two three four")
    expect(stop).to_be_visible()
    page.get_by_role("button", name="New conversation").click()
    expect(send).to_be_enabled()
    expect(stop).to_have_count(0)
    page.go_back()
    expect(stop).to_be_visible()
    page.keyboard.press("Escape")  # the shortcut stops it the same way
    expect(page.locator("article.assistant").last).to_have_attribute("data-status", "cancelled")
    expect(send).to_be_enabled()

    # An answer that ends by itself gives Send back too.
    done = chat.ask("short", text="ok", tokens_per_second=200)
    expect(done).to_have_attribute("data-status", "complete")
    expect(send).to_be_enabled()
    expect(stop).to_have_count(0)
    assert chat.errors == []


def _messages_of(chat, conversation: str) -> int:
    return chat.api_get(f"/api/conversations/{conversation}/messages/?tree=true")["count"]


def test_a_send_whose_answer_was_lost_is_sent_again_and_made_once(open_chat):
    """The first post reaches the server, which makes the message, but its answer never
    reaches the page (the connection drops): the page sends it again with the same
    ``Idempotency-Key`` and shows the one message the server made."""
    chat = open_chat()
    page = chat.page
    keys: list[str | None] = []

    def lose_the_first_answer(route):
        keys.append(route.request.headers.get("idempotency-key"))
        if len(keys) == 1:
            route.fetch()  # made on the server; the page never hears of it
            route.abort()
        else:
            route.continue_()

    page.route("**/api/messages/", lose_the_first_answer)
    answer = chat.ask("only once", text="made once", tokens_per_second=500)
    expect(answer).to_have_attribute("data-status", "complete")
    assert len(keys) == 2 and keys[0] and keys[0] == keys[1], keys
    expect(page.locator("article.message.user")).to_have_count(1)
    expect(page.locator("article.message.assistant")).to_have_count(1)
    expect(chat.content(answer)).to_have_text("made once")
    (conversation,) = listed_conversations(chat)
    assert _messages_of(chat, conversation["id"]) == 2
    expect(page.locator("#notice")).to_be_hidden()


def test_sending_again_after_the_retries_gave_up_makes_no_second_message(open_chat):
    """Every retry failed too (the banner says the server could not be reached): pressing
    Enter again on the same text sends the same key, so the message the first post made is
    shown, not made twice. Over WebSocket, where the post answers JSON."""
    chat = open_chat()
    page = chat.page
    chat.use_transport("ws")
    first = chat.ask("first", text="one", tokens_per_second=500)
    expect(first).to_have_attribute("data-status", "complete")
    conversation = listed_conversations(chat)[0]["id"]
    keys: list[str | None] = []

    def unreachable_after_the_first(route):
        keys.append(route.request.headers.get("idempotency-key"))
        if len(keys) == 1:
            route.fetch()
        route.abort()

    page.route("**/api/conversations/*/messages/", unreachable_after_the_first)
    chat.simulate(text="two", tokens_per_second=500)
    box = page.get_by_label("Message", exact=True)
    box.fill("second")
    box.press("Enter")
    expect(page.locator("#notice")).to_contain_text("The server could not be reached")
    assert len(keys) > 1 and len(set(keys)) == 1, keys
    expect(box).to_have_value("second")  # nothing typed is lost
    page.unroute("**/api/conversations/*/messages/")
    # Another tab shows the branch again, and this one draws the conversation again: with
    # the message the first post made, its answer now the one shown last.
    url = f"{chat.api_url}/api/conversations/{conversation}/"
    token = {"Authorization": f"Token {chat.token}"}
    leaf = chat.api_get(f"/api/conversations/{conversation}/")["current_leaf"]
    assert httpx.patch(url, json={"current_leaf": leaf}, headers=token).status_code == 200
    answers = page.locator("article.message.assistant")
    expect(answers).to_have_count(2)

    with page.expect_request("**/api/conversations/*/messages/") as resent:
        box.press("Enter")
    assert resent.value.headers.get("idempotency-key") == keys[0]
    assert resent.value.post_data_json["parent_id"] == first.get_attribute("data-message-id")
    expect(chat.content(answers.nth(1))).to_have_text("two")
    expect(page.locator("article.message.user")).to_have_count(2)
    assert _messages_of(chat, conversation) == 4


def test_a_proxys_error_pages_and_a_server_failure_are_told_in_words(open_chat):
    """A proxy's 502 on every try reads as the server being unreachable, as the docs
    say (it said "Request failed (502)."), and a 500 says the server failed, keeping
    the text; a message over the limit says by how much."""
    chat = open_chat()
    page = chat.page
    box = page.get_by_label("Message", exact=True)
    notice = page.locator("#notice")
    for status, said in (
        (502, "The server could not be reached"),
        (500, "The server failed to handle this (500)"),
    ):

        def failing(route, status=status):
            route.fulfill(status=status, body="<html>error</html>", content_type="text/html")

        page.route("**/api/messages/", lambda route: failing(route))
        box.fill(f"to a {status}")
        box.press("Enter")
        expect(notice).to_contain_text(said)
        expect(box).to_have_value(f"to a {status}")
        page.unroute("**/api/messages/")
    box.fill("x" * 32_001)
    box.press("Enter")
    expect(notice).to_contain_text("The message is longer than 32000 characters (it has 32001).")
