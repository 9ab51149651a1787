"""A session that ends (signed out in another tab) keeps the draft and the conversation."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.e2e


def test_signing_in_again_comes_back_to_the_conversation_and_the_draft(open_chat, account):
    chat = open_chat()
    page = chat.page
    answer = chat.ask("remember me", text="I will.", tokens_per_second=200)
    expect(answer).to_have_attribute("data-status", "complete")
    conversation_url = page.url
    assert "#/c/" in conversation_url

    other = chat.context.new_page()  # another tab of the same browser signs out
    other.goto(chat.base_url + "/")
    other.get_by_role("button", name="Sign out").click()
    expect(other).to_have_url(chat.base_url + "/accounts/login/")
    other.close()

    box = page.get_by_label("Message", exact=True)
    box.fill("a draft I do not want to lose\nwith two lines")
    box.press("Enter")  # the send finds the session gone
    conversation = conversation_url.split("#/c/")[1]
    expect(page).to_have_url(f"{chat.base_url}/accounts/login/?next=%2F%23%2Fc%2F{conversation}")
    page.get_by_label("Username").fill(account.username)
    page.get_by_label("Password").fill(account.password)
    page.get_by_role("button", name="Sign in").click()
    chat.wait_ready()
    expect(page).to_have_url(conversation_url)
    expect(chat.content(page.locator("article.assistant"))).to_have_text("I will.")
    expect(box).to_have_value("a draft I do not want to lose\nwith two lines")
    assert chat.errors == []


def test_what_was_typed_before_the_scripts_ran_is_kept(open_chat):
    """The message box is in the page before its scripts run: what a person types there
    (on a slow network) stays when the page starts, beside a draft it had kept."""
    chat = open_chat()
    page = chat.page
    box = page.get_by_label("Message", exact=True)
    box.fill("an older draft")
    held: list = []
    page.route("**/static/chat/app.js*", lambda route: held.append(route))
    with page.expect_request("**/static/chat/app.js*"):
        page.reload(wait_until="commit")
    while not held:
        page.evaluate("0")  # a round trip: Playwright hands a route over during its calls
    expect(page.locator("html")).not_to_have_attribute("data-ready", "true")
    box.press_sequentially("typed while it loaded")
    held[0].continue_()
    chat.wait_ready()
    expect(box).to_have_value("an older draft\ntyped while it loaded")
    page.unroute("**/static/chat/app.js*")
    page.reload()
    chat.wait_ready()
    expect(box).to_have_value("an older draft\ntyped while it loaded")
    assert chat.errors == []
