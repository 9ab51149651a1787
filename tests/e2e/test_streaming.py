"""Answers stream into the page, stop, continue in place and survive dropped connections."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.e2e.chatpage import paragraphs

pytestmark = pytest.mark.e2e

COUNTING = "One two three four five six seven eight nine ten."

# Records every state of the newest answer the page shows, as [status, text] pairs.
RECORD_STATES = """() => {
  window.answerStates = [];
  const log = document.getElementById("log");
  new MutationObserver(() => {
    const answers = log.querySelectorAll("article.assistant");
    const last = answers[answers.length - 1];
    if (!last) return;
    window.answerStates.push([last.dataset.status, last.querySelector(".content").innerText]);
  }).observe(log, {subtree: true, childList: true, characterData: true, attributes: true});
}"""


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_answer_appears_as_it_streams(open_chat, transport):
    chat = open_chat()
    page = chat.page
    chat.use_transport(transport)
    page.reload()  # the choice is remembered
    chat.wait_ready()
    expect(page.get_by_label("WebSocket" if transport == "ws" else "SSE")).to_be_checked()
    streams = []
    one_step = "text/event-stream"  # the POST that asks for its answer's stream
    page.on(
        "request",
        lambda r: (
            ("/stream/" in r.url or one_step in r.headers.get("accept", ""))
            and streams.append(r.url)
        ),
    )
    page.on("websocket", lambda ws: streams.append(ws.url))
    page.evaluate(RECORD_STATES)

    box = page.get_by_label("Message", exact=True)
    box.press_sequentially("line one")
    box.press("Shift+Enter")
    box.press_sequentially("line two")
    text = " ".join(f"word{i}" for i in range(40))
    chat.simulate(text=text, tokens_per_second=40, ttft_ms=50)
    box.press("Enter")

    expect(page.locator("article.user .bubble").last).to_have_text(
        "line one\nline two", use_inner_text=True
    )
    answer = page.locator("article.assistant").last
    content = chat.content(answer)
    expect(content).to_contain_text("word0 word1")
    chat.screenshot(f"streaming-{transport}")
    expect(answer).to_have_attribute("data-status", "complete")
    expect(answer.locator(".cut-off")).to_be_hidden()
    expect(page.locator("#ttft")).to_contain_text("First token")

    final = content.inner_text()
    assert final == text == chat.server_message(answer)["content"]
    states = page.evaluate("window.answerStates")
    partial = {t for status, t in states if status == "streaming" and t and t != final}
    assert len(partial) >= 2, f"intermediate states were not shown: {states}"
    assert all(final.startswith(t) for t in partial), "a partial state is not a prefix"
    if transport == "ws":
        assert streams and all(url.endswith("/ws/chat/") for url in streams), streams
    else:
        # One request per answer: it came with its POST.
        assert streams and all(url.endswith("/messages/") for url in streams), streams
    assert chat.errors == []


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_stop_then_continue_extends_the_same_bubble(open_chat, transport):
    chat = open_chat()
    page = chat.page
    chat.use_transport(transport)
    # The engine goes silent after six tokens: the answer is reliably mid-way at Stop.
    answer = chat.ask("count", text=COUNTING, stall_after_tokens=6, tokens_per_second=100)
    content = chat.content(answer)
    expect(content).to_have_text("One two three four five six")
    expect(answer).to_have_attribute("data-status", "streaming")

    # A reload mid-answer replays the answer's log and goes on following it.
    page.reload()
    chat.wait_ready()
    answer = page.locator("article.assistant").last
    content = chat.content(answer)
    expect(content).to_have_text("One two three four five six")
    expect(answer).to_have_attribute("data-status", "streaming")
    expect(answer).to_have_attribute("data-connection", "live")
    expect(answer.locator(".stream-state")).not_to_contain_text("onnecting")

    page.get_by_role("button", name="Stop").click()
    cut_off = answer.locator(".cut-off")
    expect(cut_off).to_contain_text("Stopped by you")
    expect(answer).to_have_attribute("data-status", "cancelled")
    expect(cut_off.locator(".cut-off-mark")).to_be_hidden()  # a note, not a warning
    expect(page.get_by_role("button", name="Stop")).to_be_hidden()
    stopped = chat.server_message(answer)
    assert stopped["status"] == "cancelled"
    assert content.inner_text() == stopped["content"] == "One two three four five six"
    chat.screenshot(f"cut-off-stopped-{transport}")

    message_id = answer.get_attribute("data-message-id")
    cut_off.get_by_role("button", name="Continue").click()
    expect(answer).to_have_attribute("data-status", "complete")
    expect(cut_off).to_be_hidden()
    expect(page.locator("article.assistant")).to_have_count(1)
    assert answer.get_attribute("data-message-id") == message_id
    final = chat.server_message(answer)
    assert final["status"] == "complete"
    assert final["content"] == COUNTING
    assert content.inner_text() == final["content"]


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_a_continue_whose_answer_was_lost_is_shown_as_the_server_has_it(open_chat, transport):
    """The Continue reached the server and its answer was lost on the way back: the page
    shows the continued answer as the server streams it, and a second Continue goes on
    from all of it."""
    chat = open_chat()
    page = chat.page
    chat.use_transport(transport)
    answer = chat.ask("count", text=COUNTING, max_tokens=3, tokens_per_second=50)
    expect(answer).to_have_attribute("data-status", "truncated")
    lost = []

    def reached_then_lost(route) -> None:
        if lost:
            route.continue_()
            return
        lost.append(route.fetch().status)
        route.abort("connectionreset")

    page.route("**/continue/", reached_then_lost)
    with page.expect_event("requestfailed"):
        answer.get_by_role("button", name="Continue").click()
    assert lost == [202]
    # Drawn again as the server has it: the continued answer, followed to its end.
    answer = page.locator("article.assistant").last
    expect(chat.content(answer)).to_have_text("One two three four five six")
    expect(answer).to_have_attribute("data-status", "truncated")
    assert chat.server_message(answer)["content"] == "One two three four five six"
    answer.get_by_role("button", name="Continue").click()
    nine = "One two three four five six seven eight nine"
    expect(chat.content(answer)).to_have_text(nine)
    expect(answer).to_have_attribute("data-status", "truncated")
    assert chat.server_message(answer)["content"] == nine
    assert chat.errors == []


def test_escape_while_a_continue_is_on_its_way_stops_it_once_started(open_chat):
    chat = open_chat()
    page = chat.page
    answer = chat.ask("count", text=COUNTING, stall_after_tokens=3, tokens_per_second=100)
    expect(chat.content(answer)).to_have_text("One two three")
    page.get_by_role("button", name="Stop").click()
    expect(answer).to_have_attribute("data-status", "cancelled")
    held = []
    page.route("**/continue/", lambda route: held.append(route))  # answered after Escape
    with page.expect_request("**/continue/"):
        answer.get_by_role("button", name="Continue").click()
    page.get_by_label("Message", exact=True).press("Escape")
    # The Stop goes once the Continue has answered: awaited, so the record read after is
    # not the one from before the Continue reached the server (cancelled, one segment).
    with page.expect_response("**/cancel/"):
        held[0].continue_()
    stopped = chat.wait_for_server_status(answer, "cancelled")
    assert len(stopped["segments"]) == 2, "the Continue started, then was stopped"
    expect(answer).to_have_attribute("data-status", "cancelled")
    expect(chat.content(answer)).to_have_text(stopped["content"])
    assert chat.errors == []


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_a_page_opened_while_a_continue_streams_follows_the_continue(open_chat, transport):
    """The page replays the answer from its first event: the first segment's end (Stopped
    by you) is not the answer's end while its Continue streams."""
    chat = open_chat()
    page = chat.page
    chat.use_transport(transport)
    # Four tokens, then silence: in each segment (the Continue goes on for four more).
    answer = chat.ask("count", text=COUNTING, stall_after_tokens=4, tokens_per_second=100)
    content = chat.content(answer)
    expect(content).to_have_text("One two three four")
    page.get_by_role("button", name="Stop").click()
    expect(answer).to_have_attribute("data-status", "cancelled")
    answer.locator(".cut-off").get_by_role("button", name="Continue").click()
    expect(content).to_have_text("One two three four five six seven eight")

    page.reload()
    chat.wait_ready()
    answer = page.locator("article.assistant").last
    content = chat.content(answer)
    expect(content).to_have_text("One two three four five six seven eight")
    expect(answer).to_have_attribute("data-connection", "live")
    expect(answer.locator(".cut-off")).to_be_hidden()
    # Still following it: Stop ends the Continue, and the page shows that end.
    page.get_by_role("button", name="Stop").click()
    expect(answer).to_have_attribute("data-status", "cancelled")
    final = chat.server_message(answer)
    assert [s["status"] for s in final["segments"]] == ["cancelled", "cancelled"]
    assert content.inner_text() == final["content"] == "One two three four five six seven eight"
    assert chat.errors == []


