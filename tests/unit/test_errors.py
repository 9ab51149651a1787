"""The error shape by path: OpenAI's fields on every error under ``/v1/``, ours alone
elsewhere."""

from __future__ import annotations

import json

import pytest

from streaming import errors


@pytest.mark.parametrize("status", [400, 404, 405, 408, 409, 413, 415, 431])
def test_a_v1_error_is_in_openais_shape(status: int) -> None:
    body = json.loads(errors.error_for_path("/v1/chat/completions", status, "x", "why", "seed"))
    assert body == {
        "error": {
            "status": status,
            "code": "x",
            "message": "seed: why",
            "field": "seed",
            "type": "invalid_request_error",
            "param": "seed",
        }
    }


@pytest.mark.parametrize(
    ("status", "kind"),
    [(401, "authentication_error"), (429, "rate_limit_error"), (503, "server_error")],
)
def test_openais_type_follows_the_status(status: int, kind: str) -> None:
    error = json.loads(errors.error_for_path("/v1/models", status, "x", "why"))["error"]
    assert (error["type"], error["param"]) == (kind, None)


@pytest.mark.parametrize("path", ["/api/conversations/", "/v1", "/v1x/", "/", ""])
def test_an_error_elsewhere_is_in_our_shape_alone(path: str) -> None:
    body = json.loads(errors.error_for_path(path, 431, "headers_too_large", "why"))
    assert body == errors.error_body(431, "headers_too_large", "why")
