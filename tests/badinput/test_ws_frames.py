"""Bad WebSocket frames against a real Daphne process.

Every bad frame gets an ``error`` frame naming what was wrong and the socket stays open
(docs/protocol.md, docs/reliability.md); after all of them the same socket and the server
still stream a message to its end.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
import websockets

from streaming.conf import DEFAULTS
from tests.support.clients import auth, create_conversation, post_message, wait_for_status

pytestmark = pytest.mark.asyncio


async def next_reply(ws: Any) -> dict[str, Any]:
    """The next frame that is not a keep-alive."""
    while True:
        frame = json.loads(await ws.recv())
        if frame.get("type") != "heartbeat":
            return frame


async def error_for(ws: Any, frame: str | bytes) -> dict[str, Any]:
    await ws.send(frame)
    reply = await next_reply(ws)
    assert reply["type"] == "error", reply
    return reply


def connect(
    server: Any, token: str | None = None, headers: dict[str, str] | None = None, **kwargs: Any
) -> Any:
    headers = {**(headers or {}), **(auth(token) if token else {})}
    return websockets.connect(
        f"{server.ws_url}/ws/chat/", additional_headers=headers, open_timeout=10, **kwargs
    )


async def stream_to_end(ws: Any, message_id: str) -> str:
    text = ""
    while True:
        frame = await next_reply(ws)
        if frame.get("message_id") != message_id:
            continue
        if frame["type"] == "delta":
            text += frame["text"]
        if frame["type"] == "done":
            assert frame["status"] == "complete"
            return text


async def test_malformed_frames_get_error_frames_and_the_socket_keeps_working(daphne, account):
    server = daphne()
    async with connect(server, account.token, max_size=None) as ws:
        assert (await error_for(ws, "{not json"))["code"] == "invalid_json"
        assert (await error_for(ws, "\ud800".encode("utf-8", "surrogatepass")))[
            "code"
        ] == "binary_frame"
        assert (await error_for(ws, b"\x00\x01\x02"))["code"] == "binary_frame"
        assert (await error_for(ws, "[1, 2]"))["code"] == "invalid_frame"
        assert (await error_for(ws, "42"))["code"] == "invalid_frame"
        assert (await error_for(ws, "null"))["code"] == "invalid_frame"
        oversized = json.dumps({"type": "ping", "pad": "x" * DEFAULTS["WS_MAX_FRAME_CHARS"]})
        assert (await error_for(ws, oversized))["code"] == "frame_too_large"
        just_under_daphne_limit = json.dumps({"type": "ping", "pad": "y" * (1000 * 1000)})
        assert (await error_for(ws, just_under_daphne_limit))["code"] == "frame_too_large"
        unknown = await error_for(ws, json.dumps({"type": "launch.missiles", "ref": 7}))
        assert unknown["code"] == "unknown_type"
        assert unknown["ref"] == 7, "errors carry the frame's ref back"
        assert (await error_for(ws, json.dumps({"type": ["ping"]})))["code"] == "unknown_type"
        assert (await error_for(ws, json.dumps({"no": "type"})))["code"] == "unknown_type"
        assert (await error_for(ws, json.dumps({"type": "subscribe"})))["code"] == "invalid_frame"
        for after in (-1, "5", True, 1.5, None):
            reply = await error_for(
                ws,
                json.dumps({"type": "subscribe", "message_id": str(uuid.uuid4()), "after": after}),
            )
            assert reply["code"] == "invalid_cursor", after
        bad_params = await error_for(
            ws,
            json.dumps(
                {
                    "type": "message.create",
                    "conversation": str(uuid.uuid4()),
                    "content": "hi",
                    "params": {"max_tokens": "lots"},
                }
            ),
        )
        assert bad_params["code"] == "invalid_params"
        assert bad_params["field"] == "params.max_tokens"

        await ws.send(json.dumps({"type": "ping", "ref": "still-there"}))
        assert await next_reply(ws) == {"type": "pong", "ref": "still-there"}
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            conversation = await create_conversation(client, account.token)
        await ws.send(
            json.dumps(
                {
                    "type": "message.create",
                    "conversation": conversation,
                    "content": "after the abuse",
                    "params": {"simulation": {"text": "still streaming", "tokens_per_second": 500}},
                }
            )
        )
        created = await next_reply(ws)
        assert created["type"] == "message.created"
        assert await stream_to_end(ws, created["message_id"]) == "still streaming"


async def test_frames_over_the_server_limit_close_the_socket_with_1009(daphne, account):
    """Daphne refuses WebSocket messages over 1 MiB before our code sees them."""
    server = daphne()
    async with connect(server, account.token, max_size=None) as ws:
        await ws.send(json.dumps({"type": "ping"}))
        assert (await next_reply(ws))["type"] == "pong"
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.send(json.dumps({"type": "ping", "pad": "z" * (2 * 1024 * 1024)}))
            await next_reply(ws)
        received = closed.value.rcvd
        # The server closes with 1009 (message too big); while our client is still
        # writing the rest of the frame the close may arrive as a reset instead.
        assert received is None or received.code == 1009
    async with connect(server, account.token) as ws:
        await ws.send(json.dumps({"type": "ping", "ref": 1}))
        assert await next_reply(ws) == {"type": "pong", "ref": 1}


async def test_unknown_and_foreign_messages_answer_not_found(daphne, account, other_account):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, "mine", simulation={"length": 5}
        )
    owned = message["id"]
    async with connect(server, other_account.token) as ws:
        for kind in ("subscribe", "cancel", "continue", "unsubscribe"):
            for target in (owned, str(uuid.uuid4()), "not-a-uuid", "../../etc/passwd"):
                await ws.send(json.dumps({"type": kind, "message_id": target, "ref": kind}))
                reply = await next_reply(ws)
                if kind == "unsubscribe":
                    # Nothing to stop: answered like any unsubscribe, nothing looked up.
                    assert reply == {"type": "unsubscribed", "message_id": target, "ref": kind}
                    continue
                assert reply["type"] == "error", (kind, target, reply)
                assert reply["code"] == "not_found", (kind, target, reply)
                assert reply["status"] == 404
                assert owned not in json.dumps(reply) or target == owned
        foreign_create = await error_for(
            ws, json.dumps({"type": "message.create", "conversation": conversation, "content": "x"})
        )
        assert foreign_create["code"] == "not_found"
        await ws.send(json.dumps({"type": "ping"}))
        assert (await next_reply(ws))["type"] == "pong"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        untouched = (
            await client.get(f"/api/messages/{owned}/", headers=auth(account.token))
        ).json()
        assert untouched["status"] in ("streaming", "complete")
        assert untouched["status"] != "cancelled"


def respellings(value: str) -> list[str]:
    """Spellings of a UUID that Python's ``uuid.UUID`` reads and the REST paths do not."""
    return [value.upper(), value.replace("-", ""), "{" + value + "}", "urn:uuid:" + value]