def test_max_tokens_then_continue_with_the_keyboard_alone(open_chat):
    chat = open_chat()
    page = chat.page
    answer = chat.ask("count", max_tokens=6, text=COUNTING, tokens_per_second=200)
    cut_off = answer.locator(".cut-off")
    expect(cut_off).to_contain_text("Max tokens reached")
    expect(answer).to_have_attribute("data-status", "truncated")
    expect(cut_off.locator(".cut-off-mark")).to_be_visible()  # the answer is not whole
    content = chat.content(answer)
    assert content.inner_text() == chat.server_message(answer)["content"]
    assert content.inner_text() == "One two three four five six"

    order = chat.tab_order()
    names = [name for name, _ in order]
    for name in (
        "new-conversation",
        "Actions for count",
        "open-settings",
        "composer-input",
        "Continue",
        "send",
    ):
        assert name in names, f"{name} is not reachable by keyboard: {names}"
    assert all(outline != "none" for _, outline in order), f"no visible focus: {order}"

    # Tab to Continue and press Enter.
    page.get_by_role("link", name="Skip to the message box").focus()
    for _ in range(names.index("Continue") + 1):
        page.keyboard.press("Tab")
    expect(cut_off.get_by_role("button", name="Continue")).to_be_focused()
    page.keyboard.press("Enter")
    expect(answer).to_have_attribute("data-status", "complete")
    expect(cut_off).to_be_hidden()
    assert content.inner_text() == chat.server_message(answer)["content"] == COUNTING


