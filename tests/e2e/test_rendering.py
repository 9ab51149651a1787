"""What an answer looks like: model text is text, a markdown subset is built from nodes."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.e2e

HOSTILE = (
    '<img src=x onerror="window.pwned=1"> <script>window.pwned=2</script> '
    "[click](javascript:window.pwned=3) <b onmouseover=alert(1)>bold</b>"
)

MARKDOWN = (
    "Steps:\n\n"
    "- first `item`\n"
    "- see [docs](https://example.com/docs)\n\n"
    "```python\n"
    "print('hi')\n"
    "x = 1\n"
    "```\n\n"
    "مرحبا"
)


def test_markup_in_model_output_is_shown_as_text_and_never_runs(open_chat):
    chat = open_chat()
    page = chat.page
    answer = chat.ask("say something hostile", text=HOSTILE, tokens_per_second=200)
    expect(answer).to_have_attribute("data-status", "complete")
    content = chat.content(answer)
    expect(content).to_contain_text('<img src=x onerror="window.pwned=1">')
    expect(content).to_contain_text("<script>window.pwned=2</script>")
    assert content.inner_text() == chat.server_message(answer)["content"] == HOSTILE
    for tag in ("img", "script", "b"):
        expect(page.locator(f"#log {tag}")).to_have_count(0)
    expect(content.locator("a")).to_have_count(0)  # javascript: links stay text
    assert page.evaluate("window.pwned") is None
    assert chat.dialogs == []
    assert chat.errors == []


def test_markdown_subset_and_an_unclosed_fence_while_cut_off(open_chat):
    chat = open_chat()
    # 30 tokens end inside the code block: it must render as an open code block.
    answer = chat.ask("show me", max_tokens=30, text=MARKDOWN, tokens_per_second=200)
    expect(answer).to_have_attribute("data-status", "truncated")
    content = chat.content(answer)
    block = content.locator(".code-block")
    expect(block).to_have_attribute("data-open", "true")
    expect(block.locator("pre code")).to_contain_text("print(")
    expect(answer.locator(".cut-off")).to_contain_text("Max tokens reached")
    expect(answer.locator(".cut-off")).to_contain_text("code block was left open")
    chat.screenshot("cut-off-max-tokens")

    items = content.locator("ul > li")
    expect(items).to_have_count(2)
    expect(items.nth(0).locator("code")).to_have_text("item")
    link = items.nth(1).locator("a")
    expect(link).to_have_attribute("href", "https://example.com/docs")
    expect(link).to_have_attribute("rel", "noopener noreferrer nofollow")
    expect(link).to_have_text("docs")

    answer.get_by_role("button", name="Continue").click()
    expect(answer).to_have_attribute("data-status", "complete")
    expect(block).to_have_attribute("data-open", "false")
    expect(block.locator("pre code")).to_have_text("print('hi')\nx = 1")
    expect(block.get_by_role("button", name="Copy")).to_be_visible()
    arabic = content.locator("p", has_text="مرحبا")
    expect(arabic).to_have_attribute("dir", "auto")
    assert arabic.evaluate("node => getComputedStyle(node).direction") == "rtl"
    chat.screenshot("markdown")
    assert chat.server_message(answer)["content"] == MARKDOWN
    assert chat.errors == []


def test_each_line_of_a_message_takes_its_own_direction(open_chat):
    chat = open_chat()
    page = chat.page
    box = page.get_by_label("Message", exact=True)
    box.fill("日本語の最初の行\nمرحبا بك في السطر الثاني")
    chat.simulate(text="こんにちは\n\nمرحبا بك", tokens_per_second=200)
    box.press("Enter")
    lines = page.locator("article.user .bubble > *")
    expect(lines).to_have_count(2)
    directions = lines.evaluate_all("nodes => nodes.map(n => getComputedStyle(n).direction)")
    assert directions == ["ltr", "rtl"]
    answer = page.locator("article.assistant")
    expect(answer).to_have_attribute("data-status", "complete")
    blocks = chat.content(answer).locator("p")
    assert blocks.evaluate_all("ns => ns.map(n => getComputedStyle(n).direction)") == [
        "ltr",
        "rtl",
    ]


CODE = "Here:\n\n```python\ndef f():\n    return 1\n```\n\nDone."


def test_the_streaming_cursor_follows_the_last_character_of_an_open_code_block(open_chat):
    chat = open_chat()
    # Silent after the code block's last line: the answer streams on with the fence open.
    answer = chat.ask("code", text=CODE, stall_after_tokens=12, tokens_per_second=100)
    content = chat.content(answer)
    code = content.locator(".code-block pre code")
    expect(code).to_contain_text("return 1")
    expect(content.locator(".code-block")).to_have_attribute("data-open", "true")
    cursor = content.locator(".cursor")
    expect(cursor).to_have_count(1)
    placed = cursor.evaluate(
        """node => {
          const code = node.closest("pre code");
          const rect = node.getBoundingClientRect();
          const box = code && code.getBoundingClientRect();
          const line = code && parseFloat(getComputedStyle(code).lineHeight);
          return {
            inCode: Boolean(code),
            last: code && code.lastChild === node,
            onLastLine: code && rect.bottom <= box.bottom + 1 && rect.top >= box.bottom - 2 * line,
          };
        }"""
    )
    assert placed == {"inCode": True, "last": True, "onLastLine": True}, placed
    assert content.inner_text().endswith("return 1")
    chat.page.get_by_role("button", name="Stop").click()
    expect(answer).to_have_attribute("data-status", "cancelled")
    expect(cursor).to_have_count(0)
