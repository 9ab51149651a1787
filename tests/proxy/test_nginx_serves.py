"""What nginx answers itself, without the web tier: static files and the closed /metrics."""

from __future__ import annotations

import httpx
import pytest

pytestmark = [pytest.mark.proxy, pytest.mark.asyncio]


async def test_static_files_come_from_nginx_and_metrics_stay_internal(nginx):
    closed = "127.0.0.1:9"  # nothing listens: whatever answers below, nginx answered it
    proxy = nginx([closed])
    (proxy.static_root / "chat").mkdir()
    (proxy.static_root / "chat" / "app.js").write_text("export const ok = true;\n")
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        script = await client.get("/static/chat/app.js")
        metrics = await client.get("/metrics")
        app = await client.get("/healthz")
    assert script.status_code == 200
    assert script.text == "export const ok = true;\n"
    assert "no-cache" in script.headers["cache-control"]
    assert metrics.status_code == 404
    assert app.status_code == 502