async def test_ids_in_frames_take_the_paths_spelling_only(daphne, account):
    """An id the REST paths 404 names nothing in a frame either, even the owner's own."""
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, "mine", simulation={"length": 5}
        )
        await wait_for_status(client, account.token, message["id"])
        for other in respellings(message["id"]):
            path = f"/api/messages/{other}/"
            assert (await client.get(path, headers=auth(account.token))).status_code == 404
    frames = [
        {"type": kind, "message_id": other}
        for kind in ("subscribe", "cancel", "continue", "message.regenerate")
        for other in respellings(message["id"])
    ]
    frames += [
        {"type": "message.edit", "message_id": other, "content": "x"}
        for other in respellings(message["parent_id"])
    ]
    frames += [
        {"type": "message.create", "conversation": other, "content": "x"}
        for other in respellings(conversation)
    ]
    async with connect(server, account.token) as ws:
        for frame in frames:
            reply = await error_for(ws, json.dumps(frame))
            assert (reply["code"], reply["status"]) == ("not_found", 404), (frame, reply)
        # The paths' spelling still names them.
        await ws.send(json.dumps({"type": "subscribe", "message_id": message["id"]}))
        assert (await next_reply(ws))["type"] != "error"


async def test_unauthenticated_socket_can_only_ping_or_authenticate(daphne, account):
    server = daphne()
    async with connect(server) as ws:
        for frame in (
            {"type": "subscribe", "message_id": str(uuid.uuid4())},
            {"type": "message.create", "conversation": str(uuid.uuid4()), "content": "hi"},
            {"type": "cancel", "message_id": str(uuid.uuid4())},
        ):
            assert (await error_for(ws, json.dumps(frame)))["code"] == "not_authenticated"
        assert (await error_for(ws, json.dumps({"type": "auth", "token": "nope"})))[
            "code"
        ] == "not_authenticated"
        assert (await error_for(ws, json.dumps({"type": "auth", "token": 12})))[
            "code"
        ] == "invalid_frame"
        # Text no key can hold (the database would refuse it) is an unknown token.
        for unstorable in ("a\u0000b", "\ud800", account.token + "\u0000"):
            frame = json.dumps({"type": "auth", "token": unstorable})
            assert (await error_for(ws, frame))["code"] == "not_authenticated", unstorable
        await ws.send(json.dumps({"type": "auth", "token": account.token}))
        assert (await next_reply(ws))["type"] == "authenticated"


