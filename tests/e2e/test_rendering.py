"""What an answer looks like: markdown as people know it, and model text that never becomes
live HTML (markup is shown as text, what markdown makes is sanitised)."""

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


# A page written out without a code fence: an HTML block, shown as the characters it is made
# of, its lines and their indentation too.
HTML_BLOCK = (
    "Here is the page:\n\n"
    '<div class="card">\n  <h1>Title</h1>\n  <p onclick="window.pwned=1">Body</p>\n</div>\n\n'
    "Done."
)


def test_an_html_block_is_shown_as_written_line_by_line(open_chat):
    chat = open_chat()
    page = chat.page
    answer = chat.ask("write a page", text=HTML_BLOCK, tokens_per_second=400)
    expect(answer).to_have_attribute("data-status", "complete")
    content = chat.content(answer)
    expect(content.locator("div.card, h1, [onclick]")).to_have_count(0)
    block = content.locator("p", has_text="Title")
    assert block.inner_text() == (
        '<div class="card">\n  <h1>Title</h1>\n  <p onclick="window.pwned=1">Body</p>\n</div>'
    )
    assert content.inner_text() == HTML_BLOCK == chat.server_message(answer)["content"]
    page.reload()
    chat.wait_ready()
    assert chat.content(page.locator("article.assistant").last).inner_text() == HTML_BLOCK
    assert page.evaluate("window.pwned") is None
    assert chat.errors == []


# Each line tries another way in; none may run, load anything or become a live element.
HOSTILE_MARKDOWN = "\n\n".join(
    [
        '<div onclick="window.pwned=4">a block of HTML</div>',
        "<javascript:window.pwned=5> and [data](data:text/html,<script>alert(6)</script>)",
        "![pixel](javascript:window.pwned=7) ![tracker](https://tracker.example/p.gif)",
        "$\\href{javascript:window.pwned=8}{math link}$ and <style>body{display:none}</style>",
        "[https://bank.example.com/login](https://evil.example/login) <iframe src=x></iframe>",
        '<a href="https://evil.example/">html link</a> [mail](mailto:someone@example.com)',
        "[![badge](https://ci.example/badge.svg)](https://ci.example/runs)",
        "$\\rule{300em}{0.2em}$",  # a rule wider than pages
        # Another host named in a link's text however it is written: bold, code, in a
        # sentence, with look-alike dots, reversed by a direction control.
        "[**https://bank.example.com/a**](https://evil.example/a) "
        "[`https://bank.example.com/b`](https://evil.example/b) "
        "[Go to https://bank.example.com/c now](https://evil.example/c) "
        "[https://bank\u2024example\u2024com](https://evil.example/d) "
        "[\u202emoc.elpmaxe.knab//:sptth](https://evil.example/e)",
        # ...or in markup written as HTML, which shows as the characters it is made of.
        "[<secure bank.example.com>](https://evil.example/f) "
        "[<!-- https://bank.example.com/g -->](https://evil.example/g) "
        '[<a title="https://bank.example.com/h">](https://evil.example/h)',
        "[the docs](https://docs.example.org/x) [docs.example.org/y](https://docs.example.org/y)",
    ]
)
# Math that moves a box out of its answer, onto the page beside it (a negative kern: no
# size cap reaches it).
SPOOF = "$\\kern-2.75em\\colorbox{#e7eefc}{SPOOF}$"


