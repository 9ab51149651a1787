"""Real Chromium (Debian's) against a real Daphne process, logged in through the login page.

Chromium is started per test, after the test's users exist: Playwright's synchronous API
runs an event loop in this thread, and Django refuses database calls while one is running.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from bench.chromium import CHROMIUM, CHROMIUM_ARGS
from tests.e2e.chatpage import ChatPage
from tests.e2e.relay import Relay

# Streams in these tests last a few seconds; the margins are for a loaded machine.
expect.set_options(timeout=20_000)

# The pages a test opened, for its report when it fails.
PAGES = pytest.StashKey[list[ChatPage]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test's report carries each page's errors, messages and journal: a failure
    seen once under load is explained by what the page did, not rerun until it shows."""
    report = yield
    if report.when == "call" and report.failed:
        pages: list[ChatPage] = item.stash.get(PAGES, [])
        for number, chat in enumerate(pages, 1):
            report.sections.append((f"chat page {number}", chat.report()))
    return report


@pytest.fixture
def chromium() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def relay_factory() -> Iterator[Callable[[int], Relay]]:
    relays: list[Relay] = []

    def make(port: int) -> Relay:
        relay = Relay(port)
        relays.append(relay)
        return relay

    yield make
    for relay in relays:
        relay.close()


@pytest.fixture
def open_chat(request, daphne, account, chromium) -> Iterator[Callable[..., ChatPage]]:
    """``open_chat(server=None, base_url=None, viewport=None, **context options)``: a
    logged-in chat page (``is_mobile=True, has_touch=True`` for a phone).

    The argument order matters: the user exists before Chromium starts (module docstring).
    """
    contexts: list[Any] = []
    pages = request.node.stash.setdefault(PAGES, [])

    def open_(
        server: Any = None,
        *,
        base_url: str | None = None,
        viewport: dict[str, int] | None = None,
        **options: Any,
    ) -> ChatPage:
        server = server or daphne()
        viewport = viewport or {"width": 1280, "height": 800}
        context = chromium.new_context(viewport=viewport, **options)
        context.set_default_timeout(45_000)
        contexts.append(context)
        chat = ChatPage(context, base_url or server.url, server.url, account.token)
        pages.append(chat)
        return chat.login(account.username, account.password)

    yield open_
    for context in contexts:
        context.close()
