"""Text no store can hold (U+0000, unpaired surrogates) in any input is a 400 naming the
field, never a 500, and leaves nothing behind: REST, WebSocket and the OpenAI endpoint."""

from __future__ import annotations

import json

from tests.api.calls import assert_error, client, new_conversation
from tests.support.wsclient import ChatSocket


def tool(parameters: dict) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


JSON = {"content-type": "application/json"}

# Raw JSON bodies: "\ud800" must reach the server as an escape, which json.dumps writes.
REST_BODIES = [
    ({"content": "zero\u0000byte"}, "content"),
    ({"content": "lone \ud800 surrogate"}, "content"),
    ({"content": "hi", "params": {"stop": ["a\u0000"]}}, "params.stop"),
    ({"content": "hi", "params": {"simulation": {"text": "x\u0000y"}}}, "params.simulation.text"),
    # Anywhere in a tool, keys too: PostgreSQL's jsonb refuses U+0000 (it was a 500).
    ({"content": "hi", "params": {"tools": [tool({"x": "\u0000"})]}}, "params.tools[0]"),
    ({"content": "hi", "params": {"tools": [tool({"enum": ["\ud800"]})]}}, "params.tools[0]"),
    # A key is refused where the body is read, naming the object that has it: an unknown
    # one is named in its error, which could not be written (it was a 500).
    (
        {"content": "hi", "params": {"tools": [tool({"a\u0000": 1})]}},
        "params.tools[0].function.parameters",
    ),
    ({"content": "hi", "params": {"\ud800": 1}}, "params"),
    ({"content": "hi", "params": {"simulation": {"\udfff": 1}}}, "params.simulation"),
]


def test_rest_refuses_unstorable_text_naming_the_field(daphne, account):
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        url = f"/api/conversations/{conversation}/messages/"
        for body, field in REST_BODIES:
            raw = json.dumps(body)  # ASCII escapes: valid JSON, unstorable once decoded
            response = api.post(url, content=raw, headers={"content-type": "application/json"})
            assert_error(response, 400, field=field)
        top = api.post(url, content='{"content": "hi", "\\ud800": 1}', headers=JSON)
        assert_error(top, 400, "invalid_body")
        assert api.get(f"{url}").json()["count"] == 0
        for search in ("%00", "a%00b"):
            found = api.get(f"/api/conversations/?search={search}")
            assert_error(found, 400, "invalid_params", field="search")
        assert api.get("/api/conversations/?search=a").status_code == 200


def test_openai_refuses_unstorable_content_and_odd_roles_and_keeps_nothing(daphne, account):
    server = daphne()
    bearer = {"Authorization": f"Bearer {account.token}", "content-type": "application/json"}
    cases = [
        ([{"role": "user", "content": "a\u0000b"}], "messages[0].content"),
        (
            [{"role": "system", "content": "\udfff"}, {"role": "user", "content": "hi"}],
            "messages[0].content",
        ),
        ([{"role": ["user"], "content": "hi"}], "messages[0].role"),
        ([{"role": {"user": 1}, "content": "hi"}], "messages[0].role"),
    ]
    with client(server, account.token) as api:
        before = api.get("/api/conversations/").json()["count"]
        for messages, param in cases:
            body = json.dumps({"model": "simulated", "messages": messages})
            response = api.post("/v1/chat/completions", content=body, headers=bearer)
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == param
        keyed = json.dumps(
            {"model": "simulated", "messages": [{"role": "user", "content": "hi"}], "\ud800": 1}
        )
        response = api.post("/v1/chat/completions", content=keyed, headers=bearer)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "invalid_body"
        # A model name no encoder can write back: the reply naming it was never sent, and
        # the client waited for ever.
        for model in ("gpt\ud800", "simulated\udfff"):
            body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
            response = api.post("/v1/chat/completions", content=body, headers=bearer)
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == "model"
        assert api.get("/api/conversations/").json()["count"] == before


async def test_websocket_refuses_unstorable_content_and_keeps_serving(daphne, account):
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
    ws = await ChatSocket.connect(server.ws_url, account.token)
    try:
        frame = {"type": "message.create", "conversation": conversation, "ref": 1}
        await ws.send({**frame, "content": "zero\u0000byte"})
        reply = (await ws.recv_until("error"))[-1]
        assert (reply["code"], reply["field"], reply["ref"]) == ("invalid_params", "content", 1)
        # A key no encoder can write back, which an unknown field's error would name.
        await ws.send({"type": "message.create", "content": "hi", "\ud800": 1, "ref": 3})
        reply = (await ws.recv_until("error"))[-1]
        assert reply["code"] == "invalid_json", reply
        await ws.send({"type": "ping", "ref": 2})
        assert (await ws.recv_until("pong"))[-1]["ref"] == 2
    finally:
        await ws.close()