def test_markdown_that_tries_to_make_html_is_defused(open_chat):
    chat = open_chat()
    page = chat.page
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    text = f"{HOSTILE_MARKDOWN}\n\n{SPOOF}"
    answer = chat.ask("try harder", text=text, tokens_per_second=400)
    expect(answer).to_have_attribute("data-status", "complete")
    content = chat.content(answer)
    expect(content).to_contain_text('<div onclick="window.pwned=4">a block of HTML</div>')
    expect(content).to_contain_text("<style>body{display:none}</style>")
    for tag in ("div[onclick]", "img", "iframe", "style", "script"):
        expect(content.locator(tag)).to_have_count(0)
    hrefs = content.locator("a").evaluate_all("links => links.map(a => a.href)")
    assert all(h.startswith(("https://", "mailto:")) for h in hrefs), hrefs
    # The image is a link to it, never loaded; the javascript: one stays text.
    image = content.get_by_role("link", name="Image: tracker")
    expect(image).to_have_attribute("href", "https://tracker.example/p.gif")
    expect(content).to_contain_text("![pixel](javascript:window.pwned=7)")
    assert not [url for url in requested if "tracker.example" in url]
    # A link whose text names another host shows where it really goes.
    deceptive = content.get_by_role("link", name="https://bank.example.com/login")
    expect(deceptive).to_have_attribute("href", "https://evil.example/login")
    expect(deceptive.locator("xpath=following-sibling::*[1]")).to_have_text(" (evil.example)")
    for tail in "abcdefgh":
        link = content.locator(f'a[href="https://evil.example/{tail}"]')
        expect(link.locator("xpath=following-sibling::*[1]")).to_have_text(" (evil.example)")
    # A link's own host, named or not, adds nothing.
    expect(content.locator(".link-host")).to_have_count(9)
    expect(content.get_by_role("link", name="mail")).to_have_attribute(
        "href", "mailto:someone@example.com"
    )
    for link in content.locator("a").all():
        expect(link).to_have_attribute("rel", "noopener noreferrer nofollow")
        assert link.inner_text().strip(), "no empty link (one split by a link inside it)"
    # A linked image is that link's label: one link, to where the badge points.
    expect(content.get_by_role("link", name="Image: badge")).to_have_attribute(
        "href", "https://ci.example/runs"
    )
    expect(content.locator("a a")).to_have_count(0)
    # Nothing of the answer is drawn outside its bubble, nor widens the page.
    spoof = content.locator(".katex-html").get_by_text("SPOOF", exact=True)
    expect(spoof).to_have_count(1)
    outside, on_page, hit = spoof.evaluate(
        """node => {
             const r = node.getBoundingClientRect(), x = r.x + r.width / 2, y = r.y + r.height / 2;
             const within = (b) => b.left <= x && x <= b.right && b.top <= y && y <= b.bottom;
             const at = document.elementFromPoint(x, y);
             return [!within(node.closest(".content").getBoundingClientRect()),
                     within(document.getElementById("log").getBoundingClientRect()),
                     at !== null && node.contains(at)]; }"""
    )
    assert outside and on_page, "the box was moved out of the answer, onto the message log"
    assert hit is False, "and is not drawn there"
    assert page.evaluate("document.scrollingElement.scrollWidth <= innerWidth")
    assert page.locator("#log").evaluate("log => log.scrollWidth <= log.clientWidth")
    content.locator("text=a block of HTML").click()
    assert page.evaluate("window.pwned") is None
    assert chat.dialogs == []
    assert chat.errors == []


GFM = """## Results

Some *italic*, **bold** and ~~struck~~ text.

| Engine | Tokens/s |
|:-------|---------:|
| simulated | 40 |
| vLLM | 95 |

1. First
2. Second
   - nested one
   - nested two

- [x] done
- [ ] to do

> Quoted wisdom
> on two lines.

---

```python
def square(x):
    return x * x
```

Inline $E = mc^2$ and displayed:

$$\\sum_{i=1}^{n} i = \\frac{n(n+1)}{2}$$
"""