async def test_a_socket_keeps_the_user_it_authenticated(daphne, account, other_account):
    """Its subscriptions, feed and revocation checks are its user's: an auth frame for
    another user is refused (naming the token) and changes nothing; the same user's other
    token is taken."""
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        mine = await post_message(
            client, account.token, conversation, "mine", simulation={"length": 3}
        )
    async with (
        connect(server, account.token) as ws,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        frame = json.dumps({"type": "auth", "token": other_account.token})
        refused = await error_for(ws, frame)
        assert (refused["code"], refused["field"]) == ("conflict", "token")
        await ws.send(json.dumps({"type": "subscribe", "message_id": mine["id"]}))
        assert (await next_reply(ws))["type"] == "subscribed"
        assert (
            await stream_to_end(ws, mine["id"])
            == (await wait_for_status(client, account.token, mine["id"]))["content"]
        )
        await ws.send(json.dumps({"type": "auth", "token": account.token}))
        assert (await next_reply(ws))["type"] == "authenticated"


async def test_bad_handshakes_are_refused_with_documented_codes(daphne, account):
    server = daphne()
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with connect(server, headers={"Origin": "https://evil.example"}):
            pass
    assert refused.value.response.status_code == 403
    async with connect(server, "not-a-token") as ws:
        assert (await error_for(ws, json.dumps({"type": "subscribe", "message_id": "x"})))[
            "code"
        ] == "not_authenticated"
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        assert (await client.get("/healthz")).status_code == 200


async def test_frame_fields_of_the_wrong_type_are_refused_naming_the_field(daphne, account):
    """A field the consumer reads is taken only with its documented type: anything else is
    refused naming the field, before anything is created, and the socket stays open."""
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, "first", simulation={"length": 3}
        )
        ended = await wait_for_status(client, account.token, message["id"])
    answer, question = ended["id"], ended["parent_id"]
    create = {"type": "message.create", "conversation": conversation, "content": "hi"}
    refused: list[tuple[dict[str, Any], str, str]] = []
    for value in (1, 0, None, "yes", "true", "false", [], {}):
        refused += [
            ({**create, "subscribe": value}, "invalid_frame", "subscribe"),
            (
                {"type": "message.regenerate", "message_id": answer, "subscribe": value},
                "invalid_frame",
                "subscribe",
            ),
            (
                {
                    "type": "message.edit",
                    "message_id": question,
                    "content": "x",
                    "subscribe": value,
                },
                "invalid_frame",
                "subscribe",
            ),
            (
                {"type": "message.regenerate", "message_id": answer, "stop": value},
                "invalid_frame",
                "stop",
            ),
        ]
    for value in (5, 0, True, False, "", [], {}, [conversation]):
        refused.append(({**create, "conversation": value}, "invalid_frame", "conversation"))
    for value in (False, 0, 5, [], {}):
        refused += [
            ({**create, "model": value}, "invalid_params", "model"),
            (
                {"type": "message.edit", "message_id": question, "content": "x", "model": value},
                "invalid_params",
                "model",
            ),
        ]
    # The answer a question goes after: an id of an answer of the conversation.
    for value in (5, True, "", "not-a-uuid", [answer], {}):
        refused.append(({**create, "parent_id": value}, "invalid_params", "parent_id"))
    refused += [
        ({**create, "parent_id": question}, "wrong_role", "parent_id"),
        ({**create, "parent_id": str(uuid.uuid4())}, "not_found", "parent_id"),
        # The answer's id spelt otherwise than the paths take it names none.
        *(
            ({**create, "parent_id": other}, "not_found", "parent_id")
            for other in respellings(answer)
        ),
        (
            {"type": "message.create", "content": "hi", "parent_id": answer},
            "invalid_params",
            "parent_id",
        ),
    ]
    for kind in ("subscribe", "unsubscribe", "cancel", "continue", "message.regenerate"):
        for value in (5, None, "", [answer]):
            refused.append(({"type": kind, "message_id": value}, "invalid_frame", "message_id"))
    for kind in ("subscribe", "unsubscribe"):
        for value in (5, "users", True, {}):
            refused.append(({"type": kind, "topic": value}, "invalid_frame", "topic"))
    refused.append(({"type": "ping", "ref": {"id": 1}}, "invalid_frame", "ref"))
    refused.append(({"type": "auth", "token": 12}, "invalid_frame", "token"))
    # A field the frame's type does not take, misspelt or misplaced, is refused by name.
    refused += [
        ({**create, "max_tokens": 2}, "invalid_frame", "max_tokens"),
        ({**create, "parms": {}}, "invalid_frame", "parms"),
        ({"type": "subscribe", "message_id": answer, "afer": 3}, "invalid_frame", "afer"),
        ({"type": "cancel", "message_id": answer, "stop": True}, "invalid_frame", "stop"),
        ({"type": "ping", "content": "x"}, "invalid_frame", "content"),
        # The feed or a message, not both: neither is dropped for the other.
        (
            {"type": "subscribe", "topic": "user", "message_id": answer},
            "invalid_frame",
            "message_id",
        ),
        ({"type": "subscribe", "topic": "user", "after": 0}, "invalid_frame", "after"),
        (
            {"type": "unsubscribe", "topic": "user", "message_id": answer},
            "invalid_frame",
            "message_id",
        ),
    ]

    async with connect(server, account.token) as ws:
        for frame, code, field in refused:
            reply = await error_for(
                ws, json.dumps({**frame, "ref": 7} if field != "ref" else frame)
            )
            assert (reply["code"], reply.get("field")) == (code, field), (frame, reply)
            assert field in reply["message"], (frame, reply)
            assert reply.get("ref") == (7 if field != "ref" else None), (frame, reply)
            if field == "max_tokens":
                assert "params.max_tokens" in reply["message"], reply
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            listed = await client.get("/api/conversations/", headers=auth(account.token))
            body = listed.json()
            conversations = body["results"] if isinstance(body, dict) else body
            assert len(conversations) == 1, "a refused frame created nothing"
            tree = await client.get(
                f"/api/conversations/{conversation}/messages/?tree=true",
                headers=auth(account.token),
            )
            assert tree.status_code == 200, tree.text
            messages = tree.json()
            messages = messages["results"] if isinstance(messages, dict) else messages
            assert len(messages) == 2, "a refused frame created nothing"
        await ws.send(json.dumps({**create, "subscribe": False, "ref": "ok"}))
        created = await next_reply(ws)
        assert created["type"] == "message.created" and created["ref"] == "ok"
        await ws.send(json.dumps({"type": "ping", "ref": "still-open"}))
        assert await next_reply(ws) == {"type": "pong", "ref": "still-open"}


async def test_a_handshake_to_a_path_with_no_socket_is_refused_not_a_500(daphne):
    server = daphne()
    for path in ("/ws/other/", "/api/conversations/", "/"):
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(f"{server.ws_url}{path}", open_timeout=10):
                pass
        assert refused.value.response.status_code == 403, path
    assert "No route found" not in server.log_text()