def _slow_answer(chat, tokens_per_second=15):
    """An answer long enough to be cut mid-way: 45 tokens, three seconds by default."""
    answer = chat.ask("tell me", length=45, tokens_per_second=tokens_per_second, ttft_ms=0)
    expect(chat.content(answer)).not_to_be_empty()
    return answer


def _assert_resumed_exactly(chat, answer):
    expect(answer).to_have_attribute("data-status", "complete", timeout=30_000)
    expect(answer.locator(".stream-state")).to_be_hidden()
    server = chat.server_message(answer)
    assert server["status"] == "complete"
    assert chat.content(answer).inner_text() == server["content"]
    assert chat.errors == []


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_dropped_connection_resumes_without_losing_or_repeating_text(
    open_chat, daphne, relay_factory, transport
):
    server = daphne()
    relay = relay_factory(server.port)
    chat = open_chat(server, base_url=relay.url)
    chat.use_transport(transport)
    answer = _slow_answer(chat)

    relay.cut()
    chat.note("the relay is cut")
    assert chat.server_message(answer)["status"] == "streaming", "cut after the end"
    state = answer.locator(".stream-state")
    expect(state).to_contain_text("Reconnecting")
    chat.screenshot(f"reconnecting-{transport}")
    relay.restore()
    chat.note("the relay is restored")
    _assert_resumed_exactly(chat, answer)


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_a_connection_gone_silent_is_given_up_and_resumed(
    open_chat, daphne, relay_factory, transport
):
    """The connections go silent without closing (a proxy dropped them): after three of
    the server's heartbeats without a byte the page gives its stream up and resumes."""
    server = daphne(STREAM_PING_INTERVAL="1")
    relay = relay_factory(server.port)
    chat = open_chat(server, base_url=relay.url)
    chat.use_transport(transport)
    answer = _slow_answer(chat, tokens_per_second=4)
    relay.freeze()
    chat.note("the relay is frozen")
    assert chat.server_message(answer)["status"] == "streaming", "frozen after the end"
    _assert_resumed_exactly(chat, answer)


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_text_the_log_no_longer_holds_is_shown_from_the_stored_answer(open_chat, daphne, transport):
    """The page was offline while the answer ended, and the log let it go (kept 0 s here;
    a day by default, a laptop asleep longer): the resume is told text is missing, and the
    answer ends as the server stored it, never partial and marked complete."""
    chat = open_chat(daphne(STREAM_LOG_TTL="0"))
    chat.use_transport(transport)
    answer = _slow_answer(chat)
    chat.context.set_offline(True)
    ended = chat.wait_for_server_status(answer, "complete")
    chat.context.set_offline(False)
    _assert_resumed_exactly(chat, answer)
    assert len(ended["content"]) > len("tell me")


