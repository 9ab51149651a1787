"""The admin as an operator meets it in Chromium, and the demo user's password reset."""

from __future__ import annotations

import io

import httpx
import pytest
from django.core.management import call_command
from playwright.sync_api import expect

pytestmark = pytest.mark.e2e


def admin_login(page, base_url: str, username: str, password: str) -> None:
    page.goto(base_url + "/admin/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Site administration")).to_be_visible()


@pytest.fixture
def root(make_account):
    return make_account("root", staff=True)


def test_the_in_flight_list_is_linked_and_user_messages_show_no_answer_fields(
    daphne, root, chromium
):
    server = daphne()
    with httpx.Client(base_url=server.url, timeout=30) as api:
        headers = {"Authorization": f"Token {root.token}"}
        done = api.post(
            "/api/messages/?wait=true",
            json={"content": "hello", "params": {"simulation": {"text": "hi", "ttft_ms": 0}}},
            headers=headers,
        ).json()
    conversation = done["message"]["conversation"]
    user_message = done["user_message"]["id"]

    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        admin_login(page, server.url, root.username, root.password)

        page.goto(f"{server.url}/admin/streaming/conversation/{conversation}/change/")
        model = page.locator(".field-models .readonly")
        expect(model).to_have_text("simulated")
        records = page.locator(".field-termination_record .readonly")
        expect(records.first).to_have_text("only answers have one")
        expect(records.nth(1)).to_contain_text('"status": "complete"')

        page.goto(f"{server.url}/admin/streaming/message/{user_message}/change/")
        expect(page.locator(".field-content .readonly")).to_have_text("hello")
        expect(page.locator(".field-termination_record")).to_have_count(0)
        expect(page.locator(".field-model")).to_have_count(0)

        for listing in ("conversation", "message"):
            page.goto(f"{server.url}/admin/streaming/{listing}/")
            page.get_by_role("link", name="Streaming now").click()
            expect(page.get_by_role("heading", name="Answers streaming now")).to_be_visible()
    finally:
        context.close()


@pytest.fixture
def demo_password(transactional_db):
    """Run ``ensure_demo_user`` twice, then with ``--reset-password``: the new password."""
    first = io.StringIO()
    call_command("ensure_demo_user", stdout=first)
    again = io.StringIO()
    call_command("ensure_demo_user", stdout=again)
    assert "password:" not in again.getvalue()
    assert "make demo-password" in again.getvalue()
    reset = io.StringIO()
    call_command("ensure_demo_user", "--reset-password", stdout=reset)
    return next(
        line.split(":", 1)[1].strip()
        for line in reset.getvalue().splitlines()
        if line.strip().startswith("password:")
    )


def test_a_reset_demo_password_signs_in(daphne, demo_password, chromium):
    server = daphne()
    password = demo_password
    context = chromium.new_context()
    try:
        page = context.new_page()
        page.goto(server.url + "/")
        page.get_by_label("Username").fill("demo")
        page.get_by_label("Password").fill(password)
        page.get_by_role("button", name="Sign in").click()
        expect(page.locator("html")).to_have_attribute("data-ready", "true")
    finally:
        context.close()
