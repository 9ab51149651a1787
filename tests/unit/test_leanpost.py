"""The lean one-step post takes only what the REST API would take as it is, and turns
itself off where it cannot answer as Django would."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from django.test import override_settings
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streaming import services
from streaming.api.serializers import ConversationPostSerializer, PostMessageSerializer
from streaming.errors import InvalidParams
from streaming.transports import leanpost

TEXT = st.text(st.characters(codec="utf-8"), max_size=30) | st.sampled_from(["", " ", "a\x00b"])
VALUES = (
    TEXT
    | st.none()
    | st.booleans()
    | st.integers()
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(st.sampled_from(["max_tokens", "x"]), st.integers(), max_size=2)
)
BODIES = st.dictionaries(st.sampled_from(["content", "params", "model", "other"]), VALUES)
ANSWER_ID = "0b7e4a52-9f3e-4c58-8d1e-2f6c1a9b3d47"
CONVERSATION_BODIES = st.dictionaries(
    st.sampled_from(["content", "params", "model", "parent_id", "other"]),
    VALUES | st.just(ANSWER_ID) | st.just(ANSWER_ID.upper()),
)


@given(BODIES)
@example({"content": "0", "model": " "})  # the serializer trims a model's name
@example({"content": " padded ", "model": "sim"})  # and keeps the content as it is
@example({"content": "hi", "parent_id": ANSWER_ID})  # a new conversation has no parent
@settings(max_examples=300, deadline=None)
def test_what_it_takes_the_serializer_takes_unchanged(body: dict[str, Any]) -> None:
    taken = leanpost._post(json.dumps(body).encode(), new=True)
    if taken is None:
        return
    serializer = PostMessageSerializer(data=body)
    assert serializer.is_valid(), serializer.errors
    valid = serializer.validated_data
    assert taken == {
        "content": valid["content"],
        "params": valid.get("params"),
        "model": valid.get("model", ""),
        "parent_id": None,
    }


@given(CONVERSATION_BODIES)
@example({"content": "hi", "parent_id": ANSWER_ID})
@example({"content": "hi", "parent_id": "not an id"})
@settings(max_examples=300, deadline=None)
def test_a_conversation_post_the_serializer_takes_or_the_service_refuses(
    body: dict[str, Any],
) -> None:
    """A ``parent_id`` of the wrong form is taken here and refused by the service (so
    Django answers); anything else taken, the serializer takes unchanged."""
    taken = leanpost._post(json.dumps(body).encode(), new=False)
    if taken is None:
        return
    serializer = ConversationPostSerializer(data=body)
    if not serializer.is_valid():
        assert list(serializer.errors) == ["parent_id"], serializer.errors
        with pytest.raises(InvalidParams) as refused:
            services._parent_id(taken["parent_id"], new=False)
        assert refused.value.field == "parent_id"
        return
    valid = serializer.validated_data
    parent_id = valid.get("parent_id")
    assert taken["content"] == valid["content"]
    assert taken["params"] == valid.get("params")
    assert taken["model"] == valid.get("model", "")
    assert services._parent_id(taken["parent_id"], new=False) == parent_id


@pytest.mark.parametrize(
    "body",
    [
        {"content": "hello"},
        {"content": "  padded  ", "params": {"max_tokens": 3}, "model": ""},
        {"content": "日本 🚀", "params": None, "model": "sim"},
    ],
)
def test_it_takes_the_common_posts(body: dict[str, Any]) -> None:
    assert leanpost._post(json.dumps(body).encode(), new=True) is not None


def test_a_key_no_field_takes_is_djangos_to_refuse() -> None:
    assert leanpost._post(b'{"content": "hello", "max_tokens": 2}', new=False) is None


@pytest.mark.parametrize(
    "raw",
    [b"", b"[]", b'"text"', b'{"content": NaN}', b'{"content": "a",}', b'{"content": "\xff"}'],
)
def test_a_body_the_parser_refuses_is_djangos(raw: bytes) -> None:
    assert leanpost._post(raw, new=False) is None


@pytest.mark.parametrize(
    "middleware",
    [
        ["corsheaders.middleware.CorsMiddleware", *leanpost.ACCOUNTED_MIDDLEWARE],
        list(reversed(leanpost.ACCOUNTED_MIDDLEWARE)),
        list(leanpost.ACCOUNTED_MIDDLEWARE[1:]),
    ],
)
def test_middleware_it_does_not_account_for_turns_it_off(
    middleware: list[str], caplog: Any
) -> None:
    leanpost.available.cache_clear()
    try:
        assert leanpost.available()
        with (
            override_settings(MIDDLEWARE=middleware),
            caplog.at_level(logging.WARNING, logger=leanpost.__name__),
        ):
            leanpost.available.cache_clear()
            assert not leanpost.available()
        assert "one-step posts go through Django" in caplog.text
    finally:
        leanpost.available.cache_clear()


def _scope(host: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/api/messages/",
        "query_string": b"",
        "headers": [(b"host", host)],
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "scheme": "http",
    }


def test_a_host_django_refuses_is_djangos() -> None:
    with override_settings(ALLOWED_HOSTS=["chat.example"]):
        assert leanpost._request(_scope(b"chat.example")) is not None
        assert leanpost._request(_scope(b"evil.example")) is None


def test_a_request_django_would_redirect_is_djangos() -> None:
    # The middleware reads its settings when made, as Django's handler makes it once.
    try:
        with override_settings(SECURE_SSL_REDIRECT=True):
            leanpost._middleware.cache_clear()
            assert leanpost._request(_scope(b"127.0.0.1")) is None
            assert leanpost._request({**_scope(b"127.0.0.1"), "scheme": "https"}) is not None
    finally:
        leanpost._middleware.cache_clear()


@pytest.mark.parametrize(
    ("headers", "length"),
    [
        ([(b"content-type", b"application/json"), (b"content-length", b"12")], 12),
        ([(b"content-type", b"application/json; charset=utf-8"), (b"content-length", b"3")], 3),
        ([(b"content-type", b"application/json")], None),  # chunked: Django reads it
        ([(b"content-type", b"text/plain"), (b"content-length", b"3")], None),
        ([(b"content-type", b"application/json"), (b"content-length", b"-3")], None),
        (
            [(b"content-type", b"application/json"), (b"content-length", "²".encode("latin-1"))],
            None,
        ),
        ([(b"content-type", b"application/json"), (b"content-length", b"99999999")], None),
    ],
)
def test_only_a_declared_json_body_within_the_limit_is_read_here(
    headers: list[tuple[bytes, bytes]], length: int | None
) -> None:
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000):
        assert leanpost._declared_json({"headers": headers}) == length


@pytest.mark.parametrize(
    ("headers", "fallbacks", "caller"),
    [
        ([(b"authorization", b"Token abc")], [], (True, "abc")),
        ([(b"authorization", b"Bearer abc")], [], (True, "abc")),
        ([(b"authorization", b"Token")], [], (False, "")),
        ([(b"cookie", b"sessionid=s1; csrftoken=t")], [], (True, None)),
        ([(b"cookie", b"sessionid=s1")], ["an-old-key"], (False, None)),
        ([(b"cookie", b"csrftoken=t")], [], (False, None)),
        ([], [], (False, None)),
    ],
)
def test_who_the_lean_path_serves(
    headers: list[tuple[bytes, bytes]], fallbacks: list[str], caller: tuple[bool, Any]
) -> None:
    with override_settings(SECRET_KEY_FALLBACKS=fallbacks):
        assert leanpost._caller({"headers": headers}) == caller