def test_offline_past_the_grace_period_shows_connection_lost(open_chat, daphne):
    chat = open_chat(daphne(STREAM_ABANDON_GRACE="0.5"))
    answer = _slow_answer(chat, tokens_per_second=10)

    chat.context.set_offline(True)
    expect(answer.locator(".stream-state")).to_contain_text("Reconnecting")
    chat.screenshot("reconnecting-offline")
    # With no reader left the server gives the answer up after the grace period.
    abandoned = chat.wait_for_server_status(answer, "abandoned")
    chat.context.set_offline(False)
    cut_off = answer.locator(".cut-off")
    expect(cut_off).to_contain_text("Connection lost")
    expect(answer.locator(".stream-state")).to_be_hidden()
    assert chat.content(answer).inner_text() == abandoned["content"]

    cut_off.get_by_role("button", name="Continue").click()
    _assert_resumed_exactly(chat, answer)


def test_an_answer_that_ended_while_its_stream_failed_shows_its_record(open_chat, daphne):
    """Every stream request fails (a proxy's 502 for the streams alone) while the answer
    ends: the page asks the REST API, and shows the stored answer and how it ended."""
    chat = open_chat(daphne(STREAM_ABANDON_GRACE="0.5"))
    chat.use_transport("sse")
    answer = _slow_answer(chat, tokens_per_second=10)
    chat.page.route("**/stream/**", lambda route: route.fulfill(status=502, body="bad gateway"))
    chat.context.set_offline(True)
    abandoned = chat.wait_for_server_status(answer, "abandoned")
    chat.context.set_offline(False)
    expect(answer.locator(".cut-off")).to_contain_text("Connection lost")
    expect(chat.content(answer)).to_have_text(abandoned["content"])
    assert chat.errors == []


