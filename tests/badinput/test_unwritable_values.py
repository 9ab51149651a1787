"""Values a JSON parser takes but the system could not write back: integers beyond 64
bits, infinities spelled as huge numbers, nesting past what the event encoder holds, and
simulation values of the wrong shape. Each is refused with the REST API's 400 on the
plain post, the one-step post (``Accept: text/event-stream``) and the WebSocket, before
anything is written, never a 500 or a stream that never answers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.api.calls import assert_error, client, new_conversation
from tests.badinput.test_ws_frames import connect, next_reply

ONE_STEP = {"Accept": "text/event-stream"}


def nested(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth - 1):
        value = {"x": value}
    return value


def tool(parameters: Any) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


TOOL_CALL = "params.simulation.tool_call"
TOOL = "params.tools[0].function.parameters"
# (params, the 400's code, the field it names or None for the whole body: the path of a
# number out of range, the innermost field that refused a value of the wrong shape)
REFUSED = [
    ({"simulation": {"seed": 2**70}}, "invalid_body", "params.simulation.seed"),
    ({"tools": tool({"type": "object", "maximum": 2**64})}, "invalid_body", f"{TOOL}.maximum"),
    ({"tools": tool({"type": "object", "minimum": -(2**63) - 1})}, "invalid_body", f"{TOOL}.minimum"),  # noqa: E501
    ({"temperature": 1e400}, "invalid_body", "params.temperature"),
    ({"tools": tool(nested(80))}, "invalid_body", "body"),
    ({"simulation": {"tool_call": "x"}}, "invalid_params", TOOL_CALL),
    ({"simulation": {"tool_call": {"name": 5}}}, "invalid_params", f"{TOOL_CALL}.name"),
    ({"simulation": {"length": 2**40}}, "invalid_params", "params.simulation.length"),
    ({"simulation": {"seed": 2**63}}, "invalid_params", "params.simulation.seed"),
]  # fmt: skip


def body_of(params: dict[str, Any]) -> str:
    # Written by hand: json.dumps would write 1e400 as Infinity.
    text = json.dumps({"content": "hello", "params": params})
    return text.replace("Infinity", "1e400")


@pytest.mark.parametrize(("params", "code", "field"), REFUSED)
def test_refused_alike_on_both_posts_and_nothing_is_written(
    daphne, account, params, code, field
) -> None:
    server = daphne()
    headers = {"content-type": "application/json"}
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        url = f"/api/conversations/{conversation}/messages/"
        plain = api.post(url, content=body_of(params), headers=headers)
        error = assert_error(plain, 400, code, field)
        one_step = api.post(url, content=body_of(params), headers={**headers, **ONE_STEP})
        assert one_step.status_code == 400, one_step.text
        assert one_step.json() == plain.json()
        new = api.post("/api/messages/", content=body_of(params), headers={**headers, **ONE_STEP})
        assert new.json()["error"] == error
        assert api.get(f"/api/conversations/{conversation}/messages/").json()["count"] == 0
        assert api.get("/api/conversations/").json()["count"] == 1


async def test_refused_on_the_websocket_and_the_socket_goes_on(daphne, account) -> None:
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
    async with connect(server, account.token) as ws:
        for params, code, field in REFUSED:
            frame = {"type": "message.create", "conversation": conversation, "ref": "r"}
            text = json.dumps({**frame, "content": "hello", "params": params})
            await ws.send(text.replace("Infinity", "1e400"))
            reply = await next_reply(ws)
            assert reply["type"] == "error", reply
            assert reply["code"] == ("invalid_json" if code == "invalid_body" else code), reply
            # A frame's fault of no one value names no field (a body's names the body).
            assert reply.get("field") == (None if field == "body" else field), reply
        # A ref the reply could not echo, and constants JSON does not have (the socket
        # closed with 1011 on the first; NaN reached PostgreSQL as a temperature).
        for text in (
            '{"type": "ping", "ref": 123456789012345678901234567890}',
            f'{{"type": "message.create", "conversation": "{conversation}", "content": "x",'
            ' "params": {"temperature": NaN}}',
        ):
            await ws.send(text)
            reply = await next_reply(ws)
            assert (reply["type"], reply["code"]) == ("error", "invalid_json"), reply
        await ws.send(json.dumps({"type": "ping", "ref": "alive"}))
        assert await next_reply(ws) == {"type": "pong", "ref": "alive"}
    with client(server, account.token) as api:
        assert api.get(f"/api/conversations/{conversation}/messages/").json()["count"] == 0
