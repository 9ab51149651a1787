"""Log lines carry the ids of the stream they were written for, and only while it runs."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from streaming.logcontext import NO_ID, JsonFormatter, StreamContextFilter, stream_context


def ids() -> tuple[str, str]:
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "line", None, None)
    StreamContextFilter().filter(record)
    return record.message_id, record.request_id  # type: ignore[attr-defined]


def test_lines_inside_carry_the_ids_and_lines_after_do_not() -> None:
    assert ids() == (NO_ID, NO_ID)
    with stream_context("m1", "m1.0"):
        assert ids() == ("m1", "m1.0")
        with stream_context("m2"):  # a reader: its message, the request id it ran in
            assert ids() == ("m2", "m1.0")
        assert ids() == ("m1", "m1.0")
    assert ids() == (NO_ID, NO_ID)


def test_the_ids_are_reset_when_the_code_inside_fails() -> None:
    with pytest.raises(RuntimeError), stream_context("m1", "m1.0"):
        raise RuntimeError("failed")
    assert ids() == (NO_ID, NO_ID)


async def test_tasks_started_inside_carry_the_ids() -> None:
    async def later() -> tuple[str, str]:
        await asyncio.sleep(0)
        return ids()

    with stream_context("m1", "m1.0"):
        task = asyncio.create_task(later())
    assert ids() == (NO_ID, NO_ID)
    assert await task == ("m1", "m1.0"), "after the context was left here"


def test_a_json_line_has_the_ids() -> None:
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "hello %s", ("you",), None)
    with stream_context("m1", "m1.0"):
        StreamContextFilter().filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert (line["message"], line["message_id"], line["request_id"]) == ("hello you", "m1", "m1.0")