def test_tables_lists_quotes_code_and_math_render_from_an_answer(open_chat):
    chat = open_chat()
    chat.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page = chat.page
    answer = chat.ask("format it", text=GFM, tokens_per_second=400)
    expect(answer).to_have_attribute("data-status", "complete")
    content = chat.content(answer)
    expect(content.locator("h2")).to_have_text("Results")
    expect(content.locator("em")).to_have_text("italic")
    expect(content.locator("del")).to_have_text("struck")

    table = content.locator(".table-wrap table")
    expect(table.locator("th")).to_have_text(["Engine", "Tokens/s"])
    expect(table.locator("tbody tr")).to_have_count(2)
    expect(table.locator("tbody tr").nth(1).locator("td")).to_have_text(["vLLM", "95"])

    expect(content.locator("ol > li")).to_have_count(2)
    expect(content.locator("ol > li").nth(1).locator("ul > li")).to_have_text(
        ["nested one", "nested two"]
    )
    boxes = content.locator("li input[type=checkbox]")
    expect(boxes).to_have_count(2)
    assert boxes.evaluate_all("bs => bs.map(b => [b.checked, b.disabled])") == [
        [True, True],
        [False, True],
    ]
    expect(content.locator("blockquote")).to_contain_text("Quoted wisdom")
    expect(content.locator("hr")).to_have_count(1)

    block = content.locator(".code-block")
    expect(block.locator(".code-lang")).to_have_text("python")
    expect(block.locator("code .hljs-keyword").first).to_have_text("def")
    expect(block.locator("pre code")).to_have_text("def square(x):\n    return x * x")
    block.get_by_role("button", name="Copy").click()
    expect(block.get_by_role("button", name="Copied")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == "def square(x):\n    return x * x"

    inline, display = content.locator(".katex").nth(0), content.locator(".katex-display")
    expect(inline.locator("annotation")).to_have_text("E = mc^2")
    expect(display.locator("annotation")).to_have_text("\\sum_{i=1}^{n} i = \\frac{n(n+1)}{2}")
    expect(display.locator(".mfrac")).to_have_count(1)
    chat.screenshot("markdown-gfm")
    assert chat.errors == []


# An element's shape: its name, its attributes in name order, its text and its children.
SHAPE = """root => {
  const shape = (node) => node.nodeType === Node.TEXT_NODE ? JSON.stringify(node.data)
    : node.nodeType !== Node.ELEMENT_NODE ? ""
    : `<${node.localName} ${[...node.attributes].map((a) => `${a.name}=${a.value}`).sort()}>`
      + `${[...node.childNodes].map(shape).join("")}</${node.localName}>`;
  return shape(root);
}"""


def test_a_streamed_answer_ends_as_the_stored_answer_renders_at_once(open_chat):
    """While it streams, the last block is patched into its nodes, a completed block stays
    where it was shown, and its code is highlighted then: the end is what a reload shows."""
    chat = open_chat()
    answer = chat.ask("format it three times", text="\n\n".join([GFM] * 3), tokens_per_second=400)
    expect(answer).to_have_attribute("data-status", "complete", timeout=20_000)
    content = chat.content(answer)
    expect(content.locator(".code-block code .hljs-keyword")).to_have_count(6)
    assert content.locator(".blocks.kept").count() >= 1  # more blocks than one group holds
    streamed = content.evaluate(SHAPE)

    chat.page.reload()
    chat.wait_ready()
    again = chat.content(chat.page.locator("article.message.assistant").last)
    expect(again.locator(".code-block")).to_have_count(3)
    assert again.evaluate(SHAPE) == streamed
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
          const after = document.createRange();
          after.setStartAfter(node);
          if (code) after.setEndAfter(code.lastChild);
          return {
            inCode: Boolean(code),
            last: code && after.toString() === "",
            onLastLine: code && rect.bottom <= box.bottom + 1 && rect.top >= box.bottom - 2 * line,
          };
        }"""
    )
    assert placed == {"inCode": True, "last": True, "onLastLine": True}, placed
    assert content.inner_text().endswith("return 1")
    chat.page.get_by_role("button", name="Stop").click()
    expect(answer).to_have_attribute("data-status", "cancelled")
    expect(cursor).to_have_count(0)


WIDE_TABLE = (
    "| "
    + " | ".join(f"Measurement{n}" for n in range(8))
    + " |\n|"
    + "---|" * 8
    + "\n| "
    + " | ".join(f"throughput{n}" for n in range(8))
    + " |"
)


def test_a_wide_table_keeps_its_width_and_scrolls_sideways(open_chat):
    chat = open_chat()
    page = chat.page
    answer = chat.ask("a wide table", text=WIDE_TABLE, tokens_per_second=400)
    expect(answer).to_have_attribute("data-status", "complete")
    wrap = chat.content(answer).locator(".table-wrap")
    header = wrap.locator("th").first
    expect(header).to_have_text("Measurement0")
    # No word is broken: a header cell is one line, and the table is wider than the answer.
    assert header.evaluate(
        "n => n.clientHeight < 2 * parseFloat(getComputedStyle(n).lineHeight)"
    ), "a word in a table cell was broken"
    assert wrap.evaluate("w => w.scrollWidth > w.clientWidth")
    assert wrap.evaluate("w => { w.scrollLeft = 200; return w.scrollLeft; }") > 0
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    assert chat.errors == []


REFERENCES = (
    "See [the guide][guide] and [the spec] first.\n\n"
    "Then a [bad one][evil], and a [missing one][nowhere].\n\n"
    "A paragraph between them.\n\n"
    '[guide]: https://example.com/guide/getting-started "The guide"\n'
    "[The Spec]: https://example.com/spec\n"
    "[evil]: javascript:window.pwned=9\n\n"
    "The end, [the guide][guide] again."
)


def test_a_reference_link_is_resolved_by_its_definition_further_on(open_chat):
    """Each block is rendered once it is complete, before the definitions at the end of
    the answer have arrived: they still make its references links, sanitised as any."""
    chat = open_chat()
    answer = chat.ask("cite it", text=REFERENCES, tokens_per_second=60, ttft_ms=0)
    expect(answer).to_have_attribute("data-status", "complete")
    content = chat.content(answer)

    def check(content) -> None:
        guide = content.get_by_role("link", name="the guide")
        expect(guide).to_have_count(2)
        for link in guide.all():
            expect(link).to_have_attribute("href", "https://example.com/guide/getting-started")
            expect(link).to_have_attribute("rel", "noopener noreferrer nofollow")
        expect(content.get_by_role("link", name="the spec")).to_have_attribute(
            "href", "https://example.com/spec"
        )
        expect(content.locator("a")).to_have_count(3)  # not the javascript: one
        expect(content).to_contain_text("[missing one][nowhere]")  # no definition: text
        expect(content).not_to_contain_text("[guide]")  # a definition shows nothing
        expect(content).not_to_contain_text("https://example.com")

    check(content)
    chat.page.reload()
    chat.wait_ready()
    check(chat.content(chat.page.locator("article.message.assistant").last))
    assert chat.page.evaluate("window.pwned") is None
    assert chat.errors == []


# A code block taller than the log, in a full group of blocks (`.kept`: laid out only
# near the viewport), with paragraphs after it.
LONG_CODE = (
    "Before it.\n\n```python\n"
    + "\n".join(f"line_{n} = {n}" for n in range(80))
    + "\n```\n\n"
    + "\n\n".join(f"After it, paragraph {n}." for n in range(10))
)

# Scroll the log to put the code block's top `above` px above the log's top, and measure
# after the next frame: the code block's header, the block, the log and the page header.
SCROLL_CODE_BLOCK = """async (block, above) => {
  const log = document.getElementById("log");
  log.scrollTop += block.getBoundingClientRect().top - log.getBoundingClientRect().top + above;
  await new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)));
  const head = block.querySelector(".code-head");
  const box = (node) => {
    const { top, bottom, left, right } = node.getBoundingClientRect();
    return { top, bottom, left, right };
  };
  const h = box(head);
  const seen = document.elementFromPoint((h.left + h.right) / 2, (h.top + h.bottom) / 2);
  return {
    head: h,
    block: box(block),
    log: box(log),
    header: box(document.querySelector(".pane-head")),
    onTop: head.contains(seen),
  };
}"""


@pytest.mark.parametrize(
    "viewport",
    [{"width": 1000, "height": 600}, {"width": 390, "height": 844}],
    ids=["desktop", "phone"],
)
def test_a_code_blocks_header_stays_in_view_while_its_code_scrolls(open_chat, viewport):
    chat = open_chat(viewport=viewport)
    answer = chat.ask("a long script", text=LONG_CODE, tokens_per_second=2000, ttft_ms=0)
    expect(answer).to_have_attribute("data-status", "complete")
    content = chat.content(answer)
    block = content.locator(".code-block")
    expect(block.locator("pre code")).to_contain_text("line_79 = 79")
    assert block.evaluate("b => b.closest('.blocks').matches('.kept')")

    # Half a screen into the code: its header is at the top of the log, painted over the
    # code, below the page's header.
    at = block.evaluate(SCROLL_CODE_BLOCK, 300)
    assert at["block"]["top"] < at["log"]["top"] - 250, at  # the block's own top is gone
    assert abs(at["head"]["top"] - at["log"]["top"]) <= 1, at
    assert at["head"]["top"] >= at["header"]["bottom"], at
    assert at["onTop"], f"the header is covered: {at}"
    expect(block.get_by_role("button", name="Copy")).to_be_in_viewport()
    chat.screenshot(f"code-header-in-view-{viewport['width']}")

    # Past the block's end the header leaves with it: it never covers what follows.
    height = at["block"]["bottom"] - at["block"]["top"]
    past = block.evaluate(SCROLL_CODE_BLOCK, height - 10)
    assert past["head"]["bottom"] <= past["block"]["bottom"] + 1, past
    assert chat.errors == []


def test_deep_nesting_stays_inside_the_answer(open_chat):
    """Sixty levels of quotes and forty of lists: past six levels they stop indenting, so
    the deepest text is shown inside the answer (it was pushed past its edge, clipped)."""
    chat = open_chat()
    quotes = ">" * 60 + " deepest quote"
    lists = "\n".join("  " * level + f"- level {level}" for level in range(40))
    answer = chat.ask("nest", text=f"{quotes}\n\n{lists}", tokens_per_second=400)
    expect(answer).to_have_attribute("data-status", "complete")
    content = chat.content(answer)
    edge = content.bounding_box()
    assert edge is not None
    for text in ("deepest quote", "level 39"):
        shown = content.get_by_text(text, exact=True).bounding_box()
        assert shown is not None and shown["width"] > 0, text
        assert shown["x"] + shown["width"] <= edge["x"] + edge["width"], (text, shown, edge)