def test_engine_failures_are_named(open_chat, daphne):
    chat = open_chat(daphne(STREAM_STALL_TIMEOUT="1"))
    failed = chat.ask("fail", text=COUNTING, error_after_tokens=3, tokens_per_second=200)
    expect(failed.locator(".cut-off")).to_contain_text("Server error: simulated engine failure")
    assert chat.content(failed).inner_text() == chat.server_message(failed)["content"]
    assert chat.server_message(failed)["status"] == "error"

    stalled = chat.ask("stall", text=COUNTING, stall_after_tokens=2, tokens_per_second=200)
    expect(stalled.locator(".cut-off")).to_contain_text("No tokens for 1 second")
    assert chat.server_message(stalled)["status"] == "stalled"
    expect(stalled.get_by_role("button", name="Continue")).to_be_enabled()

    # The other reasons, from the page's own wording module.
    words = chat.page.evaluate(
        """async () => {
          const { cutOffReason } = await import("/static/chat/termination.js");
          const config = { stallTimeout: 30 };
          return ["complete", "stopped", "truncated", "cancelled", "abandoned", "interrupted"]
            .map((status) => cutOffReason({ status }, config));
        }"""
    )
    assert words == [
        None,
        None,
        "Max tokens reached",
        "Stopped by you",
        "Connection lost",
        "Server restarted",
    ]


def test_stop_while_offline_is_sent_once_back_and_banners_clear_themselves(open_chat):
    chat = open_chat()
    page = chat.page
    answer = chat.ask("count", text=COUNTING, stall_after_tokens=6, tokens_per_second=100)
    content = chat.content(answer)
    expect(content).to_have_text("One two three four five six")

    chat.context.set_offline(True)
    page.get_by_role("button", name="Stop").click()
    state = answer.locator(".stream-state")
    expect(state).to_contain_text("Stop will be sent when the connection is back.")
    # A rename meanwhile cannot reach the server either: a banner says so.
    page.get_by_role("button", name="Actions for count").click()
    page.get_by_role("menuitem", name="Rename").click()
    page.get_by_label("Conversation title").fill("counting")
    page.get_by_label("Conversation title").press("Enter")
    notice = page.locator("#notice")
    expect(notice).to_contain_text("The server could not be reached.")
    chat.screenshot("stop-while-offline")
    assert chat.server_message(answer)["status"] == "streaming"

    chat.context.set_offline(False)
    expect(answer).to_have_attribute("data-status", "cancelled")
    expect(answer.locator(".cut-off")).to_contain_text("Stopped by you")
    expect(notice).to_be_hidden()
    assert chat.server_message(answer)["status"] == "cancelled"
    assert chat.errors == []


def test_a_streaming_answer_is_busy_for_screen_readers_until_it_ends(open_chat):
    """The log is a live region: a busy answer is announced once whole, not per token."""
    chat = open_chat()
    answer = chat.ask("count", text=COUNTING, stall_after_tokens=4, tokens_per_second=100)
    expect(chat.content(answer)).to_have_text("One two three four")
    text = answer.locator(".bubble")  # not its state line, which is announced as it changes
    expect(text).to_have_attribute("aria-busy", "true")
    chat.page.get_by_role("button", name="Stop").click()
    expect(answer).to_have_attribute("data-status", "cancelled")
    expect(text).to_have_attribute("aria-busy", "false")


def test_scrolling_up_while_it_streams_keeps_the_place_and_offers_jump_to_latest(open_chat):
    chat = open_chat(viewport={"width": 1000, "height": 600})
    page = chat.page
    answer = chat.ask("long", length=1500, tokens_per_second=80, ttft_ms=0)
    log = page.locator("#log")
    jump = page.get_by_role("button", name="Jump to latest")
    # Followed while at the bottom: the newest text stays in view.
    page.wait_for_function(
        "() => { const l = document.getElementById('log');"
        " return l.scrollHeight > 2 * l.clientHeight; }"
    )
    at_bottom = "l => l.scrollHeight - l.scrollTop - l.clientHeight < 80"
    assert log.evaluate(at_bottom)
    expect(jump).to_be_hidden()

    log.evaluate("l => { l.scrollTop = 0; }")
    expect(jump).to_be_visible()
    grown = log.evaluate("l => l.scrollHeight")
    page.wait_for_function(f"() => document.getElementById('log').scrollHeight > {grown} + 200")
    assert log.evaluate("l => l.scrollTop") == 0, "new text moved what the person was reading"
    chat.screenshot("jump-to-latest")

    jump.click()
    expect(jump).to_be_hidden()
    assert log.evaluate(at_bottom)
    page.get_by_role("button", name="Stop").click()
    expect(answer).to_have_attribute("data-status", "cancelled")


