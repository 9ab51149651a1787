"""The blocks of an answer that are not its text: the model's reasoning as a "Thinking"
block above the answer (simulated engine with its ``reasoning`` parameter)."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.e2e

THOUGHT = "First <b>this</b>, then that: 日本語 🚀."


def test_thinking_streams_above_the_answer_then_folds_away(open_chat):
    chat = open_chat()
    answer = chat.ask(
        "think first", reasoning=THOUGHT, text="The answer.", tokens_per_second=4, ttft_ms=0
    )
    thinking = answer.locator("details.thinking")
    # Live while the model thinks: open, labelled, the text arriving.
    expect(thinking).to_have_attribute("data-state", "thinking")
    expect(thinking).to_have_attribute("open", "")
    expect(thinking.locator("summary")).to_have_text("Thinking…")
    # A model that thinks is not waiting for its first token: the state line says nothing
    # of it while the reasoning still streams.
    expect(thinking.locator(".thinking-text")).not_to_be_empty()
    expect(answer.locator(".stream-state")).not_to_contain_text("Waiting")
    expect(thinking).to_have_attribute("data-state", "thinking")
    expect(answer).to_have_attribute("data-status", "complete", timeout=20_000)
    # Folded once the answer began, with how long it took; reasoning is text, not markup.
    expect(thinking).not_to_have_attribute("open", "")
    expect(thinking.locator("summary")).to_contain_text("Thought for")
    assert thinking.locator(".thinking-text").text_content() == THOUGHT
    expect(thinking.locator("b")).to_have_count(0)
    expect(chat.content(answer)).to_have_text("The answer.")
    stored = chat.server_message(answer)
    assert (stored["reasoning"], stored["content"]) == (THOUGHT, "The answer.")

    # A reload shows the stored reasoning folded, with its duration from the record.
    chat.page.reload()
    chat.wait_ready()
    again = chat.page.locator("article.message.assistant").last
    expect(again.locator("details.thinking summary")).to_contain_text("Thought for")
    assert again.locator(".thinking-text").text_content() == THOUGHT
    assert chat.errors == []


def test_a_reload_after_the_thinking_does_not_time_its_replay(open_chat):
    """Reloaded while the answer streams, the thinking comes again from the log in one
    burst: it says "Thought" (not a duration measured from that burst) until the answer's
    record says how long it was."""
    chat = open_chat()
    page = chat.page
    text = " ".join(f"word{i}" for i in range(300))
    answer = chat.ask(
        "think, then talk", reasoning=THOUGHT, text=text, tokens_per_second=15, ttft_ms=0
    )
    expect(chat.content(answer)).to_contain_text("word2 ")
    page.reload()
    chat.wait_ready()
    answer = page.locator("article.message.assistant").last
    expect(chat.content(answer)).to_contain_text("word4 ")
    summary = answer.locator("details.thinking summary")
    expect(summary).to_have_text("Thought")
    assert answer.get_attribute("data-status") == "streaming"
    assert answer.locator(".thinking-text").text_content() == THOUGHT
    page.get_by_role("button", name="Stop").click()
    expect(answer).to_have_attribute("data-status", "cancelled")
    record = chat.server_message(answer)["termination"]
    took = (record["ttft_ms"] - record["reasoning_ttft_ms"]) / 1000
    # The record's figure, as the page rounds it (to a tenth of a second under 10 s).
    expect(summary).to_have_text(re.compile(r"Thought for \d+(\.\d)? s"))
    shown = float(summary.inner_text().removeprefix("Thought for ").removesuffix(" s"))
    assert abs(shown - took) <= (0.05 if took < 10 else 0.5) + 1e-9, (shown, took)
    assert chat.errors == []


def test_an_answer_without_reasoning_shows_no_thinking_block(open_chat):
    chat = open_chat()
    answer = chat.ask("plain", text="Just text.", tokens_per_second=200)
    expect(answer).to_have_attribute("data-status", "complete")
    expect(answer.locator("details.thinking")).to_be_hidden()


def test_a_tool_call_is_a_labelled_block_that_is_not_run(open_chat):
    chat = open_chat()
    arguments = '{"city": "<b>Paris</b>"}'
    answer = chat.ask(
        "weather?", tool_call={"name": "get_weather", "arguments": arguments}, tokens_per_second=50
    )
    expect(answer).to_have_attribute("data-status", "complete")
    block = answer.locator(".tool-call")
    expect(block).to_have_count(1)
    expect(block).to_have_attribute("aria-label", "Tool call")
    expect(block.locator(".tool-call-name")).to_have_text("get_weather")
    expect(block.locator(".tool-call-arguments")).to_contain_text('"city": "<b>Paris</b>"')
    expect(block.locator("b")).to_have_count(0)
    expect(answer.locator(".cut-off")).to_be_hidden()  # calling a tool is a natural end
    assert chat.server_message(answer)["termination"]["finish_reason"] == "tool_calls"
    chat.page.reload()
    chat.wait_ready()
    again = chat.page.locator("article.message.assistant").last
    expect(again.locator(".tool-call-name")).to_have_text("get_weather")
    assert chat.errors == []


def test_the_model_picker_chooses_who_answers(open_chat, daphne, emulator):
    from tests.emulator.vllm_emulator import DEFAULT_TEXT

    server = daphne(ENGINE_MODELS=json.dumps({"test-model": emulator}))
    chat = open_chat(server)
    page = chat.page
    picker = page.locator("#model")
    expect(picker.locator("option")).to_have_text(["simulated (default)", "test-model"])
    page.locator("#settings summary").click()
    picker.select_option("test-model")
    emulated = chat.ask("hello there")
    expect(emulated).to_have_attribute("data-status", "complete")
    assert chat.server_message(emulated)["model"] == "test-model"
    assert chat.server_message(emulated)["content"] == DEFAULT_TEXT

    picker.select_option("")
    simulated = chat.ask("hello again", text="From the simulator.", tokens_per_second=200)
    expect(simulated).to_have_attribute("data-status", "complete")
    assert chat.server_message(simulated)["model"] == "simulated"
    expect(chat.content(simulated)).to_have_text("From the simulator.")
