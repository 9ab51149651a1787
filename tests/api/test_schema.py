"""The OpenAPI schema and its docs page, and schemathesis fuzzing the API it describes
against a real Daphne process: no request may produce a server error."""

from __future__ import annotations

import json
import subprocess
import sys

from django.test import Client
from schemathesis.core.warnings import SchemathesisWarning

from tests.api.calls import client, new_conversation, post
from tests.support.servers import ROOT

OPERATIONS = {
    "/api/conversations/": {"get", "post"},
    "/api/conversations/{conversation_id}/": {"get", "patch", "delete"},
    "/api/conversations/{conversation_id}/messages/": {"get", "post"},
    "/api/messages/": {"post"},
    "/api/messages/{message_id}/": {"get"},
    "/api/messages/{message_id}/cancel/": {"post"},
    "/api/messages/{message_id}/continue/": {"post"},
    "/api/messages/{message_id}/regenerate/": {"post"},
    "/api/messages/{message_id}/edit/": {"post"},
}


def test_schema_describes_every_endpoint_and_docs_are_served(db):
    schema = Client().get("/api/schema/?format=json")
    assert schema.status_code == 200
    document = schema.json()
    assert document["openapi"].startswith("3.")
    paths = document["paths"]
    assert {p: set(paths[p]) - {"parameters"} for p in OPERATIONS} == OPERATIONS
    post = paths["/api/conversations/{conversation_id}/messages/"]["post"]
    assert {"201", "400", "401", "404", "409", "413", "415", "429", "503"} <= set(post["responses"])
    detail = paths["/api/conversations/{conversation_id}/"]
    assert {"200", "404"} <= set(detail["get"]["responses"])
    assert {"200", "400", "404", "415"} <= set(detail["patch"]["responses"])
    assert "409" in detail["delete"]["responses"]
    assert "409" in paths["/api/messages/{message_id}/cancel/"]["post"]["responses"]
    # A conversation without messages has no current leaf.
    conversation = document["components"]["schemas"]["Conversation"]["properties"]
    assert conversation["current_leaf"].get("nullable") is True
    params = document["components"]["schemas"]["GenerationParams"]["properties"]
    assert {"max_tokens", "temperature", "top_p", "stop", "simulation"} <= set(params)
    # Its errors are the API's JSON, whatever format was asked for.
    for refused, status in (
        (Client().get("/api/schema/?format=xml"), 404),
        (Client().post("/api/schema/"), 405),
        (Client().get("/api/schema/", HTTP_ACCEPT="text/html"), 406),
    ):
        assert refused.status_code == status
        assert refused["Content-Type"].startswith("application/json"), refused["Content-Type"]
        assert refused.json()["error"]["status"] == status

    docs = Client().get("/api/docs/")
    assert docs.status_code == 200
    assert b"swagger-ui" in docs.content
    assert b"/api/schema/" in docs.content


def test_the_docs_pages_answer_all_but_their_page_in_json(db):
    # Pages of their own, yet under /api/: a format or type they do not have, a method
    # they do not take and OPTIONS answer the API's JSON (Swagger UI's OPTIONS was a 500).
    for url in ("/api/docs/", "/api/redoc/", "/api/schema/"):
        for refused, status in (
            (Client().get(f"{url}?format=xml"), 404),
            (Client().put(url), 405),
            (Client().get(url, HTTP_ACCEPT="application/xml"), 406),
        ):
            assert refused.status_code == status, (url, status)
            assert refused["Content-Type"].startswith("application/json"), (url, status)
            assert refused.json()["error"]["status"] == status
        described = Client().options(url)
        assert described.status_code == 200, url
        assert described["Content-Type"].startswith("application/json"), url
        assert "GET" in described["Allow"]
    page = Client().get("/api/redoc/")
    assert page.status_code == 200
    assert page["Content-Type"].startswith("text/html")


def test_schemathesis_finds_no_server_error(daphne, account, tmp_path):
    # Small answers keep ?wait=true calls short, and a simulated stall ends within the
    # request timeout; the concurrency limit still applies.
    server = daphne(DEFAULT_MAX_TOKENS=4, MAX_REQUEST_BYTES=65536, STREAM_STALL_TIMEOUT="3")
    # Edit takes a question: the fuzzer reaches it through a real one (the others find
    # their ids through the links of the messages' answers).
    with client(server, account.token) as api:
        asked = post(api, new_conversation(api), "a question", wait=True)
        assert asked.status_code == 201, asked.text
    # Every warning but one: "validation mismatch" says that every valid-looking request of
    # an operation was refused, which for regenerate depends on timing alone (its answers
    # still streaming, 409, or the user's concurrent answers at their limit, 429, on a
    # loaded machine), never on the schema.
    shown = [
        str(w)
        for w in SchemathesisWarning
        if w not in (SchemathesisWarning.VALIDATION_MISMATCH, SchemathesisWarning.LOW_VALID_RATE)
    ]
    config = tmp_path / "schemathesis.toml"
    config.write_text(
        f"warnings = {json.dumps(shown)}\n"
        '[[operations]]\ninclude-path = "/api/messages/{message_id}/edit/"\n'
        f'parameters = {{ message_id = "{asked.json()["user_message"]["id"]}" }}\n'
    )
    result = subprocess.run(
        [
            sys.executable, "-m", "schemathesis.cli", "--config-file", str(config),
            "run", f"{server.url}/api/schema/",
            "--url", server.url,
            "--header", f"Authorization: Token {account.token}",
            "--checks", "not_a_server_error",
            "--phases", "examples,coverage,fuzzing",
            "--max-examples", "12",
            "--seed", "1",
            "--workers", "1",  # CPython 3.11: the ast module is not thread-safe
            "--request-timeout", "20",
            "--generation-database", "none",
            "--no-color",
            "--report-dir", str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:] + "\n" + server.log_text()[-4000:]
    assert "Selected: 13/13" in output, output[-3000:]
    assert "No issues found" in output, output[-3000:]