# Whether the log ever left its bottom while the page followed it, as the next paint would
# show it: checked by an observer of the messages' sizes made after the page's own, so
# called after it, once the layout of a frame is done.
WATCH_BOTTOM = """() => {
  const log = document.getElementById("log");
  const jump = document.getElementById("jump-to-latest");
  window.leftBottom = [];
  const sizes = new ResizeObserver(() => {
    const gap = log.scrollHeight - log.scrollTop - log.clientHeight;
    if (gap > 1 || !jump.hidden) window.leftBottom.push([gap, jump.hidden]);
  });
  new MutationObserver(() => { for (const node of log.children) sizes.observe(node); })
    .observe(log, {childList: true});
}"""

AT_BOTTOM = "l => l.scrollHeight - l.scrollTop - l.clientHeight <= 1"


def test_a_long_answer_is_followed_to_its_end_and_reopens_at_its_bottom(open_chat):
    chat = open_chat(viewport={"width": 1000, "height": 600})
    page = chat.page
    page.evaluate(WATCH_BOTTOM)
    answer = chat.ask(
        "many paragraphs", max_tokens=4000, text=paragraphs(20), tokens_per_second=200, ttft_ms=0
    )
    expect(answer).to_have_attribute("data-status", "complete")
    log = page.locator("#log")
    expect(chat.content(answer).locator("p")).to_have_count(20)
    page.wait_for_function(f"() => ({AT_BOTTOM})(document.getElementById('log'))")
    assert page.evaluate("window.leftBottom") == [], "the log stopped following the answer"
    expect(page.get_by_role("button", name="Jump to latest")).to_be_hidden()

    # Opened again from the server, the conversation shows its last line.
    page.reload()
    chat.wait_ready()
    last = chat.content(page.locator("article.assistant").last).locator("p").last
    expect(last).to_contain_text("Paragraph 19")
    page.wait_for_function(f"() => ({AT_BOTTOM})(document.getElementById('log'))")
    assert log.evaluate(AT_BOTTOM)
    expect(last).to_be_in_viewport()
    assert chat.errors == []


def test_event_streams_are_read_with_any_line_ending_split_anywhere(open_chat, daphne):
    """The page's event-stream reader, in the page: a stream whose lines end in "\\r\\n" or
    "\\r" (the format allows both, a proxy may rewrite them) gives the events a "\\n" stream
    gives, however the text arrives cut into reads."""
    chat = open_chat(daphne())
    results = chat.page.evaluate(
        """async () => {
          const stream = await import("/static/chat/transports/eventstream.js");
          const read = (pieces) => {
            const buffer = { text: "", cr: false }, got = [];
            for (const piece of pieces) {
              stream.append(buffer, piece);
              got.push(...stream.frames(buffer));
            }
            return JSON.stringify(got);
          };
          const lf = 'id: 1\\nevent: delta\\ndata: {"seq":1,"text":"a\\\\r\\\\nb"}\\n\\n'
            + ': ping\\n\\n' + 'event: done\\ndata: {"seq":2}\\n\\n';
          const expected = read([lf]);
          const results = { events: JSON.parse(expected).length, wrong: [] };
          for (const [name, ending] of [["CRLF", "\\r\\n"], ["CR", "\\r"], ["LF", "\\n"]]) {
            const text = lf.replaceAll("\\n", ending);
            for (let cut = 0; cut <= text.length; cut++) {
              if (read([text.slice(0, cut), text.slice(cut)]) !== expected) {
                results.wrong.push(`${name} cut at ${cut}`);
              }
            }
          }
          return results;
        }"""
    )
    assert results == {"events": 2, "wrong": []}
