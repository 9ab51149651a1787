"""The chat page as a test drives it: log in, ask, stop, continue, read what is shown."""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import BrowserContext, Locator, Page, expect

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"

# The newest lines a page's journal keeps: enough for a few answers' requests and retries.
JOURNAL_LINES = 500


# Every message the page shows, as its bubble says it: for a failed test's report.
SHOWN_MESSAGES = """() => [...document.querySelectorAll("article.message")].map((node) => ({
  ...node.dataset,
  state: node.querySelector(".stream-state")?.textContent ?? null,
  text: (node.querySelector(".content")?.innerText ?? "").slice(0, 200),
}))"""


def paragraphs(count: int) -> str:
    """An answer of ``count`` paragraphs, each a few lines long: several screens of blocks."""
    line = " ".join(["the river runs past the old stone mill"] * 4)
    return "\n\n".join(f"Paragraph {n}: {line}" for n in range(count))


class ChatPage:
    def __init__(self, context: BrowserContext, base_url: str, api_url: str, token: str) -> None:
        self.context = context
        self.base_url = base_url
        self.api_url = api_url
        self.token = token
        self.page: Page = context.new_page()
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        # What the page did, in order, for a failed test's report (``report``): the page's
        # errors and console, every request but static files' and how it ended, every
        # WebSocket and its frames but an answer's text. Each line's time is when the test
        # received it: Playwright delivers a page's events while the test is in one of its
        # calls.
        self.journal: deque[str] = deque(maxlen=JOURNAL_LINES)
        self.opened_at = time.monotonic()
        page = self.page
        page.on("pageerror", self._page_error)
        page.on("dialog", self._dialog)
        page.on("console", self._console)
        page.on("request", lambda r: self._request(f"request {r.method}", r))
        page.on("requestfinished", lambda r: self._request("finished", r))
        page.on("requestfailed", lambda r: self._request(f"failed ({r.failure})", r))
        page.on("websocket", self._websocket)

    def note(self, line: str) -> None:
        """Add a line to the journal (a test marks its own steps, a cut, with it too)."""
        self.journal.append(f"{time.monotonic() - self.opened_at:9.3f} {line}")

    def _console(self, message: Any) -> None:
        self.note(f"console {message.type}: {message.text}")
        if message.type == "error" and "Content Security Policy" in message.text:
            self.errors.append(message.text)  # the page's own policy refused something

    def _page_error(self, exc: Any) -> None:
        self.errors.append(str(exc))
        self.note(f"page error: {exc}")

    def _request(self, what: str, request: Any) -> None:
        if "/static/" not in request.url:
            self.note(f"{what} {request.url}")

    def _websocket(self, socket: Any) -> None:
        self.note(f"websocket {socket.url}")
        socket.on("close", lambda _: self.note(f"websocket closed {socket.url}"))
        socket.on("framesent", lambda payload: self._frame("sent", payload))
        socket.on("framereceived", lambda payload: self._frame("received", payload))

    def _frame(self, direction: str, payload: str | bytes) -> None:
        """A WebSocket frame for the journal, but the text of an answer and keep-alives."""
        try:
            kind = json.loads(payload).get("type")
        except (ValueError, AttributeError):
            kind = None
        if kind not in ("delta", "reasoning", "ping", "pong"):
            self.note(f"websocket {direction}: {payload[:160]!r}")

    def report(self) -> str:
        """The page's errors, what it shows and its journal, for a failed test."""
        try:
            shown = json.dumps(self.page.evaluate(SHOWN_MESSAGES), indent=1)
        except Exception as exc:  # the page may be what failed
            shown = f"(not readable: {exc})"
        return "\n".join(
            [f"page errors: {self.errors}", f"messages shown: {shown}", "journal:", *self.journal]
        )

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.accept()

    def login(self, username: str, password: str) -> ChatPage:
        page = self.page
        page.goto(self.base_url + "/")
        expect(page).to_have_url(self.base_url + "/accounts/login/?next=/")
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(password)
        page.get_by_role("button", name="Sign in").click()
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        expect(self.page.locator("html")).to_have_attribute("data-ready", "true")

    def use_transport(self, name: str) -> None:
        """Choose it in Settings (by the user's name), then close Settings with Esc."""
        page = self.page
        page.get_by_role("button", name="Settings").click()
        settings = page.get_by_role("dialog", name="Settings")
        settings.get_by_label("WebSocket" if name == "ws" else "SSE").check()
        page.keyboard.press("Escape")
        expect(settings).to_be_hidden()

    def ask(
        self,
        content: str,
        *,
        max_tokens: int | None = None,
        tap_send: bool = False,
        **simulation: Any,
    ) -> Locator:
        """Type a message and press Enter (``tap_send``: tap Send, as on a touch keyboard,
        where Enter is a newline); returns the new answer's bubble."""
        page = self.page
        answers = page.locator("article.message.assistant")
        before = answers.count()
        settings = page.locator("#settings")
        if not settings.evaluate("node => node.open"):
            settings.locator("summary").click()
        page.get_by_label("Max tokens").fill("" if max_tokens is None else str(max_tokens))
        if simulation:
            self.simulate(**simulation)
        box = page.get_by_label("Message", exact=True)
        box.fill(content)
        # As a person would: Enter sends only once Send is back (the previous answer in
        # this conversation has ended, its last text can come before its end).
        expect(page.get_by_role("button", name="Send")).to_be_enabled()
        if tap_send:
            page.get_by_role("button", name="Send").click()
        else:
            box.press("Enter")
        try:
            expect(answers).to_have_count(before + 1)
        except AssertionError as exc:
            notice = page.locator("#notice")
            said = notice.inner_text() if notice.is_visible() else "(no banner)"
            raise AssertionError(f"no answer appeared; the page says: {said}") from exc
        return answers.nth(before)

    def simulate(self, **simulation: Any) -> None:
        """Script the next answer (the Developer switch's simulation settings)."""
        page = self.page
        settings = page.locator("#settings")
        if not settings.evaluate("node => node.open"):
            settings.locator("summary").click()
        page.get_by_label("Developer").check()
        page.get_by_label("Simulation (JSON, for the next message only)").fill(
            json.dumps(simulation)
        )

    @staticmethod
    def content(bubble: Locator) -> Locator:
        return bubble.locator(".content")

    def server_message(self, bubble: Locator) -> dict[str, Any]:
        return self.message(bubble.get_attribute("data-message-id") or "")

    def message(self, message_id: str) -> dict[str, Any]:
        """The message as the server has it (``GET /api/messages/<id>/``)."""
        return self.api_get(f"/api/messages/{message_id}/")

    def api_get(self, path: str) -> dict[str, Any]:
        """What the server answers the page's user at ``path`` (a 200's JSON)."""
        response = httpx.get(
            f"{self.api_url}{path}", headers={"Authorization": f"Token {self.token}"}, timeout=10
        )
        assert response.status_code == 200, response.text
        return response.json()

    def wait_for_server_status(
        self, bubble: Locator | str, status: str, timeout: float = 15.0
    ) -> dict[str, Any]:
        """Poll the server (another process, no event to await) until the answer (its bubble
        or its id) has ``status``."""
        message_id = bubble if isinstance(bubble, str) else bubble.get_attribute("data-message-id")
        deadline = time.monotonic() + timeout
        while True:
            message = self.message(message_id or "")
            if message["status"] == status:
                return message
            assert time.monotonic() < deadline, f"still {message['status']!r}, not {status!r}"
            time.sleep(0.1)

    def tab_order(self, limit: int = 80) -> list[tuple[str, str]]:
        """Press Tab from the skip link until focus comes back round or leaves the page;
        returns each focused control's name with its computed outline style."""
        page = self.page
        page.get_by_role("link", name="Skip to the message box").focus()
        order: list[tuple[str, str]] = []
        for _ in range(limit):
            page.keyboard.press("Tab")
            name, outline = page.evaluate(
                """() => {
                  const node = document.activeElement;
                  if (node === document.body) return ["", "none"];
                  const label = node.labels && node.labels.length ? node.labels[0] : node;
                  const name = node.id || node.getAttribute("aria-label") || label.textContent;
                  return [name.trim().slice(0, 30), getComputedStyle(node).outlineStyle];
                }"""
            )
            if name == "" or any(name == seen for seen, _ in order):
                break
            order.append((name, outline))
        return order

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=False)
        return path
