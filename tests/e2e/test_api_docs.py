"""The API docs render from the server alone: every request elsewhere is blocked."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.e2e


def test_swagger_ui_and_redoc_render_with_nothing_from_outside(daphne, chromium):
    server = daphne()
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    outside: list[str] = []

    def only_the_server(route):
        url = route.request.url
        if url.startswith(server.url + "/") or url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            outside.append(url)
            route.abort()

    context.route("**/*", only_the_server)
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))

        page.goto(server.url + "/api/docs/")
        expect(page.locator(".swagger-ui .info .title")).to_contain_text("Streaming chat API")
        operations = page.locator(".swagger-ui .opblock")
        expect(operations.first).to_be_visible()
        assert operations.count() > 5
        expect(page.locator(".swagger-ui")).to_contain_text("/api/conversations/")

        page.goto(server.url + "/api/redoc/")
        expect(page.locator("h1")).to_contain_text("Streaming chat API")
        expect(page.get_by_text("/api/conversations/").first).to_be_attached()

        assert outside == [], f"the docs asked for something outside the server: {outside}"
        assert errors == []
    finally:
        context.close()
