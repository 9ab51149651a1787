"""Structured logs of a real Daphne process, and the request id that reaches vLLM."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from tests.emulator.server import await_request_end
from tests.support.clients import create_conversation, post_message, read_sse

pytestmark = pytest.mark.asyncio

POLL_INTERVAL = 0.05


def json_lines(text: str) -> list[dict[str, Any]]:
    """Our log lines; Daphne's own start-up and access lines are not JSON and are skipped."""
    lines = []
    for line in text.splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


async def wait_for_line(server: Any, wanted: Any, within: float = 10.0) -> list[dict[str, Any]]:
    """Poll the process's log file (written by another process) until a line matches."""
    deadline = time.monotonic() + within
    while True:
        lines = json_lines(server.log_text())
        if any(wanted(line) for line in lines):
            return lines
        if time.monotonic() > deadline:
            raise AssertionError(f"no matching log line in {within} s:\n{server.log_text()}")
        await asyncio.sleep(POLL_INTERVAL)


async def test_generation_lines_carry_message_and_request_id(daphne, account, emulator):
    server = daphne(LOG_FORMAT="json", ENGINE_URL=emulator, ENGINE_MODEL="test-model")
    directive = '[[emu {"text": "Hello from the engine", "tokens_per_second": 0}]]'
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(client, account.token, conversation, directive)
        result = await read_sse(client, account.token, message["id"])
    assert result.events[-1].data["status"] == "complete"
    message_id = message["id"]
    request_id = f"{message_id}.0"

    # vLLM got the same request id, as the X-Request-Id header.
    record = await asyncio.wait_for(await_request_end(emulator, request_id), 10)
    assert record["headers"]["x-request-id"] == request_id
    assert record["outcome"] == "completed"

    lines = await wait_for_line(
        server,
        lambda line: line["message_id"] == message_id and "generation ended" in line["message"],
    )
    ours = [line for line in lines if line["message_id"] == message_id]
    ended = [line for line in ours if "generation ended" in line["message"]]
    assert len(ended) == 1
    assert ended[0]["request_id"] == request_id
    assert ended[0]["logger"] == "streaming.generation"
    assert ended[0]["level"] == "INFO"
    assert {"time", "pid"} <= ended[0].keys()
    # The engine client's own line (httpx, logging the request to vLLM) is tagged too.
    engine_calls = [line for line in ours if "/v1/chat/completions" in line["message"]]
    assert engine_calls
    assert all(line["request_id"] == request_id for line in engine_calls)
    # A line that names the message in its text but lacks the id fields would be a line
    # about the stream outside its context.
    for line in lines:
        if message_id in line["message"]:
            assert line["message_id"] == message_id, line
